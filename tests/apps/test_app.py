"""The web app: its handlers called directly, then the launched app through gradio_client.

Tiny untrained models keep this fast; the shipped ones are not needed."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
import warnings
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from PIL import Image

from hyperset.apps.app import HyperSETApp, build_demo
from hyperset.apps.inputs import InputError, grid_to_puzzle, puzzle_to_grid
from hyperset.apps.limits import MAX_TEXT_CHARS
from hyperset.apps.reconstruction_tab import DEFAULT_MASK_RATIO, DEFAULT_SAMPLE, MAX_ITER_FACTOR
from hyperset.apps.rendering import energy_note, mim_training_note, render_board, to_display
from hyperset.apps.sudoku_tab import EXAMPLES
from hyperset.config import MAX_ITERS, preset_config
from hyperset.models import HyperSETModel, save_checkpoint
from hyperset.solve import Solver
from hyperset.vision.reconstruct import MIMPipeline, Tokenizer, default_model_dir
from hyperset.vision.vq import VQConfig, VQTokenizer

TRAINED = 3
EASY = "063092051749160820510738694106309207384276019097051346430510962975624108601983475"
NO_SOLUTION = "123456780000000009" + "0" * 63  # no digit repeats, but r1c9 can hold none
TINY_VQ = {"hidden": 32, "num_res_blocks": 1, "codebook_size": 64, "code_dim": 16, "restart_after": 5}
TINY_TOKENS = {"dim": 32, "heads": 2, "ff_hidden": 32, "iters": 2, "time_dim": 32, "vocab_size": 65,
               "num_classes": 64, "seq_len": 64}


def tiny_solver(directory: Path) -> Solver:
    torch.manual_seed(0)
    cfg = preset_config("sudoku-cpu", dim=32, heads=2, ff_hidden=64, time_dim=16, iters=TRAINED)
    save_checkpoint(directory, HyperSETModel(cfg), {"trained_iterations": TRAINED})
    return Solver.load(directory, device="cpu")


def tiny_mim() -> MIMPipeline:
    torch.manual_seed(0)
    vq = VQTokenizer(VQConfig(**TINY_VQ))
    vq.train()
    vq(torch.rand(4, 3, 32, 32))  # seeds the codebook
    return MIMPipeline(Tokenizer(vq, "vq-tokenizer", 32), HyperSETModel(preset_config("mim-cpu", **TINY_TOKENS)))


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> HyperSETApp:
    return HyperSETApp(tiny_solver(tmp_path_factory.mktemp("sudoku")), tiny_mim())


# ---- pure helpers ---------------------------------------------------------------------------------------------


def test_grid_round_trip_and_cell_forms():
    grid = puzzle_to_grid(EASY)
    assert len(grid) == 9 and all(len(r) == 9 for r in grid) and grid[0][0] == ""
    assert grid_to_puzzle(grid) == EASY
    grid[0][0] = 8.0  # numbers, NaN, None, '.' are accepted cell forms
    grid[0][3] = float("nan")
    grid[0][4] = None
    grid[0][5] = "."
    assert grid_to_puzzle({"headers": list("123456789"), "data": grid})[:6] == "863000"


@pytest.mark.parametrize("grid, words", [
    ([["1"] * 9] * 8, "9 rows of 9 cells"),
    ([[""] * 9 for _ in range(9)], "empty"),
    ([["12"] + [""] * 8] + [[""] * 9 for _ in range(8)], "r1c1 holds '12'"),
    ([["5", "5"] + [""] * 7] + [[""] * 9 for _ in range(8)], "digit 5 appears twice in row 1"),
    (None, "enter a puzzle"),
])
def test_bad_grids_give_readable_messages(grid, words):
    with pytest.raises(InputError, match=words):
        grid_to_puzzle(grid)


def test_board_html_marks_givens_confidence_and_conflicts():
    board = "1" + EASY[1:]
    html = render_board(board.replace("0", "2"), EASY, [0.5] * 81, conflicting=[0, 1])
    assert html.count("<td") == 81 and "font-weight:800" in html
    assert "#b91c1c" in html and "confidence 0.50" in html and "r1c1" in html


# ---- Sudoku handlers --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("iters", [1, TRAINED, 2 * TRAINED + 1])
def test_solve_streams_one_update_per_iteration(app: HyperSETApp, iters: int):
    updates = list(app.sudoku.solve(puzzle_to_grid(EASY), iters, "single"))
    assert len(updates) == iters
    board, plot, verdict, details = updates[-1]
    assert "Verdict:" in verdict and f"{iters} iteration" in verdict
    # three panels: E_ATTN + E_FF, E_ATTN, E_FF
    assert board.count("<td") == 81 and plot.count("<svg") == 1 and plot.count("<polyline") == 3
    assert details["iterations"] == iters and len(details["prediction"]) == 81
    assert [len(details["energy"][k]) for k in ("attn", "ff")] == [iters, iters]
    assert all(np.isfinite(details["energy"]["attn"]))
    for u in updates[:-1]:
        assert "Solving" in u[2] and "<td" in u[0]
    # the streamed answer is the solver's answer
    ref = app.solver.solve([EASY], iters=iters, strategy="single")[0]
    assert ref.prediction == details["prediction"] and ref.valid == details["valid"]
    np.testing.assert_allclose(ref.energy["attn"], details["energy"]["attn"], rtol=1e-5)


def test_solve_commit_and_auto(app: HyperSETApp):
    commit = list(app.sudoku.solve(puzzle_to_grid(EASY), 2, "commit"))
    d = commit[-1][3]
    assert len(commit) == d["iterations"] == 2 * d["passes"] and len(d["energy_per_pass"]) == d["passes"]
    ref = app.solver.solve([EASY], iters=2, strategy="commit")[0]
    assert d["prediction"] == ref.prediction and d["passes"] == ref.passes  # the same decoding as the CLI
    cap = MAX_ITER_FACTOR * TRAINED
    auto = list(app.sudoku.solve(puzzle_to_grid(EASY), cap, "auto"))
    assert 1 <= len(auto) <= cap and auto[-1][3]["iterations"] == len(auto)


HARD = "000000200200000109000050000010400900060080030008000060400300000580040600006002004"  # rated 51+ (seed 424242)


def test_solve_search_streams_nodes_and_ends_with_the_searchs_counters(app: HyperSETApp):
    """The search in the app: the live verdict counts nodes and backtracks, the final one says how the answer
    was reached, and the board is the solver's."""
    updates = list(app.sudoku.solve(puzzle_to_grid(HARD), 2, "search"))
    live = [u[2] for u in updates[:-1] if isinstance(u[2], str)]
    assert any("node 1 of at most" in v and "backtrack" in v for v in live)
    *_, verdict, details = updates[-1]
    ref = app.solver.solve([HARD], iters=2, strategy="search")[0]
    assert details["valid"] and details["prediction"] == ref.prediction
    assert details["nodes"] == ref.search["nodes"] and details["backtracks"] == ref.search["backtracks"]
    assert ref.how in verdict
    board, verdict, energies = app.sudoku.api_solve(HARD, 2, "search")
    assert board == ref.prediction and verdict == "solved"


