"""The seconds one call takes, timed as every matmul-rate measurement here times it; no torch, no numpy (a fresh
interpreter that times another library imports it before that library loads)."""

from __future__ import annotations

import time
from collections.abc import Callable


def seconds_per_call(call: Callable[[int], object], min_seconds: float = 0.02, repeats: int = 3,
                     at_least: int = 1) -> float:
    """Best of `repeats` runs of enough back-to-back calls to take `min_seconds` (a power of two times `at_least`),
    in seconds per call. `call(i)` gets the call's index (a caller going round copies of its operands picks one by
    it); the caller makes one warm-up call first."""
    calls = at_least
    while True:
        t0 = time.perf_counter()
        for i in range(calls):
            call(i)
        if time.perf_counter() - t0 >= min_seconds:
            break
        calls *= 2
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(calls):
            call(i)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best
