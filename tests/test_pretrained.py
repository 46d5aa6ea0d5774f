"""Shipped models by name, and the save_pretrained / from_pretrained round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import hyperset
from hyperset.checkpoint import CheckpointError
from hyperset.config import ModelConfig
from hyperset.models import HyperSETModel
from hyperset.pretrained import PRETRAINED, pretrained_dir, resolve


def boards() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    d = torch.randint(1, 10, (2, 81), generator=g)
    return torch.where(torch.rand(2, 81, generator=g) < 0.4, d, torch.zeros_like(d))


@pytest.mark.parametrize("name", ["sudoku", "classifier", "mim"])
def test_every_shipped_model_loads_by_name_offline(name: str) -> None:
    model = hyperset.load_pretrained(name)
    assert isinstance(model, HyperSETModel) and not model.training
    assert model.cfg.task == {"sudoku": "sudoku", "classifier": "classify", "mim": "mim"}[name]


@pytest.mark.parametrize("preset", hyperset.list_presets(pretrained=True))
def test_create_model_with_and_without_pretrained_is_one_architecture(preset: str) -> None:
    """timm's rule: one name, one architecture; pretrained=True only fills in the shipped weights."""
    a = hyperset.create_model(preset, pretrained=True)
    fresh = hyperset.create_model(preset)
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in fresh.state_dict().items()}
    b = hyperset.load_pretrained(pretrained_dir(hyperset.get_preset(preset).pretrained))
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), k
    with pytest.raises(ValueError, match="overrides"):
        hyperset.create_model(preset, pretrained=True, iters=8)


def test_the_shipped_models_each_have_a_preset_and_a_preset_without_weights_says_which_have() -> None:
    assert set(hyperset.list_presets(pretrained=True)) == {"sudoku-cpu", "cifar10-cpu", "mim-cpu-small"}
    assert {hyperset.get_preset(p).pretrained for p in hyperset.list_presets(pretrained=True)} == {
        "sudoku", "classifier", "mim"}
    with pytest.raises(ValueError, match="no shipped weights.*sudoku-cpu"):
        hyperset.create_model("sudoku", pretrained=True)  # the paper's 5.2 M preset: not the shipped model
    with pytest.raises(CheckpointError) as err:
        hyperset.load_pretrained("nope")
    assert "mim-tokenizer" not in str(err.value) and "sudoku" in str(err.value)


def test_save_pretrained_then_from_pretrained_gives_identical_outputs(tmp_path: Path) -> None:
    model = hyperset.load_pretrained("sudoku")
    model.save_pretrained(str(tmp_path / "copy"))
    again = HyperSETModel.from_pretrained(str(tmp_path / "copy"))
    with torch.no_grad():
        assert torch.equal(model(boards(), iters=20), again(boards(), iters=20))
    assert again.cfg == model.cfg


def test_unknown_names_are_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CheckpointError, match="not a shipped model"):
        resolve("sudokuu")
    with pytest.raises(CheckpointError, match="no shipped model"):
        pretrained_dir("chess")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match="owner/missing-model"):
        resolve("owner/missing-model")
    assert set(PRETRAINED) >= {"sudoku", "classifier", "mim"}


def test_a_missing_folder_under_a_local_folder_is_not_looked_up_on_the_hub(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """'runs/best' where runs/ is a local folder names a missing checkpoint folder, not a Hub repository; a Hub
    failure is one line whatever the library's message."""
    import sys
    import types

    calls: list[str] = []

    def snapshot_download(repo_id: str, **kw: object) -> str:
        calls.append(repo_id)
        raise OSError("Cannot reach the Hub.\nCheck your internet connection.\n  (more detail)")

    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(snapshot_download=snapshot_download))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(CheckpointError, match=r"^runs/best: no such checkpoint folder, and not a shipped model"):
        resolve("runs/best")
    assert calls == []
    with pytest.raises(CheckpointError) as error:
        resolve("owner/model")
    assert calls == ["owner/model"]
    assert str(error.value) == ("owner/model: no such checkpoint folder, and the Hugging Face Hub could not give it "
                                "(OSError: Cannot reach the Hub.)")