def test_solve_takes_the_pasted_puzzle_when_the_paste_box_was_edited_last(app: HyperSETApp):
    """Pasting a puzzle and pressing Solve without 'Put text in the grid' solved the grid's earlier puzzle."""
    from hyperset.sudoku import parse_puzzles

    medium = (Path(__file__).resolve().parents[2] / "examples" / "medium.txt").read_text()
    givens = parse_puzzles(medium)[0].givens
    updates = list(app.sudoku.solve_edited(puzzle_to_grid(EASY), medium, "text", 2, "single"))
    assert updates[0][0] == givens  # the pasted puzzle goes into the grid first
    assert "Solving the pasted puzzle" in updates[0][3]
    *_, details = updates[-1]
    assert details["puzzle"] == givens
    # the grid edited last: its puzzle, the paste box ignored
    *_, details = list(app.sudoku.solve_edited(puzzle_to_grid(EASY), medium, "grid", 2, "single"))[-1]
    assert details["puzzle"] == EASY
    # bad pasted text: the message, nothing solved
    (update,) = list(app.sudoku.solve_edited(puzzle_to_grid(EASY), "12345", "text", 2, "single"))
    assert "Input problem" in update[3] and "error" in update[4]


def test_solve_views_ends_with_the_solvers_board_and_which_view_answered(app: HyperSETApp):
    updates = list(app.sudoku.solve(puzzle_to_grid(EASY), 2, "views"))
    *_, verdict, details = updates[-1]
    ref = app.solver.solve([EASY], iters=2, strategy="views")[0]
    assert details["prediction"] == ref.prediction and details["search"]["views"] == ref.search["views"] == 9
    assert ref.how in verdict and "per view (9 views)" in verdict


@pytest.mark.slow
def test_app_and_cli_give_the_same_frames(app: HyperSETApp, tmp_path: Path):
    """The app's streamed solve and hyperset-solve run the same strategy streams: the same boards after every
    pass, the same iteration counts and the same energy at every iteration."""
    import json

    from click.testing import CliRunner

    from hyperset.cli import solve_main
    from hyperset.sudoku.exact import generate

    puzzles = [EASY, *(p for p, _ in generate(2, seed=11))]
    (tmp_path / "p.txt").write_text("\n".join(puzzles) + "\n")
    checkpoint = tmp_path / "ckpt"
    app.solver.model.save_pretrained(str(checkpoint), {"trained_iterations": TRAINED})
    for strategy, iters in (("single", TRAINED + 1), ("commit", 2)):
        out = CliRunner().invoke(solve_main, [str(tmp_path / "p.txt"), "--checkpoint", str(checkpoint), "--json",
                                              "--device", "cpu", "--iters", str(iters), "--strategy", strategy])
        assert out.exit_code in (0, 1), out.output
        cli_results = json.loads(out.stdout)["results"]
        for puzzle, r in zip(puzzles, cli_results):
            frames = list(app.sudoku._frames(puzzle, iters, strategy))
            assert [f.step for f in frames] == list(range(1, r["iterations"] + 1))
            # the board at the end of every pass, as the CLI's stream (whole passes) saw it
            pass_ends = [f.digits for f in frames if f.t == iters]
            cli_passes = [("".join(map(str, f.digits[0].tolist()))) for f in
                          app.solver.frames([puzzle], iters, strategy, per_iteration=False) if f.kind == "pass"]
            assert pass_ends == cli_passes and pass_ends[-1] == r["prediction"]
            app_energy = [e for p in frames[-1].passes for e in p["attn"]]
            np.testing.assert_allclose(app_energy, r["energy"]["attn"], rtol=1e-6)
            assert [len(p["ff"]) for p in frames[-1].passes] == r["pass_lengths"]
            *_, details = list(app.sudoku.solve(puzzle_to_grid(puzzle), iters, strategy))[-1]
            assert details["prediction"] == r["prediction"] and details["iterations"] == r["iterations"]
            np.testing.assert_allclose(details["energy"]["ff"], r["energy"]["ff"], rtol=1e-6)


