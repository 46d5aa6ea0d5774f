"""Recipes are TOML files: a preset, model overrides, data, task and training settings."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def recipe_names() -> list[str]:
    folder = resources.files("hyperset.training") / "recipes"
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_recipe(name_or_path: str) -> tuple[str, dict[str, Any]]:
    """A recipe by name (shipped in training/recipes) or by path. Returns (name, data)."""
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.is_file():
        text, name = path.read_text(), path.stem
    else:
        resource = resources.files("hyperset.training") / "recipes" / f"{name_or_path}.toml"
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
