"""The CPU's multiply-add peak, measured: the ceiling no matmul library can pass on this machine.

    python bench/fma_peak.py --threads 1      # prints the JSON; bench/onnx_bench.py records it beside its runners

bench/fma_peak.c holds loops of independent vector FMAs (AVX2 and AVX-512, fp32), of AVX-512 bf16 dot products
(vdpbf16ps) and of AMX bf16 tile products (tdpbf16ps), each bound by the execution units alone; each is run only
where /proc/cpuinfo reports its instruction set (and, for AMX, where Linux grants the process the tile data), on
`threads` threads at once (ctypes releases the GIL), best of `repeats` runs of about `seconds` each. The fp32 peak is
the best fp32 loop's GFLOP/s, the bf16 peak the best bf16 loop's (None where the CPU has no native bf16 product: then
nothing is faster than fp32 here, and the JSON says why). A measured peak, not a data-sheet one: turbo, the other
core's load and a virtual machine's scheduling are in it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import threading
import time
from pathlib import Path
from typing import Any

import bench_args
from flops import cpuinfo_fields

from hyperset.cbuild import BuildError, load

SOURCE = Path(__file__).resolve().parent / "fma_peak.c"
# function -> (what it computes, /proc/cpuinfo flags it needs, FLOPs per accumulator per round, the C function that
# gives the accumulators)
LOOPS = {"fma_fp32_avx2": ("fp32", ("avx2", "fma"), 16, "accumulators"),
         "fma_fp32_avx512": ("fp32", ("avx512f",), 32, "accumulators"),
         "dot_bf16_avx512": ("bf16", ("avx512f", "avx512_bf16"), 64, "accumulators"),
         "amx_bf16": ("bf16", ("amx_tile", "amx_bf16"), 16 * 16 * 32 * 2, "amx_tiles")}


def cpu_flags() -> set[str]:
    """The first processor's /proc/cpuinfo flags (empty where there is no such file)."""
    try:
        return set(cpuinfo_fields(Path("/proc/cpuinfo").read_text()).get("flags", "").split())
    except OSError:
        return set()


def _library() -> ctypes.CDLL:
    lib = load(SOURCE, ("-O3", "-shared", "-fPIC"))
    for name in LOOPS:
        if hasattr(lib, name):
            getattr(lib, name).argtypes, getattr(lib, name).restype = [ctypes.c_int64], ctypes.c_double
    return lib


def _rate(fn: Any, flops_per_round: int, threads: int, seconds: float, repeats: int) -> float:
    """FLOP/s of `fn` on `threads` threads at once: rounds calibrated to take about `seconds`, best of `repeats`."""
    rounds = 1 << 16
    while True:  # calibrate on one thread
        t0 = time.perf_counter()
        fn(rounds)
        took = time.perf_counter() - t0
        if took >= seconds / 4 or rounds >= 1 << 40:
            break
        rounds *= 4
    rounds = max(1, int(rounds * seconds / max(took, 1e-9)))
    best = 0.0
    for _ in range(repeats):
        workers = [threading.Thread(target=fn, args=(rounds,)) for _ in range(threads)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = max(best, threads * rounds * flops_per_round / (time.perf_counter() - t0))
    return best


def measure(threads: int = 1, seconds: float = 0.2, repeats: int = 3) -> dict[str, Any]:
    """{"fp32_gflops", "bf16_gflops", "loops": {name: GFLOP/s or why not}, "threads"} for this CPU."""
    flags = cpu_flags()
    try:
        lib = _library()
    except BuildError as e:
        return {"threads": threads, "fp32_gflops": None, "bf16_gflops": None, "loops": {}, "error": str(e)}
    loops: dict[str, Any] = {}
    for name, (_, needs, per_acc, count) in LOOPS.items():
        missing = [f for f in needs if f not in flags]
        acc = getattr(lib, count)()
        if missing:
            loops[name] = f"not run: the CPU does not report {', '.join(missing)}"
            continue
        if acc == 0:
            loops[name] = "not run: not built here (needs x86-64, and for AMX Linux with GCC 11 or clang 12 on)"
            continue
        if name == "amx_bf16" and not lib.amx_permitted():
            loops[name] = "not run: Linux did not grant this process AMX's tile data (arch_prctl)"
            continue
        loops[name] = _rate(getattr(lib, name), acc * per_acc, threads, seconds, repeats) / 1e9
    best = {kind: max((v for n, v in loops.items() if LOOPS[n][0] == kind and isinstance(v, float)), default=None)
            for kind in ("fp32", "bf16")}
    out = {"threads": threads, "fp32_gflops": best["fp32"], "bf16_gflops": best["bf16"], "loops": loops,
           "method": "independent vector FMA (fp32), vdpbf16ps and AMX tdpbf16ps (bf16) loops, bench/fma_peak.c"}
    if best["bf16"] is None:
        out["bf16_note"] = ("no native bf16 product on this CPU (avx512_bf16, amx_bf16): bf16 runs no faster than "
                            "fp32")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=bench_args.count, default=1)
    ap.add_argument("--seconds", type=float, default=0.2, help="length of each timed run")
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.threads, args.seconds), indent=1))


if __name__ == "__main__":
    main()
