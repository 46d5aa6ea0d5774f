"""The Python API checks what it is given: a wrong type, shape, value or count is a TypeError or ValueError that
names the argument, raised before any work, never a torch error from deep inside or a silently wrong result."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hyperset
from hyperset.solve import Solver
from hyperset.sudoku.board import PuzzleError

EASY = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"


@pytest.fixture(scope="module")
def sudoku() -> hyperset.HyperSETModel:
    return hyperset.create_model("sudoku-cpu", dim=16, heads=2, ff_hidden=16, time_dim=16, iters=2).eval()


@pytest.mark.parametrize("make, error, message", [
    (lambda b: b.float(), TypeError,
     r"inputs: expected integer token ids \(torch.long or another integer dtype\), got torch.float32"),
    (lambda b: b.bool(), TypeError, "got torch.bool"),
    (lambda b: b[:, :80], ValueError, r"inputs: expected shape \(batch >= 1, 81\), got \(1, 80\)"),
    (lambda b: b.view(1, 9, 9), ValueError, r"got \(1, 9, 9\) \(a board is 81 cells in one row"),
    (lambda b: b[0], ValueError, r"got \(81,\)"),
    (lambda b: b[:0], ValueError, r"got \(0, 81\)"),
    (lambda b: b + 10, ValueError, "token ids must be in 0..9, got values from 10 to 10"),
    (lambda b: b - 1, ValueError, "got values from -1 to -1"),
    (lambda b: b.numpy(), TypeError, "inputs must be a torch.Tensor, got numpy.ndarray"),
])
def test_model_inputs_are_checked(sudoku, make, error, message: str) -> None:
    boards = torch.zeros(1, 81, dtype=torch.long)
    with torch.no_grad():
        for call in (lambda x: sudoku(x), lambda x: sudoku.run(x), lambda x: next(sudoku.frames(x))):
            with pytest.raises(error, match=message):
                call(make(boards))


@pytest.mark.parametrize("iters, error, message", [
    (1.9, TypeError, "iters must be a whole number of iterations, got 1.9"),
    ("4", TypeError, "got '4'"),
    (True, TypeError, "got True"),
    (-1, ValueError, "must be >= 0"),
    (10_001, ValueError, "at most 10,000 iterations per layer"),
])
def test_model_iterations_are_whole_numbers_in_range(sudoku, iters, error, message: str) -> None:
    boards = torch.zeros(1, 81, dtype=torch.long)
    with torch.no_grad(), pytest.raises(error, match=message):
        sudoku.run(boards, iters=iters)
    with torch.no_grad():  # integers of every kind run; 0 is the stem through the head
        logits = [sudoku(boards, iters=n) for n in (3, np.int64(3), torch.tensor(3))]
        assert torch.equal(logits[0], logits[1]) and torch.equal(logits[0], logits[2])
        assert torch.equal(sudoku(boards, iters=0), sudoku.readout(sudoku.stem(boards)))
        assert sudoku(boards, iters=0, all_logits=True).shape == (0, 1, 81, 9)  # every iteration's: none
        assert sudoku(boards, iters=2, all_logits=True).shape == (2, 1, 81, 9)


def test_token_ids_of_any_integer_dtype_are_read_as_long(sudoku) -> None:
    # the board helpers (to_array, load_csv) give uint8 boards; the embedding wants int64
    from hyperset.sudoku.board import to_array
    from hyperset.sudoku.parse import parse_puzzles
    board = torch.from_numpy(to_array(parse_puzzles(EASY)[0].givens))[None]
    assert board.dtype == torch.uint8
    with torch.no_grad():
        for dtype in (torch.uint8, torch.int16, torch.int32):
            torch.testing.assert_close(sudoku(board.to(dtype)), sudoku(board.long()), rtol=0, atol=0)
            torch.testing.assert_close(sudoku.run(board.to(dtype)).logits, sudoku(board.long()), rtol=0, atol=0)


def test_models_under_vmap_over_boards_and_over_stacked_parameters() -> None:
    # the input value check and the step sizes' weight check read tensors back, which vmap cannot
    import copy

    from torch.func import functional_call, stack_module_state, vmap
    models = [hyperset.create_model("sudoku-cpu", dim=16, heads=2, ff_hidden=32, time_dim=8, iters=2).eval()
              for _ in range(2)]
    x = torch.randint(0, 10, (3, 81))
    with torch.no_grad():
        torch.testing.assert_close(vmap(lambda b: models[0](b[None])[0])(x), models[0](x))
        params, buffers = stack_module_state(models)
        base = copy.deepcopy(models[0]).to("meta")
        out = vmap(lambda p, b: functional_call(base, (p, b), (x,)))(params, buffers)
        torch.testing.assert_close(out, torch.stack([m(x) for m in models]))


def test_the_entry_points_say_what_they_take() -> None:
    import inspect
    for method in (hyperset.HyperSETModel.run, hyperset.HyperSETModel.frames, hyperset.HyperSETModel.forward):
        doc = inspect.getdoc(method) or ""
        for name in inspect.signature(method).parameters:
            if name != "self":
                assert name in doc, (method.__name__, name)


def test_a_classifier_takes_float_images_of_its_size() -> None:
    model = hyperset.create_model("cifar10-cpu", dim=16, heads=2, ff_hidden=16, time_dim=16, iters=1).eval()
    size = model.cfg.img_size
    with torch.no_grad():
        assert model(torch.zeros(2, 3, size, size)).shape == (2, model.cfg.num_classes)
        with pytest.raises(TypeError, match="expected float images, got torch.uint8"):
            model(torch.zeros(2, 3, size, size, dtype=torch.uint8))
        with pytest.raises(ValueError, match=rf"expected images of shape \(batch >= 1, 3, {size}, {size}\), got"):
            model(torch.zeros(2, size, size, 3))


@pytest.fixture(scope="module")
def solver(sudoku) -> Solver:
    return Solver(sudoku, torch.device("cpu"), {"trained_iterations": 2})


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(puzzles=[EASY[:80]]), PuzzleError, r"puzzles\[0\]:1: expected 81 cells, found 80"),
    (dict(puzzles=[EASY, "11" + "0" * 79]), PuzzleError, r"puzzles\[1\]:1: digit 1 appears twice in row 1"),
    (dict(puzzles=EASY), TypeError, "got one string"),
    (dict(puzzles=[list(EASY)]), TypeError, r"puzzles\[0\] must be a string of 81 cells, got list"),
    (dict(puzzles=[EASY], iters=1.7), ValueError, "iterations must be a whole number or 'auto', got 1.7"),
    (dict(puzzles=[EASY], iters=True), ValueError, "got True"),
    (dict(puzzles=[EASY], iters="3"), ValueError, "got '3'"),
    (dict(puzzles=[EASY], strategy="auto", patience=0), ValueError, "patience must be a whole number >= 1, got 0"),
    (dict(puzzles=[EASY], strategy="auto", max_iters=0), ValueError, "max_iters must be a whole number >= 1"),
    (dict(puzzles=[EASY], passes=0), ValueError, "passes must be a whole number >= 1, got 0"),
    (dict(puzzles=[EASY], batch_size=0), ValueError, "batch size must be a whole number >= 1, got 0"),
    (dict(puzzles=[EASY], solutions=[]), ValueError, "solutions: 0 given for 1 puzzles"),
    (dict(puzzles=[EASY], solutions=[SOLUTION[:80]]), ValueError, r"solutions\[0\]: expected 81 digits 1-9"),
])
def test_solver_arguments_are_checked(solver: Solver, kwargs: dict, error, message: str) -> None:
    with pytest.raises(error, match=message):
        solver.solve(**kwargs)


def test_solver_reads_puzzles_as_puzzle_files_are_read(solver: Solver) -> None:
    dotted = EASY.replace("0", ".")
    (a,), (b,) = solver.solve([dotted], iters=2), solver.solve([EASY], iters=2)
    assert a.puzzle == b.puzzle == EASY and a.prediction == b.prediction
    assert solver.solve([]) == []
    with pytest.raises(ValueError, match="puzzles: none given"):
        solver.frames([])


def test_load_pretrained_on_a_device_it_cannot_have_is_a_value_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="PyTorch sees no CUDA device"):
        hyperset.load_pretrained("sudoku", "cuda")
    assert next(hyperset.load_pretrained("sudoku", "cpu").parameters()).device.type == "cpu"


@pytest.mark.parametrize("kwargs, message", [
    (dict(steps=1.5), "train.steps = 1.5: expected int"),
    (dict(steps="10"), "train.steps = '10': expected int"),
    (dict(compile="no"), "train.compile = 'no': expected bool"),
    (dict(clip=-1.0), "train.clip = -1.0: must be a finite number >= 0"),
    (dict(clip=float("nan")), "train.clip = nan"),
    (dict(seed=-1), "train.seed = -1: must be >= 0"),
    (dict(batch_size=4, accum_steps=3), "train.accum_steps = 3: must divide train.batch_size = 4"),
])
def test_train_config_checks_types_and_values_when_made_in_python(kwargs: dict, message: str) -> None:
    from hyperset.training.trainer import TrainConfig

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        TrainConfig(**kwargs)


def test_trainer_arguments_and_recipes_from_python(tmp_path) -> None:
    from pathlib import Path

    from hyperset.training.recipes import load_recipe
    from hyperset.training.trainer import TrainConfig, Trainer

    cfg = TrainConfig()
    assert isinstance(Trainer(None, cfg, str(tmp_path / "run")).out, Path)  # a str names the folder too
    for kwargs, error, message in ((dict(cfg={}), TypeError, "cfg must be a TrainConfig"),
                                   (dict(cfg=cfg, resume="no"), TypeError, "resume must be True or False"),
                                   (dict(cfg=cfg, plan="0:10"), ValueError, "plan: a schedule is a non-empty list"),
                                   (dict(cfg=cfg, plan=[{"x": 1}]), ValueError, "integer from_step and steps")):
        with pytest.raises(error, match=message):
            Trainer(None, out=tmp_path / "run", **kwargs)
    (tmp_path / "mine.toml").write_text('task = "sudoku"\npreset = "sudoku-cpu"\n')
    assert load_recipe(tmp_path / "mine.toml") == ("mine", {"task": "sudoku", "preset": "sudoku-cpu"})
    with pytest.raises(TypeError, match="a recipe is a shipped name or a path"):
        load_recipe(None)


def test_masks_and_images_for_reconstruction_are_checked() -> None:
    from hyperset.vision.maskgit import mask_by_ratio, random_token_mask
    from hyperset.vision.reconstruct import load_mim

    for bad in (1.5, -0.5, float("nan"), "0.4"):
        with pytest.raises(ValueError, match="must be a number in"):
            mask_by_ratio((2, 8, 8), bad)
        with pytest.raises(ValueError, match="must be a number in"):
            random_token_mask((2, 8, 8), bad)
    assert int(mask_by_ratio((2, 8, 8), 0.25).sum()) == 32
    pipe = load_mim()
    s, g = pipe.image_size, pipe.grid
    images, mask = torch.rand(1, 3, s, s), torch.zeros(1, g, g, dtype=torch.bool)
    for bad, error, message in ((images * 255, ValueError, "finite values in"),
                                (images * float("nan"), ValueError, "finite values in"),
                                ((images * 255).to(torch.uint8), TypeError, "images / 255"),
                                (images.numpy(), TypeError, "float torch.Tensor"),
                                (images[:0], ValueError, r"\(B >= 1")):
        with pytest.raises(error, match=message):
            pipe.reconstruct(bad, mask, decode="expected")
    with pytest.raises(ValueError, match="hold only 0 and 1"):
        pipe.reconstruct(images, torch.full((1, g, g), 0.3), decode="expected")
    for key, value in (("iters", 2.7), ("iters", True), ("steps", 2.5)):
        with pytest.raises(ValueError, match=f"{key} must be a whole number"):
            pipe.reconstruct(images, mask, **{key: value})
    assert pipe.reconstruct(images.double(), mask.int(), decode="expected") is not None  # other floats, 0/1 ints
    with pytest.raises(ValueError, match="--device 'gpu'"):
        load_mim(device="gpu")


def test_onnx_export_and_session_arguments_are_checked(tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    from hyperset.exports import export as E
    from hyperset.exports.runtime import OnnxModelError, OrtSession

    model = hyperset.create_model("sudoku-cpu", dim=16, heads=2, ff_hidden=16, time_dim=16, iters=2).eval()
    for kwargs, error, message in ((dict(iters=1.9), ValueError, "iters = 1.9: expected an integer"),
                                   (dict(iters=True), ValueError, "iters = True"),
                                   (dict(iters=2, opset="17"), ValueError, "opset must be a whole number from 14"),
                                   (dict(iters=2, opset=5), ValueError, "opset must be a whole number from 14")):
        with pytest.raises(error, match=message):
            E.export_unrolled(model, path=tmp_path / "m.onnx", **kwargs)
    with pytest.raises(TypeError, match="model must be a HyperSETModel"):
        E.export_unrolled(torch.nn.Linear(2, 2), 2, tmp_path / "m.onnx")
    with pytest.raises(ValueError, match="default_iters = -3"):
        E.export_loop(model, tmp_path / "l.onnx", default_iters=-3)
    assert not list(tmp_path.iterdir())  # nothing written by a refused export
    E.export_unrolled(model, 2, tmp_path / "m.onnx")
    session = OrtSession(tmp_path / "m.onnx", "cpu", intra_op_threads=1)
    tokens = np.zeros((2, 81), np.int64)
    assert session.run({"tokens": tokens}, "logits")["logits"].shape == (2, 81, 9)  # one output by name
    for feed, message in ((tokens.astype(np.int32), "input 'tokens' must be int64, got int32"),
                          (tokens[:, :80], r"must have size 81 in dimension 1"),
                          (tokens[0], "must have 2 dimensions"),
                          (tokens[:0], "is empty")):
        with pytest.raises(ValueError, match=message):
            session.run({"tokens": feed})
    with pytest.raises(ValueError, match="unknown outputs"):
        session.run({"tokens": tokens}, ["logit"])
    classifier = hyperset.create_model("cifar10-cpu", dim=16, heads=2, ff_hidden=16, time_dim=16, iters=1).eval()
    with pytest.raises(OnnxModelError, match="is a 'sudoku' model, expected 'classify'"):
        E.parity(classifier, tmp_path / "m.onnx", 2)