@pytest.mark.parametrize("grid, iters, strategy, words", [
    ([["5", "5"] + [""] * 7] + [[""] * 9 for _ in range(8)], 3, "single", "appears twice"),
    ([["x"] * 9 for _ in range(9)], 3, "single", "enter one digit"),
    (puzzle_to_grid(EASY), MAX_ITERS + 1, "single", f"iterations = {MAX_ITERS + 1}: must be between 1 and 10,000"),
    (puzzle_to_grid(EASY), "many", "single", "iterations = 'many': expected an integer number of iterations"),
    (puzzle_to_grid(EASY), 1.5, "single", "iterations = 1.5: expected an integer number of iterations"),
    (puzzle_to_grid(EASY), 64.4, "single", "iterations = 64.4: expected an integer number of iterations"),
    (EASY[:80], 2, "single", "the grid must be 81 cells"),
    (puzzle_to_grid(EASY), 2, "magic", "strategy must be"),
])
def test_solve_bad_input_is_a_message(app: HyperSETApp, grid, iters, strategy, words):
    updates = list(app.sudoku.solve(grid, iters, strategy))
    assert len(updates) == 1
    assert "Input problem" in updates[0][2] and words in updates[0][2] and "error" in updates[0][3]


@pytest.mark.parametrize("text, words", [
    ("123", "expected 9 cells"),
    ("1" * 81, "appears twice"),
    ("0" * 80 + "y", "unexpected character"),
    ("0" * (MAX_TEXT_CHARS + 1), "too long"),
    ("   ", "paste a puzzle"),
])
def test_load_text_bad_input_is_a_message(app: HyperSETApp, text, words):
    grid, board, message = app.sudoku.load_text(text)
    assert "Input problem" in message and words in message


def test_load_text_examples(app: HyperSETApp):
    for name, text in EXAMPLES:
        grid, board, message = app.sudoku.load_text(text)
        assert len(grid) == 81 and "givens" in message, name
        assert grid_to_puzzle(grid) == grid != "0" * 81


def test_iterations_reach_the_clis_limit_and_out_of_range_values_get_a_note(app: HyperSETApp,
                                                                            monkeypatch: pytest.MonkeyPatch):
    """The Sudoku depth control takes what hyperset-solve --iters takes, 1 to MAX_ITERS, in a field that clamps
    nothing: a value out of range gets a note beside it, and Solve and /solve refuse it in the library's words."""
    import hyperset.apps.sudoku_tab as app_module
    from hyperset.apps.inputs import iterations_note

    demo = app.build()
    field = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "sudoku-iters")
    assert isinstance(field, gr.Number) and field.maximum is None and f"1 to {MAX_ITERS:,}" in field.info
    monkeypatch.setattr(app_module, "SOLVE_TIME_LIMIT", 0)  # MAX_ITERS runs (and stops after its first iteration)
    board, verdict, energies = app.sudoku.api_solve(EASY, MAX_ITERS, "single")
    assert "stopped at the time limit" in verdict and energies["iterations"] >= 1
    *_, verdict, details = list(app.sudoku.solve(puzzle_to_grid(EASY), float(MAX_ITERS), "single"))[-1]
    assert details["iterations_per_pass"] == MAX_ITERS  # JSON's 10000.0 is a whole number
    for typed, words in ((MAX_ITERS + 1, "must be between 1 and 10,000"), (0, "must be between 1 and 10,000"),
                         (1.5, "expected an integer number of iterations")):
        assert words in iterations_note(typed)
        with pytest.raises(gr.Error, match=words):
            app.sudoku.api_solve(EASY, typed, "single")
    assert iterations_note(16) == iterations_note(None) == ""
    note = iterations_note(200, app.reconstruction.max_iters, "hyperset-eval mim --iters")
    assert f"the app runs at most {app.reconstruction.max_iters}" in note and "hyperset-eval mim --iters" in note
    assert iterations_note("x" * 100_000).count("x") < 300  # a client's long value is cut in the message


def test_givens_without_a_solution_are_reported_as_the_cli_does(app: HyperSETApp):
    """No digit repeats, but r1c9 can hold none: the preview, the streamed solve and /solve say so, with the
    parser's warning that hyperset-solve prints."""
    from hyperset.sudoku.parse import parse_puzzles

    warning = parse_puzzles(NO_SOLUTION)[0].warnings[0]
    assert warning.startswith("no solution: r1c9 can hold no digit")
    grid = puzzle_to_grid(NO_SOLUTION)
    _, message = app.sudoku.preview(grid)
    assert f"Note: {warning}." in message
    *_, verdict, details = list(app.sudoku.solve(grid, 2, "single"))[-1]
    assert "Verdict: not solved" in verdict and warning in verdict and details["warnings"] == [warning]
    board, verdict, energies = app.sudoku.api_solve(NO_SOLUTION, 2, "single")
    assert verdict.startswith("not solved: ") and verdict.endswith(f"; {warning}")
    assert energies["warnings"] == [warning] and app.sudoku.api_solve(EASY, 2, "single")[2]["warnings"] == []


def test_stop_replaces_the_solving_message(app: HyperSETApp):
    """The Stop button ends a streamed solve's "Solving..." verdict with a stopped message; a finished verdict
    stays."""
    demo = app.build()
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    on_stop = [f for f in demo.fns.values() if any(t[0] == by_id["stop-btn"]._id for t in f.targets)]
    assert any(f.cancels for f in on_stop)  # cancels the solve...
    stop = next(f for f in on_stop if f.fn is not None)  # ...and says so
    assert [b._id for b in stop.inputs] == [b._id for b in stop.outputs] == [by_id["verdict"]._id]
    updates = list(app.sudoku.solve(puzzle_to_grid(EASY), 2, "single"))
    assert "Stopped." in stop.fn(updates[0][2]) and "Verdict:" not in stop.fn(updates[0][2])
    assert not isinstance(stop.fn(updates[-1][2]), str)  # gr.skip(): the finished verdict stays


def test_api_solve_bad_input_logs_no_traceback(app: HyperSETApp):
    with pytest.raises(gr.Error, match="appears twice") as err:
        app.sudoku.api_solve("55" + "0" * 79, 2, "single")
    assert err.value.print_exception is False