def test_save_pretrained_checks_everything_before_it_writes(tmp_path: Path) -> None:
    """A save that cannot be loaded back, or that would replace another program's files, writes nothing: the
    checkpoint already in the folder stays whole."""
    import json

    model = hyperset.load_pretrained("sudoku")
    model.save_pretrained(str(tmp_path / "d"))
    wider = hyperset.create_model("sudoku-cpu", dim=64)
    for info, message in (({"n": {1}}, "checkpoint info must be JSON"),
                          ({"trained_iterations": 0}, "trained_iterations = 0: must be between 1 and 10,000")):
        with pytest.raises(ValueError, match=message):
            wider.save_pretrained(str(tmp_path / "d"), info=info)
    assert hyperset.load_pretrained(str(tmp_path / "d")).cfg.dim == 128  # the first save, whole
    model.save_pretrained(str(tmp_path / "d"), info={"score": float("nan")})
    assert json.loads((tmp_path / "d" / "config.json").read_text())["score"] is None  # JSON: null, not NaN
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "weights-only").mkdir()
    (tmp_path / "weights-only" / "model.safetensors").write_bytes(b"not ours")
    (tmp_path / "afile").write_text("x")
    for folder, message in (("bert", "config.json is not a Hyper-SET checkpoint's config: not overwritten"),
                            ("weights-only", "has no Hyper-SET config.json beside it: not overwritten"),
                            ("afile", "is a file: a checkpoint is a folder")):
        with pytest.raises(ValueError, match=message):
            model.save_pretrained(str(tmp_path / folder))
    assert (tmp_path / "bert" / "config.json").read_text() == '{"model_type": "bert"}'
    assert (tmp_path / "weights-only" / "model.safetensors").read_bytes() == b"not ours"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_torch_device_is_checked_like_its_name() -> None:
    for device in ("cuda", torch.device("cuda")):
        with pytest.raises(ValueError, match="no CUDA device"):
            hyperset.load_pretrained("sudoku", device=device)
    assert next(hyperset.load_pretrained("sudoku", device=torch.device("cpu")).parameters()).device.type == "cpu"


def test_the_shipped_tokenizer_is_named_with_its_own_loader() -> None:
    with pytest.raises(CheckpointError, match="load_tokenizer"):
        hyperset.load_pretrained("mim-tokenizer")
    from hyperset.vision.reconstruct import load_tokenizer

    assert load_tokenizer(pretrained_dir("mim-tokenizer")) is not None


def test_a_shipped_name_is_not_hidden_by_a_folder_of_that_name_that_is_no_checkpoint(tmp_path, monkeypatch):
    (tmp_path / "sudoku").mkdir()  # say, the data folder of the docs' commands
    monkeypatch.chdir(tmp_path)
    assert hyperset.load_pretrained("sudoku").cfg.task == "sudoku"
    mine = hyperset.create_model("sudoku-cpu", dim=16, heads=2, ff_hidden=16, time_dim=16, iters=2)
    mine.save_pretrained(tmp_path / "sudoku")  # a checkpoint folder of that name is the user's
    assert hyperset.load_pretrained("sudoku").cfg.dim == 16


