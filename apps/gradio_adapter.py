"""Where the app changes how Gradio treats a request, in one place: a client's raw value reaches the handler when
Gradio's own conversion fails on it, optional trailing API inputs may be left out, inputs Gradio cannot take become
one-line errors naming the input, and messages pop up in the page only inside a request."""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from typing import Any

import gradio as gr
from gradio.exceptions import InvalidPathError
from gradio_client.utils import is_file_obj_with_meta, json_schema_to_python_type, value_is_file

from .inputs import clipped

__all__ = ["default_missing_inputs", "input_errors_as_messages", "lenient", "toast"]

def toast(message: str) -> None:
    """gr.Warning inside a request (a pop-up in the page); nothing when a handler is called directly."""
    from gradio.context import LocalContext

    if LocalContext.blocks.get(None) is not None and LocalContext.event_id.get(None) is not None:
        gr.Warning(message)


def lenient(component: Any) -> Any:
    """Hand the event's function the client's raw value when Gradio's own conversion fails on it (an infinite or
    text iteration count, a text mask ratio): the function's checks then say what is wrong, where Gradio's
    exception reached the client as an empty error."""
    convert = component.preprocess

    def preprocess(payload: Any) -> Any:
        try:
            return convert(payload)
        except (AttributeError, TypeError, ValueError, KeyError, OverflowError):
            return payload

    component.preprocess = preprocess
    return component


def default_missing_inputs(demo: gr.Blocks, required: dict[str, int]) -> None:
    """Let an API call to an endpoint of ``required`` (api name -> inputs it needs) leave out its optional
    trailing inputs: they reach the function as None, which it reads as its default (Gradio refused the call
    with an empty error)."""
    validate = getattr(demo, "validate_inputs", None)
    if validate is None:  # a Gradio 6 release without this hook: the arguments stay required
        return

    def validate_inputs(block_fn: Any, inputs: list[Any]) -> None:
        need = required.get(getattr(block_fn, "api_name", None) or "")
        if need is not None and need <= len(inputs) < len(block_fn.inputs):
            inputs.extend([None] * (len(block_fn.inputs) - len(inputs)))
        validate(block_fn, inputs)

    demo.validate_inputs = validate_inputs


def _file_paths(value: Any) -> list[str]:
    """The paths of the Gradio file references (``{"path": ..., "meta": {"_type": "gradio.FileData"}}``) in a
    client's value, at any depth (walked with a stack: a deeply nested value cannot exhaust the recursion)."""
    paths, stack = [], [value]
    while stack:
        item = stack.pop()
        if is_file_obj_with_meta(item):
            paths.append(item["path"])
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return paths


_PLAIN_KINDS = {"str": "text", "float": "a number", "int": "a whole number", "bool": "true or false"}


def _named_inputs(block_fn: Any, inputs: Sequence[Any]) -> list[tuple[str, Any, Any]]:
    """(name, component, value) of each input of an event: the name is the function's parameter, as the API
    info names it."""
    try:
        params = list(inspect.signature(block_fn.fn).parameters)
    except (TypeError, ValueError):  # no function, or one without a signature
        params = []
    return [(params[i] if i < len(params) else f"input {i + 1}", block, value)
            for i, (block, value) in enumerate(zip(block_fn.inputs, inputs))]


def _input_problem(named: list[tuple[str, Any, Any]], err: Exception) -> str:
    """One line on why Gradio could not take an event's inputs (``err``, raised before the function ran)."""
    for name, block, value in named:  # a value of the wrong shape for an image input's data model
        model = getattr(block, "data_model", None)
        if model is not None and value is not None:
            try:
                model.model_validate(value, context={"validate_meta": True})
            except ValueError as bad:  # pydantic's ValidationError
                errors = bad.errors() if hasattr(bad, "errors") else []
                why = errors[0]["msg"] if errors else str(bad).splitlines()[0]
                return clipped(f"{name}: not a valid {type(block).__name__} value ({why})")
    files = [(name, path) for name, _, value in named for path in _file_paths(value)]
    if isinstance(err, InvalidPathError) and files:
        name, path = next(((n, p) for n, p in files if os.path.abspath(p) in str(err)), files[0])
        return (f"{name}: the file {clipped(path, 80)} was not uploaded to this server (upload it to "
                "/gradio_api/upload first, then send the path it answers)")
    first = next(iter(str(err).strip().splitlines()), "") or type(err).__name__
    return clipped(f"{files[0][0]}: {first}" if files else first)


def input_errors_as_messages(demo: gr.Blocks) -> None:
    """Make inputs Gradio cannot take one-line errors that name the input: a file reference where text or a
    number is expected, a file the server was not sent, a value of the wrong shape for an image input, too few
    inputs. Gradio raised these before any handler ran, and the client got ``{"error": null}``."""
    preprocess = demo.preprocess_data

    async def preprocess_data(block_fn: Any, inputs: list[Any], state: Any, explicit_call: bool = False) -> Any:
        named = _named_inputs(block_fn, inputs)
        for name, block, value in named:
            if not value_is_file(block.api_info()) and _file_paths(value):
                kind = json_schema_to_python_type(block.api_info())
                kind = f"one of {kind[8:-1]}" if kind.startswith("Literal[") else _PLAIN_KINDS.get(kind, kind)
                raise gr.Error(f"{name}: a file reference, where {kind} is expected", print_exception=False)
        try:
            return await preprocess(block_fn, inputs, state, explicit_call)
        except gr.Error:
            raise
        except Exception as err:  # every failure here is the client's value: no traceback in the log
            raise gr.Error(_input_problem(named, err), print_exception=False) from None

    demo.preprocess_data = preprocess_data