# ---- reconstruction handlers ----------------------------------------------------------------------------------


def test_reconstruct_random_mask(app: HyperSETApp):
    editor = app.reconstruction.sample_editor(next(iter(app.reconstruction.samples)))
    original, masked, tok, recon, metrics, plot, note, details = app.reconstruction.reconstruct(
        editor, "random", 0.5, 3, 5, 6, 1.0)
    for img in (original, masked, tok, recon):
        assert img.shape == (256, 256, 3) and img.dtype == np.uint8
    assert np.isfinite(details["psnr"]) and np.isfinite(details["ssim"]) and "PSNR" in metrics
    assert details["masked_tokens"] == 32 and len(details["energy"]["attn"]) == 5
    assert len(details["step_sizes"]["alpha_negative"]) == 5 and "What the plot shows" in note
    assert plot.count("<polyline") == 3 and "last forward pass" in plot  # the total and its parts
    again = app.reconstruction.reconstruct(editor, "random", 0.5, 3, 5, 6, 1.0)  # seeded: the same result
    assert np.array_equal(again[3], recon)


def _token_blocks(mask: torch.Tensor, side: int = 256) -> np.ndarray:
    """A token mask (g, g) -> (side, side, 3) bool over the displayed pixels."""
    scale = side // mask.shape[-1]
    return np.repeat(np.repeat(mask.numpy(), scale, 0), scale, 1)[..., None].repeat(3, 2)


def test_reconstruct_defaults_show_four_columns_the_ceiling_and_pasted_pixels(app: HyperSETApp):
    """The default run: the default sample, 40% random mask, paste-back on. The tokenizer column is
    decode(encode(x)) of the original; with paste-back every unmasked pixel is the original's, without it not."""
    from hyperset.vision.maskgit import mask_by_ratio

    assert DEFAULT_SAMPLE in app.reconstruction.samples
    editor = app.reconstruction.sample_editor(DEFAULT_SAMPLE)
    original, masked, tok, model, metrics, _, note, details = app.reconstruction.reconstruct(editor)
    assert details["masked_tokens"] == round(DEFAULT_MASK_RATIO * 64) and details["paste_back"] is True
    image = app.reconstruction._editor_image(editor)[0]
    tokenizer = app.mim.tokenizer
    assert np.array_equal(tok, to_display(tokenizer.decode(tokenizer.encode(image))))
    assert np.array_equal(original, to_display(image))
    mask = mask_by_ratio((1, 8, 8), DEFAULT_MASK_RATIO, generator=torch.Generator().manual_seed(0))[0]
    shown = _token_blocks(mask)
    assert np.array_equal(model[~shown], original[~shown])  # unmasked pixels: exactly the original's
    assert not np.array_equal(model[shown], original[shown])  # the masked ones are the model's
    raw = app.reconstruction.reconstruct(editor, paste_back=False)[3]
    assert np.array_equal(raw[shown], model[shown])  # the same decoding either way
    assert not np.array_equal(raw[~shown], original[~shown])  # the tokenizer's pixels, not the original's
    assert "pasted back" in metrics and "tokenizer only" in metrics and "E_ATTN" in note


def test_reconstruct_decoding_choice(app: HyperSETApp):
    """Decoding "expected" (the default) is the pipeline's decode="expected" (the expected code embedding) and says
    so; "maskgit" samples; anything else is a message."""
    from hyperset.vision.maskgit import mask_by_ratio

    editor = app.reconstruction.sample_editor(DEFAULT_SAMPLE)
    out = app.reconstruction.reconstruct(editor, "random", 0.5, 3, 5, 6, 1.0, False, "expected")
    details, metrics, note = out[7], out[4], out[6]
    assert details["decoding"] == "expected" and details["steps"] == 1 and len(details["energy"]["attn"]) == 5
    assert "expected code embedding (one forward pass)" in metrics and "only forward pass" in note
    image = app.reconstruction._editor_image(editor)[0]
    mask = mask_by_ratio((1, 8, 8), 0.5, generator=torch.Generator().manual_seed(3))
    direct = app.mim.reconstruct(image, mask, iters=5, decode="expected")
    assert np.array_equal(out[3], to_display(direct.images))  # raw output: the pipeline's expected decode
    assert app.reconstruction.reconstruct(editor, "random", 0.5, 3, 5, 6, 1.0, False)[7]["decoding"] == "expected"
    sampled = app.reconstruction.reconstruct(editor, "random", 0.5, 3, 5, 6, 1.0, False, "maskgit")
    assert sampled[7]["decoding"] == "maskgit" and sampled[7]["steps"] == 6 and "MaskGIT sampling" in sampled[4]
    assert "at the last decoding step" in sampled[6]
    assert "decoding must be 'maskgit' or 'expected'" in app.reconstruction.reconstruct(editor, decoding="mean")[4]


