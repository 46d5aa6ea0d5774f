"""Packaging: one top-level name. training/, exports/ and apps/ install as hyperset.training, hyperset.exports and
hyperset.apps (pyproject's package-dir), in the wheel and in an editable install; each module exists once."""

import ast
import importlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
ROOMS = {"training": "hyperset/training", "exports": "hyperset/exports", "apps": "hyperset/apps"}
SOURCES = {"hyperset": "hyperset", **ROOMS}  # repository folder -> its place in the installed package
SCRIPTS = {"hyperset-solve": "hyperset._entry:solve", "hyperset-train": "hyperset._entry:train",
           "hyperset-eval": "hyperset._entry:evaluate", "hyperset-export": "hyperset._entry:export",
           "hyperset-app": "hyperset._entry:app", "hyperset-generate": "hyperset._entry:generate"}
OLD_IMPORT = re.compile(r"^\s*(from|import) (exports|training|apps)\b", re.MULTILINE)
OLD_MAIN = re.compile(r'"-m", "(training|exports|apps)\b')  # subprocess command lines


def _backend_problem() -> str | None:
    """Why the wheel cannot be built here without downloading its build backend, or None."""
    try:
        import setuptools
    except ImportError:
        return "setuptools is not installed"
    major_minor = tuple(int(p) for p in re.findall(r"\d+", setuptools.__version__)[:2])
    if major_minor < (70, 1):  # bdist_wheel is part of setuptools from 70.1 on
        return f"setuptools {setuptools.__version__} < 70.1 (the [test] extra installs a newer one)"
    return None


def _source_files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix != ".pyc")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel built offline with the installed build backend from a copy of the tree (no build/ in the repo)."""
    problem = _backend_problem()
    if problem:
        pytest.skip(f"cannot build the wheel offline: {problem}")
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for folder in SOURCES:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    backend = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["build-backend"]
    code = f"import sys, {backend} as b; print(b.build_wheel(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with zipfile.ZipFile(out / done.stdout.strip().splitlines()[-1]) as zf:
        yield zf


def test_wheel_has_one_top_level_package(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"hyperset"}
    assert len(tops) == 2, tops
    top_level = [n for n in wheel.namelist() if n.endswith(".dist-info/top_level.txt")]
    if top_level:
        assert wheel.read(top_level[0]).decode().split() == ["hyperset"]


def test_wheel_holds_every_source_file_recipes_and_weights(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for folder, place in SOURCES.items():
        wanted = [p for p in _source_files(folder) if p.suffix == ".py"]
        wanted += [p for p in _source_files(folder) if p.parent.name == "recipes" and p.suffix == ".toml"]
        missing = [str(p.relative_to(ROOT)) for p in wanted if f"{place}/{p.relative_to(ROOT / folder).as_posix()}"
                   not in names]
        assert not missing, f"not in the wheel: {missing}"
    recipes = [n for n in names if re.fullmatch(r"hyperset/training/recipes/[^/]+\.toml", n)]
    assert len(recipes) == len(list((ROOT / "training" / "recipes").glob("*.toml"))) > 0
    weights = [p.relative_to(ROOT).as_posix() for p in _source_files("hyperset/weights")]
    assert weights and not [w for w in weights if w not in names]
    assert {"sudoku", "classifier", "mim"} <= {w.split("/")[2] for w in weights}
    assert "hyperset/py.typed" in names
    assert "hyperset/accel/kernels/bisoftmax.c" in names  # compiled on first use (hyperset.accel.cpu_kernels)
    assert "hyperset/sudoku/rated.c" in names  # the rated-puzzle generator, compiled on first use


def test_wheel_entry_points_name_the_installed_modules(wheel: zipfile.ZipFile) -> None:
    text = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
    sections: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        if line.startswith("["):
            section = sections.setdefault(line.strip("[]"), {})
        elif "=" in line:
            key, value = (s.strip() for s in line.split("=", 1))
            section[key] = value
    assert sections["console_scripts"] == SCRIPTS
    assert sections["hyperset.backends"] == {"onnx": "hyperset.exports.solver_backend:create_backend"}
    for target in [*SCRIPTS.values(), *sections["hyperset.backends"].values()]:
        module = target.split(":")[0].replace(".", "/") + ".py"
        assert module in wheel.namelist(), target


def test_code_imports_the_rooms_by_their_installed_names() -> None:
    found = []
    for folder in ("hyperset", "training", "exports", "apps", "tests", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            found += [f"{path.relative_to(ROOT)}: {m.group(0).strip()}" for m in OLD_IMPORT.finditer(text)]
            found += [f"{path.relative_to(ROOT)}: -m {m}" for m in OLD_MAIN.findall(text)]
    assert not found, found


PROBE = """
import importlib, json, pkgutil, sys
import hyperset
library = [m.name for m in pkgutil.walk_packages(hyperset.__path__, "hyperset.")]
for name in library:
    importlib.import_module(name)
