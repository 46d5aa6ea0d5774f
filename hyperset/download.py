"""Downloads for users with internet: streamed to a temporary file, verified, then renamed into place."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm


class DownloadError(RuntimeError):
    """A download that failed or did not verify; the message says why and how to place the file by hand."""


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(url: str, dest: str | os.PathLike, *, algorithm: str = "sha256", expected: str | None = None,
          timeout: float = 60.0, validate: Callable[[Path], str | None] | None = None) -> None:
    """Stream `url` to a temporary file beside `dest`, check its digest and `validate(tmp)` (a problem or None),
    then atomically rename it to `dest`. Nothing that looks like a finished download is left on failure."""
    dest = Path(dest)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        h = hashlib.new(algorithm)
        request = urllib.request.Request(url, headers={"User-Agent": "hyperset/0.1"})
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(request, timeout=timeout) as response:
            size = response.headers.get("Content-Length")
            with tqdm(total=int(size) if size and size.isdigit() else None, unit="B", unit_scale=True,
                      desc=dest.name, disable=None, leave=False) as bar:  # disable=None: shown on a terminal
                for block in iter(lambda: response.read(1 << 20), b""):
                    h.update(block)
                    out.write(block)
                    bar.update(len(block))
        if expected is not None and h.hexdigest().lower() != expected.lower():
            raise DownloadError(f"checksum mismatch: expected {algorithm} {expected.lower()}, got {h.hexdigest()}")
        problem = validate(tmp) if validate else None
        if problem is not None:
            raise DownloadError(f"the downloaded file is not the expected archive: {problem}")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
