"""Recipes are TOML files: a preset, model overrides, data, task and training settings."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def recipe_names() -> list[str]:
    folder = resources.files("training") / "recipes"
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_recipe(name_or_path: str) -> tuple[str, dict[str, Any]]:
    """A recipe by name (shipped in training/recipes) or by path. Returns (name, data)."""
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.is_file():
        text, name = path.read_text(), path.stem
    else:
        resource = resources.files("training") / "recipes" / f"{name_or_path}.toml"
        if not resource.is_file():
            raise ValueError(f"unknown recipe {name_or_path!r}; shipped recipes: {', '.join(recipe_names())}")
        text, name = resource.read_text(), name_or_path
    try:
        return name, tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"recipe {name_or_path}: invalid TOML ({e})") from None


def parse_value(text: str) -> Any:
    """A --set value: TOML scalar/array syntax (2e-3, true, [1, 2]) or a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


TABLES = ("model", "data", "objective", "train", "tokenizer")  # the recipe tables a --set may change


def apply_overrides(recipe: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `section.key=value` overrides (e.g. train.lr=1e-3, model.iters=32, data.n_train=9000)."""
    for item in overrides:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ValueError(f"--set {item!r}: expected section.key=value, e.g. train.lr=1e-3")
        key, value = item.split("=", 1)
        section, name = key.split(".", 1)
        if section not in TABLES:
            raise ValueError(f"--set {item!r}: unknown section {section!r} (one of {', '.join(TABLES)})")
        recipe.setdefault(section, {})[name] = parse_value(value)
    return recipe


def _fits(value: Any, hint: Any) -> bool:
    """Whether a recipe value fits a dataclass field's type (ints pass as floats; bools are not numbers)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_fits(v, a) for v, a in zip(value, args))
        return all(_fits(v, args[0]) for v in value) if args else True
    if hint is type(None):
        return value is None
    if hint in (int, float):
        return isinstance(value, (int, float) if hint is float else int) and not isinstance(value, bool)
    if hint in (bool, str):
        return isinstance(value, hint)
    return True  # types a recipe cannot spell are not checked here


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint)


def check_table(cls: type, table: dict[str, Any], section: str, known: Sequence[str] | None = None) -> None:
    """A recipe table for dataclass `cls`: unknown keys and values of the wrong type are ValueErrors that name
    `section.key`. `known` limits the keys a recipe may set (default: every field of `cls`)."""
    names = list(known) if known is not None else [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(table) - set(names))
    if unknown:
        raise ValueError(f"unknown [{section}] keys: {', '.join(unknown)} (known: {', '.join(sorted(names))})")
    hints = typing.get_type_hints(cls)
    for key, value in table.items():
        if key in hints and not _fits(value, hints[key]):
            raise ValueError(f"{section}.{key} = {value!r}: expected {_type_name(hints[key])}")