rooms = ("hyperset.training", "hyperset.exports", "hyperset.apps")
by_library = sorted(m for m in sys.modules if m.startswith(rooms))
for name in ("hyperset.training.cli", "hyperset.training.evaluate", "hyperset.exports.cli", "hyperset.apps.cli"):
    importlib.import_module(name)
from hyperset.backends import backend_factory
onnx = backend_factory("onnx")
print(json.dumps({"library": library, "by_library": by_library, "onnx": f"{onnx.__module__}:{onnx.__name__}",
                  "files": {r: sys.modules[r].__file__ for r in ("hyperset", *rooms)},
                  "old_names": sorted(m for m in sys.modules if m.split(".")[0] in ("training", "exports", "apps"))}))
"""


@pytest.mark.slow
def test_library_imports_no_room_and_each_module_exists_once(tmp_path: Path) -> None:
    """From outside the repository: importing every library module loads none of the rooms; the rooms load under
    their installed names only, from the folders beside hyperset/ when the library is this checkout (editable)."""
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    rooms = tuple(f"hyperset.{room}" for room in ROOMS)
    assert "hyperset.sudoku.exact" in seen["library"] and not [m for m in seen["library"] if m.startswith(rooms)]
    assert seen["by_library"] == []
    assert seen["old_names"] == []
    assert seen["onnx"] == "hyperset.exports.solver_backend:create_backend"
    library = Path(seen["files"]["hyperset"]).parent
    for room, place in ROOMS.items():
        expected = ROOT / room if library == ROOT / "hyperset" else library.parent / place
        assert Path(seen["files"][f"hyperset.{room}"]).parent == expected


def _library_imports() -> dict[str, set[str]]:
    """Library module -> the library modules it imports, at the top or inside a function (a lazy import is an
    arrow too), read from the source."""
    files = {}
    for f in (ROOT / "hyperset").rglob("*.py"):
        parts = f.relative_to(ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    edges: dict[str, set[str]] = {m: set() for m in files}
    for module, f in files.items():
        package = module if f.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package
                    for _ in range(node.level - 1):
                        up = up.rpartition(".")[0]
                    base = f"{up}.{base}" if base else up
                targets = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges[module].add(target)
    return edges


def _circles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The groups of modules that reach each other (strongly connected components of two or more)."""
    reach = {m: set() for m in edges}
    for m in edges:
        todo = list(edges[m])
        while todo:
            n = todo.pop()
            if n not in reach[m]:
                reach[m].add(n)
                todo.extend(edges[n])
    groups: list[set[str]] = []
    for m in sorted(edges):
        group = {m} | {n for n in reach[m] if m in reach[n]}
        if len(group) > 1 and group not in groups:
            groups.append(group)
    return groups


