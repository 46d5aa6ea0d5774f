"""Downloads for users with internet: streamed to a temporary file, verified, then renamed into place.

Datasets fetched by name (``--data sudoku-extreme --download``) are kept in the cache, :func:`cache_dir`, each
file with a record beside it (``FILE.json``: where it came from, its size and sha256), so that a file changed
after it was checked is noticed on the next use (:func:`cached`).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


class DownloadError(RuntimeError):
    """A download that failed or did not verify; the message says why and how to place the file by hand."""


class NotCachedError(FileNotFoundError):
    """A dataset asked for by name that is not in the cache yet (and no download was asked for)."""


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(url: str, dest: str | os.PathLike, *, algorithm: str = "sha256", expected: str | None = None,
          timeout: float = 60.0, validate: Callable[[Path], str | None] | None = None,
          progress: bool | None = None) -> str:
    """Stream `url` to a temporary file beside `dest`, check its length (a connection closed early is an error),
    its digest and `validate(tmp)` (a problem or None), then atomically rename it to `dest`; returns the digest.
    Nothing that looks like a finished download is left on failure. `progress`: a bar on standard error (None:
    on a terminal)."""
    import http.client  # the network stack and the bar load only when something is fetched
    import urllib.request

    from tqdm.auto import tqdm

    dest = Path(dest)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        h, got = hashlib.new(algorithm), 0
        request = urllib.request.Request(url, headers={"User-Agent": "hyperset/0.1"})
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(request, timeout=timeout) as response:
            size = response.headers.get("Content-Length")
            with tqdm(total=int(size) if size and size.isdigit() else None, unit="B", unit_scale=True,
                      desc=dest.name, disable=None if progress is None else not progress, leave=False) as bar:
                for block in iter(lambda: response.read(1 << 20), b""):
                    h.update(block)
                    out.write(block)
                    got += len(block)
                    bar.update(len(block))
            # http.client ends a body cut short by the server quietly: compare with what was announced
            if size and size.isdigit() and got != int(size):
                raise DownloadError(f"the connection closed after {got:,} of {int(size):,} bytes")
        if expected is not None and h.hexdigest().lower() != expected.lower():
            raise DownloadError(f"checksum mismatch: expected {algorithm} {expected.lower()}, got {h.hexdigest()}")
        problem = validate(tmp) if validate else None
        if problem is not None:
            raise DownloadError(f"the downloaded file is not the expected one: {problem}")
        os.replace(tmp, dest)
    except http.client.HTTPException as err:  # a malformed or cut reply: one error type for the callers
        raise DownloadError(failure_reason(err)) from None
    finally:
        tmp.unlink(missing_ok=True)
    return h.hexdigest()


def failure_reason(err: BaseException) -> str:
    """Why a download failed, for people (an HTTP status, a network error, a timeout)."""
    import urllib.error

    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP error {err.code} {err.reason}"
    if isinstance(err, urllib.error.URLError):
        return str(err.reason)
    if isinstance(err, TimeoutError):
        return "the connection timed out"
    return str(err) or type(err).__name__


# ---------------------------------------------------------------------------------------------------------------
# datasets kept in the cache


def cache_dir() -> Path:
    """Where datasets fetched by name are kept: ``$HYPERSET_CACHE_DIR/data``, else ``$XDG_CACHE_HOME/hyperset/data``,
    else ``~/.cache/hyperset/data`` (beside the compiled kernels of :mod:`hyperset.cbuild`)."""
    from .cbuild import cache_dir as kernels_dir

    return kernels_dir().parent / "data"


def record_path(path: Path) -> Path:
    """The record of a cached file: ``FILE.json`` beside it."""
    return path.with_name(path.name + ".json")


def _write_record(path: Path, url: str, digest: str) -> None:
    record = {"url": url, "bytes": path.stat().st_size, "sha256": digest,
              "checked": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".json.part", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(tmp, record_path(path))
    finally:
        Path(tmp).unlink(missing_ok=True)


def _check_record(path: Path) -> str | None:
    """Why the cached `path` no longer matches its record, or None when it does; KeyError/ValueError: no usable
    record."""
    record = json.loads(record_path(path).read_text())
    size, digest = int(record["bytes"]), str(record["sha256"])
    if path.stat().st_size != size:
        return f"it holds {path.stat().st_size:,} bytes, the record {size:,}"
    found = file_digest(path)
    return None if found == digest else f"its sha256 is {found}, the record's {digest}"


def cached(url: str, path: Path, what: str, check: Callable[[Path], str | None], *, download: bool = False,
           progress: bool | None = None, timeout: float = 60.0) -> Path:
    """The cached file `path` of a dataset, fetched from `url` first when `download` is set and it is missing.

    A download is streamed to a temporary file, checked (its announced length, then `check(tmp)`: a problem or
    None) and renamed into place; a record of its sha256 is written beside it. A file found there is compared with
    its record (a file placed by hand, without one, is checked with `check` once and then recorded). Raises
    :class:`NotCachedError` when it is missing and `download` is not set, :class:`DownloadError` for a failed
    download or a file that does not verify; `what` names the file in messages ("Sudoku-Extreme test.csv").
    """
    if path.is_file():
        try:
            changed = _check_record(path)
        except (OSError, KeyError, ValueError, TypeError):  # no record (placed by hand) or an unreadable one
            problem = check(path)
            if problem is not None:
                raise DownloadError(f"{path} is not {what}: {problem}; delete it and fetch it again with "
                                    "--download") from None
            _write_record(path, "found in the cache", file_digest(path))
            return path
        if changed is not None:
            raise DownloadError(f"{path} changed after it was checked ({changed}): delete it and "
                                f"{record_path(path).name} and fetch it again with --download")
        return path
    if not download:
        raise NotCachedError(f"{what} is not in the cache ({path}): add --download to fetch it from {url}")
    manual = f"You can download {url} elsewhere and put it at {path} (it is checked on first use)."
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        digest = fetch(url, path, timeout=timeout, progress=progress, validate=check)
        _write_record(path, url, digest)
    except DownloadError as err:
        raise DownloadError(f"downloading {what} from {url} failed: {err}. {manual}") from None
    except (OSError, ValueError, EOFError) as err:
        raise DownloadError(f"downloading {what} from {url} failed: {failure_reason(err)}. {manual}") from None
    return path