def test_mim_training_note_reads_what_the_config_records():
    info = {"steps": 1000, "device": "cpu (1 threads)", "train": {"steps": 8000, "batch_size": 64},
            "data": {"train_images": 48000, "source": "cifar10 train (data/cifar10)",
                     "eval": {"images": 128, "steps": 24}},
            "metrics": {"val/psnr@40": 17.2643, "val/tokenizer_psnr": 25.3576, "val/token_acc@40": 0.04}}
    note = mim_training_note(info, 214_432, 12)
    for words in ("0.21 M parameters", "trained depth 12", "1,000 steps of 64 images", "64,000 images seen",
                  "1.3 epochs of 48,000 cifar10 train images", "step 1,000 of the 8,000", "on cpu (1 threads)",
                  "17.26 dB** with 40% of the tokens masked", "tokenizer alone 25.36 dB", "128 validation images",
                  "24 decoding steps"):
        assert words in note, (words, note)
    finished = mim_training_note({**info, "steps": 8000, "metrics": {}})
    assert "early snapshot" not in finished and "No measured PSNR recorded" in finished
    assert "no training budget recorded" in mim_training_note({}) and "No measured" in mim_training_note(None)
    runs = mim_training_note({**info, "budget": "10,000 steps over two runs",
                              "metrics": {"val/psnr@40_iters24": 18.26},
                              "evaluation": {"images": 1000, "split": "CIFAR-10 test", "mask_ratio": 0.4,
                                             "by_iterations": {"12": {"psnr": 19.388}, "24": {"psnr": 19.41}}}})
    for words in ("10,000 steps over two runs", "18.26 dB** with 40% of the tokens masked at 24 iterations",
                  "1,000 CIFAR-10 test images, 40% of the tokens masked", "19.39 / 19.41 dB at 12 / 24 iterations"):
        assert words in runs, (words, runs)
    assert "1,000 steps of 64" not in runs
    both = mim_training_note({**info, "evaluation": {"images": 1000, "by_iterations": {"12": {"psnr": 19.388}},
                                                     "expected_by_iterations": {"12": {"psnr": 20.876}}}})
    assert "19.39 dB at 12 iterations with MaskGIT sampling, 20.88 dB at 12 with the expected embedding." in both
    expected = mim_training_note({**info, "data": {**info["data"], "eval": {"images": 128, "steps": 24,
                                                                         "decode": "expected"}}})
    assert "128 validation images, expected code embedding" in expected and "decoding steps" not in expected
    odd = mim_training_note({"steps": "many", "train": [], "data": None, "metrics": {"val/psnr@40": None}})
    assert "no training budget recorded" in odd and "No measured PSNR" in odd


def test_mim_training_note_of_the_shipped_model_reads_its_config():
    path = default_model_dir() / "config.json"
    if not path.is_file():
        pytest.skip("no shipped token model")
    info = json.loads(path.read_text())
    note = mim_training_note(info)
    assert (info["budget"] if isinstance(info.get("budget"), str) else f"{info['steps']:,} steps") in note
    for scores in (info.get("evaluation") or {}).get("by_iterations", {}).values():
        assert f"{scores['psnr']:.2f}" in note
    psnr = {k: v for k, v in info.get("metrics", {}).items() if k.split("/")[-1].startswith("psnr")}
    assert all(f"{v:.2f} dB" in note for v in psnr.values())


def test_energy_note_states_what_the_values_show():
    rising = energy_note({"attn": [10.0, 11.0, 12.0], "ff": [-1.0, -1.5, -2.0]},
                         {"alpha_negative": [0.3, 0.2, 0.25], "gamma_negative": [0.3, 0.3, 0.3],
                          "attn_step": [5.0, 1.0, 1.0], "attn_step_abs": [-5.0, -2.0, -1.0]})
    assert "E_ATTN rose from 10 (iteration 1) to 12 (iteration 3)" in rising and "25% of the α entries" in rising
    assert "rose at 2 of 2 iterations" in rising and "+7 in all" in rising and "-8 in all" in rising
    assert "the rise comes from the negative α" in rising
    falling = energy_note({"attn": [12.0, 11.0], "ff": [-1.0, -1.5]}, {})
    assert "E_ATTN fell" in falling and "never rose" in falling and "negative α" not in falling
    assert "no energy" in energy_note({})
    assert "step-length control" not in falling
    controlled = energy_note({"attn": [12.0, 11.0], "ff": [-1.0, -1.5]}, {}, "expected", halvings=2)
    assert "halved (up to 2 times) until E_ATTN + E_FF does not rise" in controlled and "never rose" in controlled


def test_reconstruct_drawn_mask_and_upload(app: HyperSETApp, tmp_path: Path):
    path = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (60, 90, 3), dtype=np.uint8)).save(path)
    editor, message = app.reconstruction.upload_image(str(path))
    assert editor["background"].shape == (256, 256, 3) and "32x32" in message
    layer = np.zeros((256, 256, 4), np.uint8)
    layer[:64, :96, 3] = 255  # two token rows x three token columns
    out = app.reconstruction.reconstruct(dict(editor, layers=[layer]), "drawn", 0.5, 0, 2, 4, 0.0)
    assert out[3].shape == (256, 256, 3) and out[7]["masked_tokens"] == 6
    assert "paint over" in app.reconstruction.reconstruct(editor, "drawn")[4]  # nothing painted


def test_reconstruct_bad_input_is_a_message(app: HyperSETApp, tmp_path: Path):
    assert "choose a sample" in app.reconstruction.reconstruct(None, "random")[4]
    editor = app.reconstruction.sample_editor(next(iter(app.reconstruction.samples)))
    limit = app.reconstruction.max_iters
    rec = app.reconstruction.reconstruct
    assert f"iterations = 999: the app runs at most {limit}" in rec(editor, "random", 0.5, 0, 999)[4]
    assert "iterations = 1.5: expected an integer" in app.reconstruction.reconstruct(editor, "random", 0.5, 0, 1.5)[4]
    assert "decoding steps must be a whole number" in rec(editor, "random", 0.5, 0, 2, 2.5)[4]
    bad = tmp_path / "not-an-image.png"
    bad.write_bytes(b"hello")
    assert "could not read" in app.reconstruction.upload_image(str(bad))[1]


# ---- the launched app -----------------------------------------------------------------------------------------


SOLVERS: dict[int, Solver] = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(app: HyperSETApp):
    gradio_client = pytest.importorskip("gradio_client")
    from hyperset.apps.app import launch_kwargs

    demo = app.build()
    SOLVERS[id(demo)] = app.solver
    # with the app's middleware, which sees the client listen (a solve nobody listens to stops after a grace)
    demo.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True,
                **launch_kwargs())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            client = gradio_client.Client(demo.local_url, verbose=False, analytics_enabled=False)
        yield demo, client
    finally:
        demo.close()


