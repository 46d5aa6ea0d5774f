"""Importing Gradio in about half its own time, without changing what it does.

``import gradio`` spends most of its time in two things the app never uses:

* for every component class it defines, ``gradio.component_meta.create_or_modify_pyi`` reads and parses the
  class's source file and its ``.pyi`` type stub, to rewrite the stub when they differ: a tool for Gradio's own
  development (the installed package ships its stubs, and a type checker is what reads them);
* ``gradio.caching`` imports pandas at module level, for hashing DataFrames in ``gr.Cache``.

``import_gradio()`` imports Gradio with the first made a no-op and pandas imported the first time
``gradio.caching`` touches it (``bench/startup.py`` measures ``import gradio`` both ways). Both are hooks on those two
modules alone: nothing else in the process sees a stand-in, and a Gradio version without them is imported as it is.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__all__ = ["import_gradio", "no_interim_apps"]


def _exec_without_stub_rewrite(loader: importlib.abc.Loader, module: types.ModuleType) -> None:
    loader.exec_module(module)
    if hasattr(module, "create_or_modify_pyi"):
        module.create_or_modify_pyi = lambda *args, **kwargs: None


class _PandasOnUse(types.ModuleType):
    """What ``import pandas as pd`` binds in ``gradio.caching``: the real pandas, imported at the first attribute
    read."""

    def __getattr__(self, name: str) -> Any:
        if sys.modules.get("pandas") is self:  # read while gradio.caching runs: the real one takes its place
            del sys.modules["pandas"]
        return getattr(importlib.import_module("pandas"), name)


def _exec_with_pandas_on_use(loader: importlib.abc.Loader, module: types.ModuleType) -> None:
    if "pandas" in sys.modules:
        loader.exec_module(module)
        return
    stand_in = _PandasOnUse("pandas")
    sys.modules["pandas"] = stand_in
    try:
        loader.exec_module(module)
    finally:
        if sys.modules.get("pandas") is stand_in:  # the process's `import pandas` is the real one from here on
            del sys.modules["pandas"]


_HOOKS = {"gradio.component_meta": _exec_without_stub_rewrite, "gradio.caching": _exec_with_pandas_on_use}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self.inner, self.hook = inner, _HOOKS[name]

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.hook(self.inner, module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in _HOOKS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, name)
        return spec


def import_gradio() -> types.ModuleType:
    """``import gradio`` through the two hooks (a no-op where Gradio is imported already)."""
    if "gradio" not in sys.modules:
        finder = _Finder()
        sys.meta_path.insert(0, finder)
        try:
            importlib.import_module("gradio")
        finally:
            sys.meta_path.remove(finder)
    return sys.modules["gradio"]


@contextlib.contextmanager
def no_interim_apps() -> Any:
    """While a Blocks is built to be launched: Gradio makes its FastAPI app (every route's dependencies analysed)
    when the Blocks closes and again in ``queue()``, and ``launch()`` makes
    the one it serves, dropping those two. Here the first two are not made; ``launch()`` works as before."""
    from gradio.routes import App

    made = App.__dict__["create_app"]
    App.create_app = staticmethod(lambda *args, **kwargs: None)  # type: ignore[method-assign]
    try:
        yield
    finally:
        App.create_app = made  # type: ignore[method-assign]
