"""ONNX export and ONNX Runtime helpers for Hyper-SET.

Importing this package is cheap: it imports neither torch nor onnxruntime. Use the submodules directly,
e.g. ``from hyperset.exports.runtime import OrtSession`` or ``from hyperset.exports.loop import wrap_in_loop``.
"""