@pytest.mark.slow
def test_client_solve_above_trained_depth(served):
    demo, client = served
    grid, board, message = client.predict(EASY, api_name="/load_puzzle")
    assert "givens" in message
    iters = 2 * TRAINED + 1
    job = client.submit(grid, iters, "single", api_name="/solve_stream")
    updates = list(job)
    board, plot, verdict, details = job.result()
    assert len(updates) >= 2  # streamed, not only the final state
    assert "Verdict:" in verdict and len(details["prediction"]) == 81 and "0" not in details["prediction"]
    assert len(details["energy"]["attn"]) == iters and len(details["energy"]["ff"]) == iters


def test_client_bad_input_and_reconstruction(served):
    demo, client = served
    bad = {"headers": [str(i) for i in range(9)], "data": [["7", "7"] + [""] * 7] + [[""] * 9] * 8}
    board, plot, verdict, details = client.predict(bad, 3, "single", api_name="/solve_stream")
    assert "appears twice" in verdict and "error" in details
    # the reconstruction endpoint takes the editor value: background + layers + composite files
    from gradio_client import handle_file

    editor = client.predict("coffee", api_name="/sample")
    value = {"background": handle_file(editor["background"]), "layers": [],
             "composite": handle_file(editor["composite"])}
    original, masked, tok, recon, metrics, plot, note, details = client.predict(value, "random", 0.5, 1, 4, 8, 1.0,
                                                                                True, api_name="/reconstruct")
    with Image.open(recon) as im:
        assert im.size == (256, 256)
    assert np.isfinite(details["psnr"]) and "PSNR" in metrics and details["decoding"] == "expected"  # the default
    *_, details = client.predict(value, "random", 0.5, 1, 4, 8, 1.0, True, "maskgit", api_name="/reconstruct")
    assert details["decoding"] == "maskgit" and np.isfinite(details["psnr"])
    radio = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "mim-decoding")
    assert radio.value == "expected" and [c[1] for c in radio.choices] == ["maskgit", "expected"]


def test_client_solve_api_takes_and_returns_plain_values(served):
    demo, client = served
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/solve"]
    assert [p["parameter_name"] for p in api["parameters"]] == ["puzzle_text", "iterations", "strategy"]
    assert [r["label"] for r in api["returns"]] == ["board", "verdict", "energies"]
    board, verdict, energies = client.predict(EASY, 2, "commit", api_name="/solve")
    ref = demo_solver(demo).solve([EASY], iters=2, strategy="commit")[0]
    assert board == ref.prediction and verdict == ("solved" if ref.valid else f"not solved: {ref.reason}")
    assert len(energies["attn"]) == len(energies["ff"]) == energies["iterations"] == ref.iterations
    assert energies["pass_lengths"] == [2] * ref.passes
    np.testing.assert_allclose(energies["attn"], ref.energy["attn"], rtol=1e-6)
    with pytest.raises(Exception, match="appears twice"):
        client.predict("55" + "0" * 79, 2, "single", api_name="/solve")


def test_every_api_output_is_named_after_what_it_holds(served):
    """/gradio_api/info names each output of each endpoint (Gradio names one without a label value_<id>)."""
    demo, _ = served
    info = json.loads(urllib.request.urlopen(f"{demo.local_url}gradio_api/info", timeout=30).read())
    returns = {name: [r["label"] for r in ep["returns"]] for name, ep in info["named_endpoints"].items()}
    assert returns["/solve"] == ["board", "verdict", "energies"]
    assert returns["/solve_stream"] == ["board_html", "energy_plot", "verdict", "details"]
    assert returns["/load_puzzle"] == ["grid", "board_html", "verdict"]
    assert returns["/reconstruct"][4:] == ["metrics", "energy_plot", "energy_note", "details"]
    unnamed = [(api, label) for api, labels in returns.items() for label in labels if re.fullmatch(r"value_\d+", label)]
    assert not unnamed and not info["unnamed_endpoints"]


