"""The ground floor, importable without torch: files written whole or not at all and never over what is not a
regular file (the puzzle generator writes with them), bounded JSON, and the package's version."""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Iterator
from glob import escape as glob_escape
from pathlib import Path
from typing import IO, Any


def _default_mode() -> int:
    """What a plainly created file gets (0666 minus the umask); mkstemp would leave 0600."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process (PermissionError), or a platform that cannot tell: leave its file
    return True


def _temp_beside(path: Path) -> tuple[int, str]:
    """mkstemp next to `path` as `.NAME.PID.<random>.tmp`, after removing the files of that form that processes
    which no longer run left there (a kill between the write and the rename: an ONNX graph's worth each time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if os.name == "posix":
        for stale in path.parent.glob(f".{glob_escape(path.name)}.*.*.tmp"):
            pid = stale.name[len(path.name) + 2:].split(".", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                stale.unlink(missing_ok=True)
    return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")


class NotReplacedError(OSError):
    """A write refused because what stands at the path is not a regular file (a link, a FIFO, a device, a
    folder): the rename would replace it with a file."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


def read_problem(path: str | os.PathLike) -> str | None:
    """Why the file at `path` cannot be read as one (it does not exist, or is a folder, a FIFO, a device: reading
    one would hang or read without end), or None for a regular file (a link to one included)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "file not found"
    except OSError as e:
        return f"cannot be looked at ({e.strerror or e})"
    return None if stat.S_ISREG(st.st_mode) else f"is {_kind(st.st_mode)}, not a regular file"


def replace_problem(path: str | os.PathLike) -> str | None:
    """Why a file written at `path` must not replace what is there (a symbolic link, a FIFO, a device node, a
    folder: renaming a file over it would replace the link or the node, not write through it), or None."""
    path = Path(path)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot be looked at ({e.strerror or e})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link: it would be replaced, not written through (give the path it points to)"
    if stat.S_ISDIR(st.st_mode):
        return "is a folder"
    if not stat.S_ISREG(st.st_mode):
        return f"is {_kind(st.st_mode)}, not a regular file: it would be replaced by one"
    return None


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO[Any]]:
    """A file to write at `path` a piece at a time: a temporary file in the same folder, renamed over `path` once
    the block ends without an error (removed otherwise), so a crash never leaves half a file, and the temporary
    files of writers that were killed are removed by the next write of the same file. What stands at the path must
    be a regular file or nothing (`replace_problem`; else a NotReplacedError, nothing written); the file gets the
    mode a plainly created file gets."""
    path = Path(path)
    why = replace_problem(path)
    if why is not None:
        raise NotReplacedError(f"{path} {why}; not written")
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _default_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` at `path` whole or not at all (`atomic_writer`)."""
    with atomic_writer(path) as f:
        f.write(data)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def json_safe(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by None (JSON has neither)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def package_version() -> str:
    """The installed distribution's version; the source tree's ``hyperset.__version__`` when not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hyperset")
    except PackageNotFoundError:
        from .version import __version__

        return __version__


def folder_problem(path: str | os.PathLike) -> str | None:
    """Why the folder of a file to write cannot take it (missing, a file, not writable; no folder is created for
    it), or None."""
    folder = Path(path).parent
    if not folder.is_dir():
        return f"{folder} is a file, not a folder" if folder.exists() else f"folder {folder} does not exist"
    if not os.access(folder, os.W_OK):
        return f"folder {folder} is not writable"
    try:  # a folder that says it is writable may still refuse new files (/proc, a read-only mount seen as root)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".hyperset-probe-")
    except OSError as e:
        return f"folder {folder} takes no new files ({e.strerror or e})"
    os.close(fd)
    os.unlink(probe)
    return None