def test_save_pretrained_keeps_the_inference_defaults_and_says_where_the_model_came_from(tmp_path: Path) -> None:
    """load_pretrained("sudoku").save_pretrained(folder) kept 6 of 19 config keys: the copy then solved with other
    defaults (107 iterations in 7 passes where the shipped model ran 17 in 1)."""
    import json

    from hyperset.solve import Solver

    hyperset.load_pretrained("sudoku").save_pretrained(str(tmp_path / "copy"))
    shipped = json.loads((pretrained_dir("sudoku") / "config.json").read_text())
    copy = json.loads((tmp_path / "copy" / "config.json").read_text())
    assert set(shipped) <= set(copy) and "shipped model 'sudoku'" in copy["derived_from"]
    assert all(copy[k] == shipped[k] for k in shipped if k not in ("derived_from", "model"))
    # the model config in full: the shipped keys as they are, keys added since then at their defaults
    defaults = ModelConfig().to_dict()
    assert {k: v for k, v in copy["model"].items() if k in shipped["model"]} == shipped["model"]
    assert all(copy["model"][k] == defaults[k] for k in copy["model"] if k not in shipped["model"])
    a, b = Solver.load(None, "cpu"), Solver.load(str(tmp_path / "copy"), "cpu")
    assert (a.default_iters, a.search_iters, a.trained_iters) == (b.default_iters, b.search_iters, b.trained_iters)
    card = (tmp_path / "copy" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: hyperset\n") and "solve_iterations" in card
    # a copy of the copy records the copy as its source
    HyperSETModel.from_pretrained(str(tmp_path / "copy")).save_pretrained(str(tmp_path / "again"), card=False)
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    assert again["derived_from"] == str(tmp_path / "copy") and not (tmp_path / "again" / "README.md").exists()


# the model cards shipped beside the weights, and the model each describes
SHIPPED_CARDS = {"sudoku": "sudoku/README.md", "classifier": "classifier/README.md", "mim": "mim/README.md"}


def card_header_of(text: str) -> str:
    """The metadata header a card begins with: the text to the second '---' line, that line included."""
    assert text.startswith("---\n"), text[:40]
    return text[: text.index("\n---\n", 3) + 5]


@pytest.mark.parametrize("name", sorted(SHIPPED_CARDS))
def test_every_shipped_card_has_the_hub_header_save_pretrained_writes(name: str, tmp_path: Path) -> None:
    hub = pytest.importorskip("huggingface_hub")
    from hyperset.models import HUB_TAGS
    from hyperset.pretrained import weights_root

    assert {p.relative_to(weights_root()).as_posix() for p in weights_root().rglob("README.md")} == set(
        SHIPPED_CARDS.values())
    card = weights_root() / SHIPPED_CARDS[name]
    model = hyperset.load_pretrained(name)
    meta = hub.metadata_load(card)  # the Hub's own reader of the header
    assert meta == {"library_name": "hyperset", "license": "mit",
                    "tags": ["hyperset", "energy-based-model", HUB_TAGS[model.cfg.task]]}
    model.save_pretrained(tmp_path / "copy")
    assert card_header_of(card.read_text()) == card_header_of((tmp_path / "copy" / "README.md").read_text())


class LocalHub:
    """A stand-in for the Hugging Face Hub (huggingface_hub.HfApi and snapshot_download): a repository is a folder
    under `root`; every call is recorded."""

    def __init__(self, root: Path) -> None:
        self.root, self.calls = root, []

    def api(self, **kw: object) -> LocalHub:
        self.calls.append(("HfApi", kw))
        return self

    def create_repo(self, repo_id: str, **kw: object) -> str:
        self.calls.append(("create_repo", repo_id, kw))
        if (self.root / repo_id).exists() and not kw.get("exist_ok"):
            raise FileExistsError(repo_id)
        (self.root / repo_id).mkdir(parents=True, exist_ok=True)
        return f"https://hub.local/{repo_id}"

    def upload_folder(self, *, repo_id: str, folder_path: str, **kw: object) -> str:
        import shutil

        self.calls.append(("upload_folder", repo_id, sorted(p.name for p in Path(folder_path).iterdir()), kw))
        shutil.copytree(folder_path, self.root / repo_id, dirs_exist_ok=True)
        return f"https://hub.local/{repo_id}/commit/{len(self.calls)}"

    def snapshot_download(self, repo_id: str, **kw: object) -> str:
        if not (self.root / repo_id).is_dir():
            raise OSError(f"404: {repo_id}")
        return str(self.root / repo_id)


def test_push_to_hub_uploads_what_load_pretrained_reads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """push_to_hub saves with save_pretrained (weights, config.json with the inference defaults and provenance, the
    card) and uploads the folder; load_pretrained of the repository id gives the same model, with the same
    defaults (solve_iterations) as the shipped one."""
    import json

    hub = pytest.importorskip("huggingface_hub")
    local = LocalHub(tmp_path / "hub")
    monkeypatch.setattr(hub, "HfApi", local.api)
    monkeypatch.setattr(hub, "snapshot_download", local.snapshot_download)
    monkeypatch.chdir(tmp_path)
    model = hyperset.load_pretrained("sudoku")
    url = model.push_to_hub("me/sudoku-copy", token="hf_x", private=True, commit_message="first")
    assert url == "https://hub.local/me/sudoku-copy/commit/3"
    assert local.calls[0] == ("HfApi", {"token": "hf_x", "library_name": "hyperset",
                                        "library_version": hyperset.cli_options.package_version()})
    assert local.calls[1] == ("create_repo", "me/sudoku-copy", {"private": True, "exist_ok": True,
                                                                "repo_type": "model"})
    assert local.calls[2] == ("upload_folder", "me/sudoku-copy", ["README.md", "config.json", "model.safetensors"],
                              {"commit_message": "first", "repo_type": "model"})
    again = hyperset.load_pretrained("me/sudoku-copy")
    with torch.no_grad():
        assert torch.equal(model(boards(), iters=20), again(boards(), iters=20))
    assert again.cfg == model.cfg
    shipped = json.loads((pretrained_dir("sudoku") / "config.json").read_text())
    uploaded = json.loads((tmp_path / "hub" / "me" / "sudoku-copy" / "config.json").read_text())
    assert uploaded["solve_iterations"] == shipped["solve_iterations"] and "shipped model 'sudoku'" in uploaded[
        "derived_from"]
    # by name or folder too, into a repository that exists already
    hyperset.push_to_hub("sudoku", "me/sudoku-copy")
    assert local.calls[-2][2]["exist_ok"] is True


def test_push_to_hub_without_huggingface_hub_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from hyperset.extras import MissingExtra

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(MissingExtra, match=r"push_to_hub needs huggingface_hub .*pip install 'hyperset\[hub\]'$"):
        hyperset.push_to_hub("sudoku", "me/x")
