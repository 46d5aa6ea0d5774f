"""Recipes are TOML files: a preset, model overrides, data, task and training settings."""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

from hyperset.config import TableError, require_table

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

TABLES = ("model", "data", "objective", "train", "tokenizer")  # the recipe tables (a --set may change them)
TOP_LEVEL = ("task", "preset", "description")  # the recipe's other keys: each a string


def recipe_names() -> list[str]:
    folder = resources.files("hyperset.training") / "recipes"
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def _is_path(text: str) -> bool:
    """Whether --recipe names a file (a folder or a suffix in it) rather than a shipped recipe."""
    return "/" in text or "\\" in text or Path(text).suffix != ""


def recipe_text(name_or_path: str | os.PathLike) -> tuple[str, str, str]:
    """(name, where, text) of a recipe by shipped name or by file path; `where` is the path errors point at.
    A missing or unreadable file, or one that is not UTF-8 text, is a ValueError that says so."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"a recipe is a shipped name or a path, got {name_or_path!r}")
    if isinstance(name_or_path, os.PathLike):
        name_or_path = os.fspath(name_or_path)
        if "/" not in name_or_path and "\\" not in name_or_path:  # a Path is a file, whatever its name
            name_or_path = os.path.join(".", name_or_path)
    if _is_path(name_or_path):
        path = Path(name_or_path)
        if path.is_dir():
            raise ValueError(f"recipe {name_or_path}: is a folder, not a .toml file")
        if not path.exists():
            raise ValueError(f"recipe {name_or_path}: no such file (shipped recipes, by name: "
                             f"{', '.join(recipe_names())})")
        try:
            with open(path, "rb") as f:  # bounded by the read, not the size the file claims (a pipe has none)
                data = f.read(MAX_RECIPE_BYTES + 1)
            if len(data) > MAX_RECIPE_BYTES:
                raise ValueError(f"recipe {name_or_path}: more than {MAX_RECIPE_BYTES >> 20} MiB; a recipe is a "
                                 "TOML file of a few kB")
            return path.stem, name_or_path, data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{name_or_path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                             f"{e.start}); a recipe is a TOML file") from None
        except OSError as e:
            raise ValueError(f"recipe {name_or_path}: cannot be read ({e.strerror or e})") from None
    resource = resources.files("hyperset.training") / "recipes" / f"{name_or_path}.toml"
    if not resource.is_file():
        raise ValueError(f"unknown recipe {name_or_path!r}; shipped recipes: {', '.join(recipe_names())} (a file "
                         "is named by its path, e.g. ./my.toml)")
    return name_or_path, str(resource), resource.read_text()


# a recipe is a few kB of TOML
MAX_RECIPE_BYTES = 1 << 20


def load_recipe(name_or_path: str | os.PathLike) -> tuple[str, dict[str, Any]]:
    """A recipe by name (shipped in training/recipes) or by path. Returns (name, data)."""
    name, where, text = recipe_text(name_or_path)
    try:
        return name, tomllib.loads(text)
    except RecursionError:
        raise ValueError(f"{where}: invalid TOML: nested too deeply") from None
    except tomllib.TOMLDecodeError as e:
        at = re.search(r"\s*\(at line (\d+), column (\d+)\)", str(e))
        reason = str(e)[: at.start()] + str(e)[at.end():] if at else str(e)
        place = f"{where}:{at[1]}:{at[2]}" if at else where
        raise ValueError(f"{place}: invalid TOML: {reason}") from None


def key_line(text: str, section: str | None, key: str) -> int | None:
    """The line (1-based) of the TOML text that sets `key` in table `section` (None: the top level), or that
    opens the table `key` at the top level; None where it cannot be told (e.g. inside an inline table)."""
    current: str | None = None
    quoted = rf'(?:{re.escape(key)}|"{re.escape(key)}"|\'{re.escape(key)}\')'
    for number, line in enumerate(text.splitlines(), 1):
        header = re.match(r"\s*\[\s*([A-Za-z0-9_\-.\"']+)\s*\]", line)
        if header:
            current = header[1].strip("\"'")
            if section is None and current == key:
                return number
            continue
        if current == section and re.match(rf"\s*{quoted}\s*=", line):
            return number
        if current is None and section is not None and re.match(rf"\s*{re.escape(section)}\.{quoted}\s*=", line):
            return number
    return None


def check_recipe(recipe: dict[str, Any], task: str) -> None:
    """The recipe's shape: its tables are tables, its other keys are strings, nothing unknown ([tokenizer] only for
    the masked image modeling task). TableErrors (ValueErrors) that name the key."""
    for key, value in recipe.items():
        if key in TABLES:
            require_table(value, key)
            if key == "tokenizer" and task != "mim":
                raise TableError(f"a [tokenizer] table is for mim recipes (the VQ tokenizer stage), not {task}",
                                 None, key)
        elif key in TOP_LEVEL:
            if not isinstance(value, str):
                raise TableError(f"{key} = {value!r}: expected a string", None, key)
        else:
            raise TableError(f"unknown recipe key {key!r} (known: {', '.join(TOP_LEVEL)} and the tables "
                             f"{', '.join(f'[{t}]' for t in TABLES)})", None, key)


def parse_value(text: str) -> Any:
    """A --set value: TOML scalar/array syntax (2e-3, true, [1, 2]) or a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):  # not TOML (or nested past any use): the text itself
        return text


def apply_overrides(recipe: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `section.key=value` overrides (e.g. train.lr=1e-3, model.iters=32, data.n_train=9000)."""
    for item in overrides:
        key = item.split("=", 1)[0]
        if "=" not in item or "." not in key or not all(key.split(".", 1)):
            raise ValueError(f"--set {item!r}: expected section.key=value, e.g. train.lr=1e-3")
        value = item.split("=", 1)[1]
        section, name = key.split(".", 1)
        if section not in TABLES:
            raise ValueError(f"--set {item!r}: unknown section {section!r} (one of {', '.join(TABLES)})")
        table = recipe.setdefault(section, {})
        require_table(table, section)
        if section == "train":
            _replace_counterpart(table, name)
        table[name] = parse_value(value)
    return recipe


def _replace_counterpart(train: dict[str, Any], name: str) -> None:
    """A --set of a [train] length in steps replaces the recipe's length in epochs, and the other way round
    (train.steps for train.epochs, warmup_steps for warmup_epochs, eval_every for eval_every_epochs). A run
    given in epochs evaluated once an epoch by default: that stays so when its epochs give way to steps."""
    from .epochs import EPOCH_KEYS

    pairs = {**{k: v for k, (v, _) in EPOCH_KEYS.items()}, **{v: k for k, (v, _) in EPOCH_KEYS.items()}}
    other = pairs.get(name)
    if other is None or other not in train:
        return
    del train[other]
    if other == "epochs" and "eval_every" not in train and "eval_every_epochs" not in train:
        train["eval_every_epochs"] = 1


def locate(error: TableError, name_or_path: str, overrides: list[str] | tuple[str, ...]) -> str:
    """The error's message, led by FILE:LINE where the recipe file sets the key it is about (not where a --set
    sets it, and not for a shipped recipe, which a --set is the only way to change)."""
    dotted = f"{error.section}.{error.key}" if error.section else error.key
    if not _is_path(name_or_path) or any(o.split("=", 1)[0].strip() == dotted for o in overrides):
        return str(error)
    try:
        _, where, text = recipe_text(name_or_path)
    except ValueError:
        return str(error)
    line = key_line(text, error.section, error.key)
    return f"{where}:{line}: {error}" if line else f"{where}: {error}"