def test_the_library_modules_import_one_another_in_no_circle() -> None:
    """The floors form a line: no module reaches back to itself through the modules it imports (lazily or not);
    the package itself only looks names up in its modules (none imports it). The checkpoint format sits below the
    model, which saves and loads itself through it; the names of the shipped models sit above both."""
    edges = _library_imports()
    assert _circles(edges) == []
    assert "hyperset.models" not in edges["hyperset.checkpoint"] and "hyperset.models" in edges["hyperset.pretrained"]
    assert [m for m, targets in edges.items() if "hyperset" in targets] == []
    assert edges["hyperset.files"] <= {"hyperset.version"} and not edges["hyperset.version"]
    assert {"hyperset.sudoku.board"} == edges["hyperset.sudoku.exact"] and not edges["hyperset.sudoku.board"]


REFERENCE_MATH = ("energies", "layers", "core")


def test_the_reference_math_reaches_the_speed_code_through_the_policy_alone() -> None:
    """energies, layers and core import one name from hyperset.accel, `policy`, and nothing from its modules; the
    acceleration package sits below them (it imports none of the math, only the device helpers and the C loader);
    the C loader needs no torch, so the puzzle generator builds on it without the speed code."""
    for name in REFERENCE_MATH:
        for node in ast.walk(ast.parse((ROOT / "hyperset" / f"{name}.py").read_text())):
            if isinstance(node, ast.Import):
                assert not [a.name for a in node.names if a.name.startswith("hyperset.accel")], name
            elif isinstance(node, ast.ImportFrom):
                module = ("hyperset." if node.level else "") + (node.module or "")
                if module == "hyperset" or module.startswith("hyperset.accel"):
                    assert module != "hyperset" or "accel" not in [a.name for a in node.names], name
                    if module.startswith("hyperset.accel"):
                        assert module == "hyperset.accel" and [a.name for a in node.names] == ["policy"], name
    edges = _library_imports()
    accel = {m for m in edges if m == "hyperset.accel" or m.startswith("hyperset.accel.")}
    assert set().union(*(edges[m] for m in accel)) <= accel | {"hyperset.device", "hyperset.cbuild"}
    assert not edges["hyperset.cbuild"] and not [m for m in edges["hyperset.sudoku.rated"] if m in accel]
    assert {"hyperset.accel"} == {t for m in REFERENCE_MATH for t in edges[f"hyperset.{m}"] if t in accel}


def test_the_circle_finder_finds_a_circle_through_a_lazy_import() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_recipes_resolve_through_the_installed_name() -> None:
    recipes = importlib.import_module("hyperset.training.recipes")
    assert "sudoku-cpu" in recipes.recipe_names()


def test_onnx_gives_the_cpu_runtime_and_onnx_gpu_the_cuda_one_never_both() -> None:
    """[onnx] installed the 339 MB onnxruntime-gpu wheel on any Linux x86_64, GPU or not. The two runtimes install
    one module (the last installed wins), so no extra, [test] included, asks for both."""
    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {extra: {Requirement(r).name for r in reqs} for extra, reqs in extras.items()}
    assert names["onnx"] == {"onnx", "onnxruntime"}
    assert names["onnx-gpu"] == {"onnx", "onnxruntime-gpu"}
    assert all(Requirement(r).marker is None for r in extras["onnx"] + extras["onnx-gpu"])  # on every platform
    test = {Requirement(r).name: Requirement(r).extras for r in extras["test"]}
    assert {"onnx", "hub"} <= test["hyperset"] and "onnx-gpu" not in test["hyperset"]
    assert not {"onnxruntime", "onnxruntime-gpu"} & set(test)
    assert names["hub"] == {"huggingface_hub"}


def test_every_package_data_pattern_ships_a_file() -> None:
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"hyperset": ROOT / "hyperset", **{k: ROOT / v for k, v in setup["package-dir"].items()}}
    for package, patterns in setup["package-data"].items():
        for pattern in patterns:
            folder = folders.get(package, ROOT.joinpath(*package.split(".")))  # a subpackage in its own folder
            assert any(folder.glob(pattern)), f"{package}: {pattern} matches no file"
