"""Small C libraries of the package, compiled on first use and loaded with ctypes (no torch needed).

A library is built once per source and flags with the C compiler (``$CC``, else ``cc``) into
``$HYPERSET_CACHE_DIR/kernels``, else ``$XDG_CACHE_HOME/hyperset/kernels``, else ``~/.cache/hyperset/kernels``;
the file is written whole or not at all, and never loaded from a folder of another owner or one anyone can write
to. Callers fall back to Python where `load` raises `BuildError`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["BuildError", "Loaded", "cache_dir", "load"]


class BuildError(RuntimeError):
    """The library could not be compiled or loaded here (the message says why)."""


def cache_dir() -> Path:
    """Where compiled libraries are kept."""
    if os.environ.get("HYPERSET_CACHE_DIR"):
        return Path(os.environ["HYPERSET_CACHE_DIR"]) / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hyperset" / "kernels"


def _own_folder() -> Path:
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        folder = Path(tempfile.gettempdir()) / f"hyperset-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = folder.stat()
    if hasattr(os, "getuid") and (mode.st_uid != os.getuid() or mode.st_mode & 0o002):
        # a library loaded from a folder that others can write to could be anyone's code
        raise BuildError(f"{folder} is not this user's own (another owner, or writable by all): not loading from it")
    return folder


def load(source: Path, flags: tuple[str, ...]) -> ctypes.CDLL:
    """Compile `source` with `flags` (once; the build is cached by their hash) and load it."""
    cc = shutil.which(os.environ.get("CC") or "cc")
    if cc is None:
        raise BuildError(f"no C compiler ({os.environ.get('CC') or 'cc'}) on the PATH")
    code = source.read_bytes()
    key = hashlib.sha256(code + " ".join(flags).encode()).hexdigest()[:16]
    try:
        folder = _own_folder()
        lib = folder / f"{source.stem}-{key}.so"
        if not lib.exists():
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
            os.close(fd)
            try:
                done = subprocess.run([cc, *flags, str(source), "-o", tmp], capture_output=True, text=True)
                if done.returncode != 0:
                    raise BuildError(f"{cc} could not build {source.name}: {done.stderr.strip()[-500:]}")
                os.replace(tmp, lib)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return ctypes.CDLL(str(lib))
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"{source.name}: {e}") from e


class Loaded:
    """A library that `build` compiles and loads at its first use, once per process (`get`), and why it could not
    be had (`why_not`, set once tried)."""

    def __init__(self, build: Callable[[], ctypes.CDLL]):
        self._build = build
        self._lib: ctypes.CDLL | None = None
        self.why_not: str | None = None
        self._lock = threading.Lock()

    def get(self) -> ctypes.CDLL | None:
        if self._lib is None and self.why_not is None:
            with self._lock:
                if self._lib is None and self.why_not is None:
                    try:
                        self._lib = self._build()
                    except (OSError, RuntimeError) as e:
                        self.why_not = str(e)
        return self._lib
