"""Limits that keep one visitor from holding the app's memory or its single model slot.

* :class:`RequestLimits`, an ASGI middleware in front of Gradio's FastAPI app: a request body over its limit is
  refused with 413 before Gradio reads it (Gradio keeps the bodies of API calls in memory), and every event stream
  a client opens is noted in :data:`STREAMS`.
* :class:`RunGuard`, checked by a long handler between iterations: a per-request time limit, and whether a client
  ever listened to the job (an API call whose result nobody asks for stops instead of holding the slot).
* :func:`limit_pixels`: an image input refuses a picture over :data:`MAX_IMAGE_PIXELS`, read from the file's
  header, before Gradio decodes it (the image editor's background, layers and composite included); the editor
  also keeps a bounded number of uploaded blobs and accepts only small layer indices.

Uploaded and generated files are deleted after an hour by Gradio's own ``delete_cache`` (``hyperset.apps.app``).
Gradio keeps a session state for every API call, with the call's inputs in it (a new session per call to
``/call/{api_name}``): the app keeps at most :data:`SESSION_STATES` of them (``launch_kwargs``).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import time
import warnings
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import gradio as gr
from fastapi import HTTPException
from PIL import Image

__all__ = ["MAX_BODY_BYTES", "MAX_IMAGE_PIXELS", "MAX_TEXT_CHARS", "MAX_UPLOAD_BYTES", "MODEL_QUEUE", "QUEUE_SIZE",
           "SESSION_STATES", "STREAMS", "RequestLimits",
           "RunGuard", "StreamWatch", "check_pixels", "image_size", "limit_pixels", "pixel_problem"]

QUEUE_SIZE = 16  # requests waiting in the queue beyond the one running
MODEL_QUEUE = "models"  # solve and reconstruct share one slot: one model computation at a time
MAX_TEXT_CHARS = 20_000  # pasted puzzle text
MAX_UPLOAD_BYTES = 8 * 1024 * 1024  # one uploaded image file (also launch()'s max_file_size)
MAX_BODY_BYTES = 1024 * 1024  # any other request: a grid, 20,000 characters of text, references to uploaded files
MULTIPART_OVERHEAD = 64 * 1024  # form fields and boundaries around an uploaded file
UPLOAD_ROUTES = ("upload", "component_server")  # multipart routes that carry image files
MAX_IMAGE_PIXELS = 4096 * 4096  # an image input, checked from the file header before decoding
MAX_EDITOR_LAYERS = 8  # layer index the image editor accepts (Gradio sizes a list by the index it is sent)
EDITOR_BLOB_SLOTS = 32  # image-editor uploads waiting for their event (Gradio keeps them until the event runs)
LISTEN_GRACE = 10.0  # seconds a queued job may run before a client opens its event stream
# Session states Gradio keeps (launch's state_session_capacity; its default, 10,000, is ~11 GB of 1 MiB inputs). Each
# holds a copy of the page's config (~0.1 MB) and the last inputs of the session (up to MAX_BODY_BYTES): at most
# ~70 MB. Evicting one costs this app nothing: it keeps no gr.State and renders nothing per session.
SESSION_STATES = 64

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# ----------------------------------------------------------------------------------------------------------
# request bodies and event streams


def body_limit(path: str) -> int:
    """The most bytes a request body to ``path`` may have."""
    if path.rstrip("/").rsplit("/", 1)[-1] in UPLOAD_ROUTES:
        return MAX_UPLOAD_BYTES + MULTIPART_OVERHEAD
    return MAX_BODY_BYTES


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _creates_event(scope: Scope) -> bool:
    """A POST that queues an event and answers its id: ``.../call/{api_name}`` or ``.../queue/join``."""
    if scope["method"] != "POST":
        return False
    parts = scope["path"].rstrip("/").split("/")
    return parts[-2:-1] in (["call"], ["v2"]) or parts[-2:] == ["queue", "join"]


def _stream_key(scope: Scope) -> str | None:
    """The event id or session hash whose results a GET request streams, else None.

    ``.../call/{api_name}/{event_id}`` (the API) and ``.../queue/data?session_hash=...`` (the page, gradio_client)."""
    parts = scope["path"].rstrip("/").split("/")
    if len(parts) >= 3 and parts[-3] == "call":
        return parts[-1]
    if parts[-2:] == ["queue", "data"]:
        hashes = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_hash")
        return hashes[0] if hashes else None
    return None


class StreamWatch:
    """When events were queued (by event id), which event streams clients opened (by event id or session
    hash) and when a session last pressed Stop; the newest ``capacity`` of each."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._created: OrderedDict[str, float] = OrderedDict()
        self._opened: OrderedDict[str, None] = OrderedDict()
        self._stops: OrderedDict[str, float] = OrderedDict()

    def _remember(self, table: OrderedDict, key: str, value: Any) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self.capacity:
            table.popitem(last=False)

    def created(self, event_id: str) -> None:
        self._remember(self._created, event_id, time.perf_counter())

    def opened(self, key: str) -> None:
        self._remember(self._opened, key, None)

    def created_at(self, keys: tuple[str, ...]) -> float | None:
        return next((self._created[k] for k in keys if k in self._created), None)

    def listened(self, keys: tuple[str, ...]) -> bool:
        return any(k in self._opened for k in keys)

    def stop(self, session: str) -> None:
        """`session` pressed Stop now: its handlers started before now end at their next check."""
        self._remember(self._stops, session, time.perf_counter())

    def stopped_since(self, keys: tuple[str, ...], started: float) -> bool:
        return any(self._stops.get(k, -1.0) >= started for k in keys)


