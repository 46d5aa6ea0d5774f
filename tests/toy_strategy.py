"""A strategy as a user writes one: this file and one registry entry (tests/test_strategy_registry.py adds it).

One pass of twice the asked iterations, written on the parts of hyperset.strategies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hyperset.strategies import SolveFrame, single

ENTRY = ("twice", "one pass of twice the asked iterations (the tests' toy strategy)", "toy_strategy:run")


def run(backend: Any, boards: Any, settings: Any) -> Iterator[SolveFrame]:
    return single(backend, boards, 2 * settings.iters, settings.per_iteration)