@pytest.mark.slow
def test_client_values_gradio_cannot_convert_get_the_apps_message(served, tmp_path: Path):
    """An API client's infinite, NaN or text iteration count, a null grid, an image whose body does not decode,
    an empty puzzle and a mistake after the first puzzle: each answer says what is wrong (Gradio's own
    conversion used to fail before the app's checks, and the client saw an empty error)."""
    demo, client = served
    for iterations in ("abc", True, [16]):
        with pytest.raises(Exception, match="expected an integer number of iterations"):
            client.predict(EASY, iterations, "single", api_name="/solve")
    for iterations in ("Infinity", "NaN", "1e400"):  # JSON that Python reads, which gradio_client does not send
        body = json.dumps({"data": [EASY, "ITERS", "single"]}).replace('"ITERS"', iterations).encode()
        post = urllib.request.Request(f"{demo.local_url}gradio_api/call/solve", data=body,
                                      headers={"Content-Type": "application/json"})
        event = json.loads(urllib.request.urlopen(post, timeout=30).read())["event_id"]
        answer = urllib.request.urlopen(f"{demo.local_url}gradio_api/call/solve/{event}", timeout=60).read().decode()
        assert "event: error" in answer and "expected an integer number of iterations" in answer, answer
    *_, verdict, details = client.predict(None, 3, "single", api_name="/solve_stream")
    assert "enter a puzzle in the grid" in verdict and "error" in details
    with pytest.raises(Exception, match="the puzzle is empty"):
        client.predict("0" * 81, 2, "single", api_name="/solve")
    _, _, message = client.predict("0" * 81, api_name="/load_puzzle")
    assert "the puzzle is empty" in message
    first = client.predict(EASY + "\n" + "1" * 81, 2, "single", api_name="/solve")  # the first puzzle is solved
    assert first == client.predict(EASY, 2, "single", api_name="/solve")
    from gradio_client import handle_file

    editor = client.predict("coffee", api_name="/sample")
    png = Path(editor["background"]).read_bytes()
    (tmp_path / "cut.png").write_bytes(png[: len(png) // 3])
    value = {"background": handle_file(str(tmp_path / "cut.png")), "layers": [], "composite": None}
    with pytest.raises(Exception, match="could not read the file as an image"):
        client.predict(value, "random", 0.5, 1, 4, 8, 1.0, True, api_name="/reconstruct")


def _raw_call(url: str, api: str, data: list) -> tuple[str, object]:
    """POST an API call as a program other than gradio_client would, and read its event stream: (last event name,
    its data)."""
    post = urllib.request.Request(f"{url}gradio_api/call/{api}", data=json.dumps({"data": data}).encode(),
                                  headers={"Content-Type": "application/json"})
    event = json.loads(urllib.request.urlopen(post, timeout=30).read())["event_id"]
    answer = urllib.request.urlopen(f"{url}gradio_api/call/{api}/{event}", timeout=120).read().decode()
    events = [line.split(": ", 1)[1] for line in answer.splitlines() if line.startswith("event: ")]
    payloads = [line.split(": ", 1)[1] for line in answer.splitlines() if line.startswith("data: ")]
    return events[-1], json.loads(payloads[-1])


def test_client_plain_grids_text_settings_and_left_out_arguments(served):
    """A grid sent as a plain list of rows is solved, a grid of another kind and a text mask ratio or seed get the
    app's message, and /solve with the puzzle alone runs with the default iterations and strategy (each of these
    was Gradio's empty error)."""
    demo, client = served
    event, (_, _, verdict, details) = _raw_call(demo.local_url, "solve_stream", [puzzle_to_grid(EASY), 2, "single"])
    assert event == "complete" and details["iterations"] == 2 and details["puzzle"] == EASY
    event, (_, _, verdict, details) = _raw_call(demo.local_url, "solve_stream", ["no grid", 2, "single"])
    assert event == "complete" and "the grid must be 81 cells" in verdict and "error" in details
    event, (board, verdict, energies) = _raw_call(demo.local_url, "solve", [EASY])
    ref = demo_solver(demo).solve([EASY])[0]  # the solver's default depth and strategy
    assert event == "complete" and board == ref.prediction and energies["iterations"] == ref.iterations
    event, data = _raw_call(demo.local_url, "solve", [])  # nothing at all: the app's message, not an empty error
    assert event == "error" and "puzzle" in str(data).lower(), (event, data)
    from gradio_client import handle_file

    editor = client.predict("coffee", api_name="/sample")
    value = {"background": handle_file(editor["background"]), "layers": [],
             "composite": handle_file(editor["composite"])}
    for args, words in ((("abc", 1, 4), "mask ratio must be a number"), ((0.5, "x", 4), "seed must be a whole"),
                        ((0.5, 1, "many"), "iterations = 'many': expected an integer number of iterations")):
        *_, metrics, _, _, details = client.predict(value, "random", *args, 8, 1.0, True, api_name="/reconstruct")
        assert words in metrics and "error" in details


def demo_solver(demo):
    return SOLVERS[id(demo)]


def test_build_demo_without_models():
    demo = build_demo(None, None, "no sudoku here", "no mim here")
    assert demo is not None


# ---- command line and the ONNX backend ------------------------------------------------------------------------


def test_cli_defaults_and_argument_errors(capsys, tmp_path: Path):
    from click.testing import CliRunner

    from hyperset.apps.cli import cli, main, options

    args = options([])
    assert args.host == "127.0.0.1" and not args.share and args.backend == "torch" and args.port is None
    assert args.device == "auto" and args.threads is None
    assert main(["--port", "70000"]) == 2
    assert main(["--checkpoint", str(tmp_path / "missing")]) == 2
    assert main(["--checkpoint", str(tmp_path)]) == 2  # a folder without a checkpoint
    assert main(["--threads", "0"]) == 2
    assert main(["--backend", "tensorrt"]) == 2  # click's choice check
    err = capsys.readouterr().err
    assert "--threads: threads must be at least 1" in err
    assert "--port must be" in err and "no such file or folder" in err and "cannot load the Sudoku checkpoint" in err
    version = CliRunner().invoke(cli, ["--version"])
    assert version.exit_code == 0 and version.stdout.startswith("hyperset-app ")
    assert "--device" in CliRunner().invoke(cli, ["--help"]).stdout
    assert "hyperset-app: error: Invalid value for '--backend': 'tensorrt' is not one of" in err  # one line


def test_the_app_without_gradio_names_the_extra(capsys, monkeypatch: pytest.MonkeyPatch):
    import importlib.util

    from hyperset.apps.cli import main

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gradio" else find_spec(name, *a))
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hyperset-app: error: hyperset-app needs gradio (the 'app' extra") and "Traceback" not in err
    assert "pip install 'hyperset[app]'" in err


def test_onnx_backend_frames_come_from_onnxruntime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("onnxruntime")
    from hyperset.apps.cli import load_models, options

    monkeypatch.setenv("HYPERSET_CACHE_DIR", str(tmp_path / "cache"))
    torch_solver = tiny_solver(tmp_path / "sudoku")
    args = options(["--checkpoint", str(tmp_path / "sudoku"), "--backend", "onnx", "--device", "cpu",
                    "--mim-checkpoint", str(tmp_path / "sudoku")])  # not a token model: must fail
    with pytest.raises(SystemExit):
        load_models(args)
    args.mim_checkpoint = None
    solver, _, _, _ = load_models(args)
    assert solver.backend is not None and "onnxruntime" in solver.backend_name

    def no_torch(*a, **k):
        raise AssertionError("a frame came from the torch model")

    monkeypatch.setattr(solver.torch_backend, "iterate", no_torch)
    monkeypatch.setattr(solver.torch_backend, "run", no_torch)
    onnx_app, torch_app = HyperSETApp(solver, None), HyperSETApp(torch_solver, None)
    iters = 2 * TRAINED
    for strategy in ("single", "commit", "auto"):
        frames = list(onnx_app.sudoku._frames(EASY, iters, strategy))
        assert frames and all(f.source == "onnxruntime" for f in frames)
        reference = list(torch_app.sudoku._frames(EASY, iters, strategy))
        assert [(f.step, f.digits) for f in frames] == [(f.step, f.digits) for f in reference]
        for a, b in zip(frames[-1].passes, reference[-1].passes):
            np.testing.assert_allclose(a["attn"], b["attn"], rtol=1e-4)
            np.testing.assert_allclose(a["ff"], b["ff"], rtol=1e-4)
    updates = list(onnx_app.sudoku.solve(puzzle_to_grid(EASY), iters, "single"))
    details = updates[-1][3]
    assert len(updates) == iters and details["backend"]["frames"] == details["backend"]["final"] == "onnxruntime"
    assert len(details["energy"]["attn"]) == iters and "came from onnxruntime" in updates[-1][2]


def test_onnx_backend_leaves_the_device_to_onnx_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`--backend onnx --device cuda` was refused by torch's CUDA check on a CPU build of torch beside
    onnxruntime-gpu: ONNX Runtime now judges the device for the solver, and torch (the reconstruction tab) runs on
    the CPU, which the startup line says. A name neither takes is still refused."""
    pytest.importorskip("onnxruntime")
    import torch

    from hyperset.apps.cli import load_models, options
    from hyperset.exports import solver_backend

    monkeypatch.setenv("HYPERSET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    asked: list[str] = []
    monkeypatch.setattr(solver_backend, "_ort_device", lambda d: asked.append(str(d)) or "cpu")
    tiny_solver(tmp_path / "sudoku")
    args = options(["--checkpoint", str(tmp_path / "sudoku"), "--backend", "onnx", "--device", "cuda"])
    solver, _, _, _ = load_models(args)
    assert asked == ["cuda"] and "onnxruntime" in solver.backend_name
    assert args.torch_note.startswith(" (--device cuda: --device cuda was requested but PyTorch sees no CUDA")
    for argv in (["--backend", "torch", "--device", "cuda"], ["--backend", "onnx", "--device", "cuda:1"],
                 ["--backend", "onnx", "--device", "xpu"]):
        with pytest.raises(SystemExit):
            load_models(options(["--checkpoint", str(tmp_path / "sudoku"), *argv]))


def test_onnx_graph_without_step_graphs_is_refused_and_its_limits_are_messages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    """An unrolled graph without step graphs cannot give the app's frames: the app refuses it at start-up in one
    line (it started, and every streamed solve failed with an empty error); given to the app anyway, the settings
    it cannot run are messages, and /solve runs it at its own depth."""
    pytest.importorskip("onnxruntime")
    import hyperset.apps.sudoku_tab as app_module
    from hyperset.apps.cli import load_models, options
    from hyperset.exports.export import export_unrolled
    from hyperset.exports.solver_backend import create_backend

    monkeypatch.setenv("HYPERSET_CACHE_DIR", str(tmp_path / "cache"))
    solver = tiny_solver(tmp_path / "sudoku")
    path = tmp_path / "u.onnx"
    export_unrolled(solver.model, TRAINED, path, info=solver.info)
    args = options(["--checkpoint", str(tmp_path / "sudoku"), "--backend", "onnx", "--onnx-model", str(path),
                    "--device", "cpu", "--threads", "1"])
    with pytest.raises(SystemExit) as stop:
        load_models(args)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "needs the step graphs next to u.onnx" in err
    assert err.startswith("hyperset-app: error: cannot start the ONNX backend: ")
    onnx_app = HyperSETApp(solver.with_backend(create_backend(solver.model, info=solver.info, path=path,
                                                              device="cpu", threads=1)), None)
    for strategy in ("single", "auto"):
        updates = list(onnx_app.sudoku.solve(puzzle_to_grid(EASY), TRAINED, strategy))
        assert len(updates) == 1 and "step graphs" in updates[0][2] and "error" in updates[0][3]
    for iters, strategy, words in ((TRAINED + 1, "single", f"unrolled for {TRAINED} iterations"),
                                   (TRAINED, "auto", "step graphs")):
        with pytest.raises(gr.Error, match=words):
            onnx_app.sudoku.api_solve(EASY, iters, strategy)
    board, verdict, energies = onnx_app.sudoku.api_solve(EASY, TRAINED, "commit")  # whole passes at the graph's depth
    ref = solver.solve([EASY], iters=TRAINED, strategy="commit")[0]
    assert board == ref.prediction and energies["iterations"] == ref.iterations
    assert energies["pass_lengths"] == ref.pass_lengths
    np.testing.assert_allclose(energies["attn"], ref.energy["attn"], rtol=1e-4)
    assert "every frame comes from ONNX Runtime" in " ".join(app_module.__doc__.split())  # as docs/app.md says


@pytest.mark.slow
def test_the_app_does_not_report_usage_unless_asked() -> None:
    """Gradio's analytics made 8 connections at start-up; a local demo must not phone home by default."""
    import os
    import subprocess
    import sys

    code = ("import hyperset.apps.app, gradio.analytics as a, os; "
            "print(os.environ['GRADIO_ANALYTICS_ENABLED'], a.analytics_enabled())")
    env = {k: v for k, v in os.environ.items() if k != "GRADIO_ANALYTICS_ENABLED"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.split() == ["False", "False"]
    asked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**env, "GRADIO_ANALYTICS_ENABLED": "True"})
    assert asked.stdout.split()[0] == "True"