STREAMS = StreamWatch()


async def _refuse(send: Send, limit: int) -> None:
    body = f'{{"error": "request body too large (at most {limit:,} bytes)"}}'.encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class RequestLimits:
    """ASGI middleware: refuse a request body over :func:`body_limit` (413) before the app reads it, by its
    Content-Length or, for a chunked body, as soon as the bytes received pass the limit; note event streams."""

    def __init__(self, app: ASGIApp, streams: StreamWatch = STREAMS) -> None:
        self.app = app
        self.streams = streams

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["method"] == "GET" and (key := _stream_key(scope)):
            self.streams.opened(key)
        limit = body_limit(scope["path"])
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            return await _refuse(send, limit)
        await self._counted(scope, receive, self._noting_event(send) if _creates_event(scope) else send, limit)

    def _noting_event(self, send: Send) -> Send:
        """``send``, noting the id of the event the response announces (``{"event_id": ...}``)."""
        chunks: list[bytes] = []

        async def noting_send(message: Message) -> None:
            if message["type"] == "http.response.body" and sum(map(len, chunks)) < 4096:
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    try:
                        event_id = json.loads(b"".join(chunks)).get("event_id")
                    except (ValueError, AttributeError):
                        event_id = None
                    if isinstance(event_id, str):
                        self.streams.created(event_id)
            await send(message)

        return noting_send

    async def _counted(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """Run the app, cutting the body off (as a disconnect) once it passes ``limit``; then answer 413."""
        received, over, started = 0, False, False

        async def counting_receive() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if over:  # the app's answer to a body cut short is replaced by the 413 below
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not over:
                raise
        if over and not started:
            await _refuse(send, limit)


# ----------------------------------------------------------------------------------------------------------
# per-request time limit and abandoned jobs


@dataclass
class RunGuard:
    """Limits a long handler checks between iterations. ``keys`` name the request's event (its event id and
    session hash); they are empty outside a server request, and then only the time limit applies."""

    time_limit: float
    keys: tuple[str, ...] = ()
    started: float = 0.0
    streams: StreamWatch = STREAMS

    @classmethod
    def for_request(cls, time_limit: float) -> RunGuard:
        """A guard for the Gradio request being handled now (from Gradio's request context)."""
        from gradio.context import LocalContext

        request = LocalContext.request.get(None)
        keys = (LocalContext.event_id.get(None), getattr(request, "session_hash", None))
        return cls(time_limit, tuple(k for k in keys if k), time.perf_counter())

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def over_time(self) -> bool:
        return self.elapsed() > self.time_limit

    def stop_requested(self) -> bool:
        """The request's session pressed Stop after this handler started. Gradio's cancel only takes effect
        when a generator next yields, and a streamed solve sends updates sparingly, so the handler checks this
        between iterations itself."""
        return self.streams.stopped_since(self.keys, self.started)

    @staticmethod
    def note_stop() -> None:
        """Called by a Stop handler: the handlers of the Gradio request's session started before now stop."""
        from gradio.context import LocalContext

        session = getattr(LocalContext.request.get(None), "session_hash", None)
        if session:
            STREAMS.stop(session)

    def abandoned(self) -> bool:
        """:data:`LISTEN_GRACE` seconds have passed since the event was queued (or, if that is not known, since
        the handler started) and no client has opened its event stream."""
        if not self.keys or self.streams.listened(self.keys):
            return False
        since = self.streams.created_at(self.keys) or self.started
        return time.perf_counter() - since > LISTEN_GRACE


# ----------------------------------------------------------------------------------------------------------
# image inputs


def pixel_problem(width: int, height: int) -> str | None:
    """The message for an image over :data:`MAX_IMAGE_PIXELS`, else None."""
    if width * height <= MAX_IMAGE_PIXELS:
        return None
    return f"the image is too large ({width}x{height} pixels; at most {MAX_IMAGE_PIXELS:,} pixels)"


def image_size(source: str | bytes) -> tuple[int, int]:
    """(width, height) from an image file's header; no pixel is decoded (PIL opens images lazily).

    Raises ``gr.Error`` for a file that is not an image or one too large for PIL to open."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as img:
                return img.size
    except Image.DecompressionBombError:
        raise gr.Error(f"the image is too large (at most {MAX_IMAGE_PIXELS:,} pixels)", print_exception=False) from None
    except (OSError, ValueError, SyntaxError):
        raise gr.Error("could not read the file as an image (PNG, JPEG, WebP, ...)", print_exception=False) from None


def _file_source(file: Any) -> str | bytes | None:
    """A file in an image payload (Gradio FileData/ImageData, raw bytes) -> a path or the bytes to check."""
    if file is None or isinstance(file, bytes):
        return file
    url = getattr(file, "url", None)
    if isinstance(url, str) and url.startswith("data:"):
        try:
            return base64.b64decode(url.split(",", 1)[-1], validate=False)
        except (binascii.Error, ValueError):
            raise gr.Error("could not read the image data", print_exception=False) from None
    return getattr(file, "path", None)


def _payload_files(payload: Any, blobs: MutableMapping[str, Any]) -> Iterator[Any]:
    """Every file of an Image or ImageEditor payload: the file itself, or background, layers and composite
    (from the payload, or from the editor's uploaded blobs when it names them by id)."""
    if getattr(payload, "id", None) is not None:
        payload = blobs.get(payload.id)
    if payload is None:
        return
    if not hasattr(payload, "layers"):
        yield payload
        return
    yield payload.background
    yield from payload.layers or []
    yield payload.composite


def check_pixels(payload: Any, blobs: MutableMapping[str, Any]) -> None:
    """Raise ``gr.Error`` if any image in ``payload`` is over :data:`MAX_IMAGE_PIXELS` (from its header)."""
    for file in _payload_files(payload, blobs):
        source = _file_source(file)
        if source is None:
            continue
        if problem := pixel_problem(*image_size(source)):
            raise gr.Error(problem, print_exception=False)


class _BoundedBlobs(OrderedDict):
    """The image editor's uploaded blobs by id, the newest :data:`EDITOR_BLOB_SLOTS` only."""

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > EDITOR_BLOB_SLOTS:
            self.popitem(last=False)


def _limit_editor_blobs(editor: gr.ImageEditor) -> None:
    """Bound what the editor keeps from its blob uploads: the number of pending ids and the layer index."""
    editor.blob_storage = _BoundedBlobs()
    accept = editor.accept_blobs

    def accept_blobs(data: Any) -> Any:
        index = data.data.get("index")
        if index not in (None, "null", "") and not (str(index).isdigit() and int(index) < MAX_EDITOR_LAYERS):
            raise HTTPException(status_code=400, detail=f"layer index must be 0-{MAX_EDITOR_LAYERS - 1}")
        return accept(data)

    accept_blobs._is_server_fn = True  # type: ignore[attr-defined]  # callable from the page, as the original
    editor.accept_blobs = accept_blobs


def limit_pixels(component: gr.Image | gr.ImageEditor) -> None:
    """Make an image input refuse a picture over :data:`MAX_IMAGE_PIXELS` before Gradio decodes it."""
    blobs: MutableMapping[str, Any] = {}
    if isinstance(component, gr.ImageEditor):
        _limit_editor_blobs(component)
        blobs = component.blob_storage
    preprocess = component.preprocess

    def checked_preprocess(payload: Any) -> Any:
        check_pixels(payload, blobs)
        try:
            return preprocess(payload)
        except (OSError, ValueError, SyntaxError):  # a header that reads, a body that does not (truncated, SVG)
            raise gr.Error("could not read the file as an image (PNG, JPEG, WebP, ...)",
                           print_exception=False) from None

    component.preprocess = checked_preprocess
