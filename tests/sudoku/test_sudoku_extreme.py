"""Sudoku-Extreme by name, offline: a tiny file in its exact format (generated and rated puzzles, `.` for blanks)
served from a file:// folder or a server on 127.0.0.1 is fetched into the cache with a progress bar, verified,
evaluated per rating bucket and trained on; and `--download` for the other data of hyperset-eval."""

from __future__ import annotations

import hashlib
import http.server
import json
import pickle
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import write_tiny_sudoku_checkpoint

from hyperset.download import DownloadError, NotCachedError, record_path
from hyperset.sudoku import extreme
from hyperset.sudoku.data import protocol_indices
from hyperset.sudoku.exact import generate
from hyperset.sudoku.rated import BUCKETS, bucket_of, generate_rated, rate
from hyperset.training.cli import main as train_main
from hyperset.training.evaluate import main as eval_main

# 2 steps of a 16-dim model, evaluated at step 2 (the settings of test_robustness.py's TINY_TRAIN)
TINY_TRAIN = ["sudoku", "--recipe", "sudoku-cpu", "--steps", "2", "--set", "model.dim=16", "--set", "model.heads=2",
              "--set", "model.ff_hidden=16", "--set", "model.time_dim=16", "--set", "model.iters=1",
              "--set", "data.n_val=4", "--set", "data.n_select=4", "--set", "train.batch_size=4",
              "--set", "train.amp='off'", "--set", "train.eval_every=2", "--set", "train.threads=1"]
Row = tuple[str, str, str, int]  # source, question (0 = blank), answer, rating


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    """20 puzzles over every rating bucket: 7 that singles solve (rating 0), 4 each of 1-2, 3-10, 11-50, one 51+."""
    easy = [(p, s) for p, s in generate(14, 30, 36, seed=5) if rate(p) == 0][:7]
    out = [("hyperset-exact", p, s, 0) for p, s in easy]
    for bucket, n, seed in (("1-2", 4, 0), ("3-10", 4, 0), ("11-50", 4, 0), ("51+", 1, 3)):
        out += [("hyperset-rated", r.puzzle, r.solution, r.rating) for r in generate_rated(n, bucket, seed=seed)]
    assert [bucket_of(r[3]) for r in out] == ["0"] * 7 + ["1-2"] * 4 + ["3-10"] * 4 + ["11-50"] * 4 + ["51+"]
    return out


def extreme_csv(rows: list[Row]) -> str:
    """The text of a Sudoku-Extreme file: its header, then source,question,answer,rating with "." for blanks."""
    return extreme.HEADER + "\n" + "".join(f"{src},{q.replace('0', '.')},{a},{r}\n" for src, q, a, r in rows)


