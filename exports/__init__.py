"""ONNX export and ONNX Runtime helpers for Hyper-SET.

Importing this package is cheap: it imports neither torch nor onnxruntime. Use the submodules directly,
e.g. ``from hyperset.exports.runtime import OrtSession`` or ``from hyperset.exports.loop import wrap_in_loop``.
"""

# the legacy exporter's opsets that cover every op of the models (hyperset-export --opset)
MIN_OPSET, MAX_OPSET = 14, 20
