"""One batch order and one epoch-to-step rule for every task (hyperset.training.epochs)."""

import numpy as np
import pytest

from hyperset.training.epochs import epoch_indices, epochs_to_steps, steps_for


def test_batches_are_seeded_epoch_permutations_laid_end_to_end():
    n, b = 10, 4
    stream = np.concatenate([epoch_indices(s, b, n, seed=3) for s in range(5)])  # 20 indices: two epochs
    for e in range(2):
        assert stream[e * n:(e + 1) * n].tolist() == np.random.default_rng([3, e]).permutation(n).tolist()
    assert epoch_indices(2, b, n, seed=3).tolist() == stream[8:12].tolist()  # straddles epochs 0 and 1
    assert epoch_indices(2, b, n, seed=3).dtype == np.int64
    assert epoch_indices(2, b, n, seed=4).tolist() != stream[8:12].tolist()
    assert len(epoch_indices(0, 25, n, seed=0)) == 25  # a batch larger than the data spans several epochs


def test_every_task_draws_its_batches_from_the_one_function():
    import hyperset.training.task as task
    from hyperset.training.classify_task import ClassifyTask
    from hyperset.training.mim_task import TokenizerTask, TokensTask
    from hyperset.training.sudoku_task import SudokuTask

    assert task.epoch_indices is epoch_indices
    for cls in (SudokuTask, ClassifyTask, TokenizerTask, TokensTask):
        assert cls.batch_indices is task.Task.batch_indices, cls


def test_epoch_counts_round_up_exactly():
    assert steps_for(0.1, 1280, 128) == 1  # exact: 0.1 is read as 1/10, not as the float above it
    assert steps_for(1, 45_000, 128) == 352
    assert steps_for(200, 45_000, 128) == 70_313  # 200 passes over 45k images, not 200 x 352
    train = {"epochs": 2, "batch_size": 10}
    assert epochs_to_steps(train, 25) == (2, 3)
    assert train == {"steps": 5, "eval_every": 3, "batch_size": 10}
    with pytest.raises(ValueError, match="both train.steps and train.epochs"):
        epochs_to_steps({"epochs": 1, "steps": 5}, 100)
    with pytest.raises(ValueError, match="both train.warmup_steps and train.warmup_epochs"):
        epochs_to_steps({"warmup_epochs": 1, "warmup_steps": 5}, 100)
    with pytest.raises(ValueError, match="expected a number"):
        epochs_to_steps({"epochs": "x"}, 100)
    untouched = {"steps": 7, "batch_size": 3}
    assert epochs_to_steps(untouched, 100) == (None, 34) and untouched == {"steps": 7, "batch_size": 3}


def test_a_set_length_in_steps_replaces_the_recipes_length_in_epochs_and_the_other_way_round():
    """The paper recipes are given in epochs; --set train.steps / warmup_steps / eval_every overrides them (and
    --set train.epochs a recipe in steps), as any recipe value can be."""
    from hyperset.training.recipes import apply_overrides, load_recipe

    _, recipe = load_recipe("cifar100-paper")
    assert {"epochs", "warmup_epochs", "eval_every_epochs"} <= set(recipe["train"])
    apply_overrides(recipe, ["train.steps=50", "train.warmup_steps=0", "train.eval_every=20"])
    train = recipe["train"]
    assert not {"epochs", "warmup_epochs", "eval_every_epochs"} & set(train)
    assert epochs_to_steps(train, 1000)[0] is None
    assert (train["steps"], train["warmup_steps"], train["eval_every"]) == (50, 0, 20)
    # a length in steps alone keeps the recipe's evaluation once an epoch
    train = apply_overrides({"train": {"epochs": 3, "batch_size": 10}}, ["train.steps=7"])["train"]
    assert epochs_to_steps(train, 100) == (None, 10) and train == {"steps": 7, "batch_size": 10, "eval_every": 10}
    train = apply_overrides({"train": {"steps": 9, "batch_size": 10}}, ["train.epochs=2"])["train"]
    assert epochs_to_steps(train, 100) == (2, 10) and train["steps"] == 20