@pytest.fixture
def mirror(tmp_path: Path, rows: list[Row], monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file:// folder with train.csv and test.csv standing in for the Hub, and an empty cache."""
    folder = tmp_path / "mirror"
    folder.mkdir()
    for split in extreme.SPLITS:
        (folder / f"{split}.csv").write_text(extreme_csv(rows))
    monkeypatch.setenv("HYPERSET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(extreme.URL_ENV, folder.as_uri())
    return folder


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_sudoku_checkpoint(tmp_path_factory.mktemp("ckpt") / "sudoku-tiny", dim=16, ff_hidden=32,
                                        time_dim=8, iters=2)


def cache_folder(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "data" / "sudoku-extreme"


def evaluate(*args: str):
    return CliRunner().invoke(eval_main, ["sudoku", *args])


def one_line_error(result, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    return result.stderr


# ---------------------------------------------------------------------------------------------------------------
# reading the format


@pytest.mark.slow
def test_load_reads_questions_answers_and_ratings(mirror: Path, rows: list[Row]) -> None:
    data = extreme.load(mirror / "test.csv")
    assert len(data) == 20 and data.puzzles.shape == data.solutions.shape == (20, 81)
    assert ["".join(map(str, p)) for p in data.puzzles] == [r[1] for r in rows]  # "." read as a blank
    assert ["".join(map(str, s)) for s in data.solutions] == [r[2] for r in rows]
    assert data.ratings.tolist() == [r[3] for r in rows]
    assert extreme.problem(mirror / "test.csv") is None


def _swap_two_answer_digits(rows: list[Row]) -> list[Row]:
    src, q, a, r = rows[2]
    i = next(i for i in range(80) if q[i] == q[i + 1] == "0" and a[i] != a[i + 1])
    return rows[:2] + [(src, q, a[:i] + a[i + 1] + a[i] + a[i + 2:], r)] + rows[3:]


@pytest.mark.parametrize("corrupt, message", [
    (lambda rows: extreme_csv(rows).replace(extreme.HEADER, "quizzes,solutions"), "line 1: expected the header"),
    (lambda rows: "<html>please log in</html>\n", "line 1: expected the header"),
    (lambda rows: extreme.HEADER + "\n", "holds no puzzles"),
    (lambda rows: extreme_csv(_swap_two_answer_digits(rows)), "line 4: answer is not a solution of the question"),
    (lambda rows: extreme_csv(rows[:1] + [(*rows[1][:3], -1)] + rows[2:]), "line 3: rating: expected a whole number"),
    (lambda rows: extreme_csv(rows[:4] + [(rows[4][0], rows[4][1][:80], *rows[4][2:])] + rows[5:]),
     "line 6: question: expected 81 cells, found 80"),
    (lambda rows: extreme_csv(rows[:5] + [(rows[5][0], rows[5][1], rows[5][2].replace("9", "x"), rows[5][3])]),
     "line 7: answer: unexpected character 'x'"),
    (lambda rows: extreme_csv(rows).replace("\nhyperset-rated,", "\n"), "line 9: expected 4 comma-separated fields"),
    (lambda rows: extreme_csv(rows[:3]) + "\n" + extreme_csv(rows[3:]).split("\n", 1)[1], "line 5: expected 4"),
])
def test_a_file_not_in_the_format_is_refused_at_download_and_nothing_is_cached(mirror: Path, rows: list[Row],
                                                                               tmp_path: Path, corrupt,
                                                                               message: str) -> None:
    (mirror / "test.csv").write_text(corrupt(rows))
    with pytest.raises(DownloadError) as info:
        extreme.cached_split("test", download=True)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert "put it at" in str(info.value)  # says where to place the file by hand
    assert list(cache_folder(tmp_path).iterdir()) == []  # no file under the final name, no temporary file


# ---------------------------------------------------------------------------------------------------------------
# the download and the cache


def test_download_fetches_into_the_cache_with_a_progress_bar_and_records_the_sha256(
        mirror: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    path = extreme.cached_split("test", download=True, progress=True)
    assert path == cache_folder(tmp_path) / "test.csv"
    assert path.read_bytes() == (mirror / "test.csv").read_bytes()
    assert "test.csv" in capsys.readouterr().err  # the bar, named by the file
    record = json.loads(record_path(path).read_text())
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["bytes"] == path.stat().st_size and record["url"] == (mirror / "test.csv").as_uri()
    assert sorted(p.name for p in path.parent.iterdir()) == ["test.csv", "test.csv.json"]
    monkeypatch.setenv(extreme.URL_ENV, (tmp_path / "gone").as_uri())
    assert extreme.cached_split("test", download=True) == path  # found in the cache: nothing fetched


def test_without_download_a_split_not_in_the_cache_says_to_add_download(mirror: Path) -> None:
    with pytest.raises(NotCachedError, match="Sudoku-Extreme train.csv is not in the cache .*: add --download"):
        extreme.cached_split("train")
    with pytest.raises(ValueError, match="splits train, test, not 'valid'"):
        extreme.cached_split("valid")


class _HalfBody(http.server.BaseHTTPRequestHandler):
    """Announces the whole file, sends half of it and closes: a connection lost mid-download."""

    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body[: len(self.body) // 2])

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def half_server(mirror: Path) -> Iterator[str]:
    handler = type("Handler", (_HalfBody,), {"body": (mirror / "test.csv").read_bytes()})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_download_cut_short_leaves_nothing_in_the_cache(half_server: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(extreme.URL_ENV, half_server)
    with pytest.raises(DownloadError, match=r"the connection closed after [\d,]+ of [\d,]+ bytes"):
        extreme.cached_split("test", download=True)
    assert list(cache_folder(tmp_path).iterdir()) == []
    monkeypatch.setenv(extreme.URL_ENV, (tmp_path / "nowhere").as_uri())
    with pytest.raises(DownloadError, match="downloading Sudoku-Extreme test.csv from .* failed"):
        extreme.cached_split("test", download=True)
    assert list(cache_folder(tmp_path).iterdir()) == []


class _BadStatus(http.server.BaseHTTPRequestHandler):
    """Replies with a status line that is not HTTP: http.client raises its own error type, not an OSError."""

    def do_GET(self) -> None:
        self.wfile.write(b"HELLO there\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


def test_a_reply_that_is_not_http_is_a_download_error_and_leaves_nothing(mirror: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _BadStatus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv(extreme.URL_ENV, f"http://127.0.0.1:{server.server_port}")
        with pytest.raises(DownloadError, match="downloading Sudoku-Extreme test.csv from .* failed: .*HELLO"):
            extreme.cached_split("test", download=True)
    finally:
        server.shutdown()
        server.server_close()
    assert list(cache_folder(tmp_path).iterdir()) == []


def test_a_cached_file_changed_after_it_was_checked_is_refused(mirror: Path, tiny_checkpoint: Path) -> None:
    path = extreme.cached_split("test", download=True)
    path.write_text(path.read_text().replace(",0\n", ",1\n", 1))  # still the format, not the file downloaded
    with pytest.raises(DownloadError, match="changed after it was checked .*sha256"):
        extreme.cached_split("test")
    err = one_line_error(evaluate("--checkpoint", str(tiny_checkpoint), "--data", "sudoku-extreme"))
    assert "changed after it was checked" in err and "fetch it again with --download" in err


def test_a_file_placed_by_hand_is_checked_once_then_recorded(mirror: Path, rows: list[Row], tmp_path: Path) -> None:
    path = cache_folder(tmp_path) / "test.csv"
    path.parent.mkdir(parents=True)
    path.write_text(extreme_csv(_swap_two_answer_digits(rows)))
    with pytest.raises(DownloadError, match="is not Sudoku-Extreme test.csv: line 4: answer is not a solution"):
        extreme.cached_split("test")
    path.write_text(extreme_csv(rows))
    assert extreme.cached_split("test") == path
    assert json.loads(record_path(path).read_text())["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# hyperset-eval sudoku --data sudoku-extreme


def test_eval_without_download_and_without_the_cache_is_one_line_exit_2(mirror: Path, tiny_checkpoint: Path,
                                                                        tmp_path: Path) -> None:
    err = one_line_error(evaluate("--checkpoint", str(tiny_checkpoint), "--data", "sudoku-extreme"))
    assert "Sudoku-Extreme test.csv is not in the cache" in err and "add --download" in err
    assert not cache_folder(tmp_path).exists()
    err = one_line_error(evaluate("--checkpoint", str(tiny_checkpoint), "--data", "sudoku-extreme", "--split",
                                  "valid", "--download"))
    assert "splits train, test, not 'valid'" in err


def test_eval_downloads_then_reports_board_accuracy_per_rating_bucket(mirror: Path, tiny_checkpoint: Path,
                                                                      rows: list[Row]) -> None:
    run = evaluate("--checkpoint", str(tiny_checkpoint), "--data", "sudoku-extreme", "--download", "--boards", "0",
                   "--iters", "1", "--iters", "2", "--strategy", "single", "--strategy", "commit", "--passes", "2",
                   "--json")
    assert run.exit_code == 0, run.output
    report = json.loads(run.stdout)
    assert report["split"] == "test" and report["boards"] == report["available"] == 20
    counts = {"0": 7, "1-2": 4, "3-10": 4, "11-50": 4, "51+": 1}
    for depth in ("1", "2"):
        table = report["per_rating"][depth]
        assert list(table) == list(BUCKETS) and {b: v["boards"] for b, v in table.items()} == counts
        right = sum(v["boards"] * v["board_acc"] for v in table.values())
        assert right / 20 == pytest.approx(report["depths"][int(depth) - 1]["board_acc"])
    for row in report["strategies"]:
        assert {b: v["boards"] for b, v in row["per_rating"].items()} == counts
        assert sum(v["boards"] * v["board_acc"] for v in row["per_rating"].values()) / 20 == pytest.approx(
            row["board_acc"])


def test_eval_draws_a_seeded_uniform_sample_and_prints_the_bucket_table(mirror: Path, tiny_checkpoint: Path,
                                                                        rows: list[Row]) -> None:
    run = evaluate("--checkpoint", str(tiny_checkpoint), "--data", "sudoku-extreme", "--download", "--boards", "6",
                   "--seed", "1", "--json")
    assert run.exit_code == 0, run.output
    drawn = [bucket_of(rows[i][3]) for i in protocol_indices(20, 6, 1)]
    assert {b: v["boards"] for b, v in json.loads(run.stdout)["per_rating"]["2"].items()} == {
        b: drawn.count(b) for b in BUCKETS}
    text = evaluate("--checkpoint", str(tiny_checkpoint), "--data", "sudoku-extreme", "--boards", "6")
    assert text.exit_code == 0, text.output
    assert "board accuracy per rating bucket (6 of the split's 20 puzzles, a seeded uniform draw)" in text.stdout
    assert all(f"  {b:>6}  " in text.stdout for b in BUCKETS)


# ---------------------------------------------------------------------------------------------------------------
# hyperset-train sudoku --data sudoku-extreme


def test_train_downloads_the_train_split_and_trains_on_it(mirror: Path, tmp_path: Path) -> None:
    args = [*TINY_TRAIN, "--data", "sudoku-extreme"]
    err = one_line_error(CliRunner().invoke(train_main, [*args, "--out", str(tmp_path / "run0")]))
    assert "Sudoku-Extreme train.csv is not in the cache" in err and "add --download" in err
    run = CliRunner().invoke(train_main, [*args, "--download", "--out", str(tmp_path / "run"), "--json"])
    assert run.exit_code == 0, run.output
    assert json.loads(run.stdout.strip().splitlines()[-1])["step"] == 2
    assert (cache_folder(tmp_path) / "train.csv").is_file() and not (cache_folder(tmp_path) / "test.csv").exists()
    config = json.loads((tmp_path / "run" / "last" / "config.json").read_text())
    assert '"data_dir": "sudoku-extreme"' in json.dumps(config)


def test_the_validation_puzzles_are_held_out_of_train_by_a_seeded_draw(mirror: Path, rows: list[Row]) -> None:
    from hyperset.training.sudoku_task import extreme_train_valid

    extreme.cached_split("train", download=True)
    (tp, ts), (vp, vs) = extreme_train_valid(8, seed=0)
    assert len(tp) == 12 and len(vp) == 8
    held = {"".join(map(str, p)) for p in vp}
    assert held == {rows[i][1] for i in protocol_indices(20, 8, 0)}
    assert held.isdisjoint("".join(map(str, p)) for p in tp)
    with pytest.raises(ValueError, match="some must be left to train on"):
        extreme_train_valid(20, seed=0)


# ---------------------------------------------------------------------------------------------------------------
# --download for hyperset-eval's other data


def test_eval_sudoku_download_fetches_the_rrn_data_into_a_folder(tmp_path: Path, tiny_checkpoint: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import functools
    import zipfile

    from hyperset.sudoku import data as sudoku_data

    lines = "".join(f"{p},{s}\n" for p, s in generate(6, 30, 36, seed=2))
    archive = tmp_path / "sudoku-hard.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for split in ("train", "valid", "test"):
            zf.writestr(f"sudoku-hard/{split}.csv", lines)
    monkeypatch.setattr(sudoku_data, "download_rrn", functools.partial(sudoku_data.download_rrn, url=archive.as_uri()))
    args = ["--checkpoint", str(tiny_checkpoint), "--data", str(tmp_path / "rrn"), "--split", "test", "--json"]
    assert "rrn: file not found" in one_line_error(evaluate(*args))
    run = evaluate(*args, "--download")
    assert run.exit_code == 0, run.output
    assert json.loads(run.stdout)["boards"] == 6 and "per_rating" not in json.loads(run.stdout)
    assert (tmp_path / "rrn" / "sudoku-hard" / "test.csv").is_file()
    assert "fetches into a folder" in one_line_error(evaluate(*args[:3], str(tmp_path / "x.csv"), "--download"))


@pytest.fixture
def cifar_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny CIFAR-10 archive (random images) standing in for the official one, its md5 the expected one."""
    import dataclasses

    from hyperset.vision import data as vd

    folder = tmp_path / "src" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), b"labels": rng.integers(0, 10, 4).tolist()}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": [b"c%d" % i for i in range(10)]}, protocol=2))
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="cifar-10-batches-py")
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    monkeypatch.setitem(vd._CIFAR, "cifar10", dataclasses.replace(vd._CIFAR["cifar10"], url=archive.as_uri(), md5=md5))
    return archive


@pytest.mark.parametrize("command, options", [("classify", ["--limit", "2"]),
                                              ("mim", ["--images", "1", "--batch-size", "1"])])
def test_eval_classify_and_mim_download_cifar_into_data(cifar_mirror: Path, tmp_path: Path, command: str,
                                                        options: list[str]) -> None:
    data = tmp_path / "data"
    args = [command, "--data", str(data), *options, "--threads", "1", "--json"]
    assert one_line_error(CliRunner().invoke(eval_main, args))
    run = CliRunner().invoke(eval_main, [*args, "--download"])
    assert run.exit_code == 0, run.output
    assert (data / "cifar-10-batches-py" / "test_batch").is_file()
    assert json.loads(run.stdout)["images"] == (2 if command == "classify" else 1)
