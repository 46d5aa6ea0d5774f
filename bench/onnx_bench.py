"""Sudoku boards/s: PyTorch vs ONNX Runtime (Loop graph, unrolled graph) on this CPU, against real ceilings.

Each runner is stated against two ceilings measured in the same run, at this thread count:

* the best library's: the boards/s the model's matmuls alone would allow (forward pass with the trace's energy
  matmuls, fp32, each iteration's head projections made once for the energy and the next step, as every runner
  makes them) if each product ran at the best rate any library here reaches at it, on the whole batch, in the
  slices of rows the runners take or in those sized by the widest intermediate (each product at its fastest; a
  runner's choice of rows cannot lower it): PyTorch's ATen or oneDNN, numpy's BLAS, ONNX
  Runtime's MatMul/Gemm, timed before and after the runs, the better kept (`share_of_best_library_ceiling`; the
  shapes' rates by library are in the JSON). A runner above it runs some product faster than any library call
  here (the attention maps' C kernel, fused operators) or the rates were timed under load: `above_ceiling` says so;
* the CPU's multiply-add peak (bench/fma_peak.py: independent vector FMA loops, fp32, and bf16 dot products and AMX
  tile products where the CPU has them): the runner's counted FLOP/s over it (`share_of_fp32_fma_peak`,
  `share_of_bf16_fma_peak`).

`share_of_roofline` is against PyTorch's own rates at the matmuls with the projections made twice per iteration
(once for the energy E_ATTN, once for the next attention step); `share_of_least_work_roofline` against its rates
at the least work, the projections made once for both (the torch path hands them on, hyperset.accel.reuse; the
Loop graph carries them, hyperset.exports.export._carries). The FLOPs per board count the least work. A large
square matmul is timed too, for reference. Runners:

    pytorch, ort_loop, ort_unrolled     as the library runs on a CPU: slices of a few boards whose activations
                                        stay in cache (hyperset.accel.rows: 12 Sudoku boards, 50 where the
                                        products' kernel keeps the update's wide intermediates inside it; each
                                        through all the iterations; the onnx solver backend's `rows`, 4 boards:
                                        ORT_SLICE_BYTES)
    *_whole_batch                       one call, every op on the whole batch
    pytorch_cpu_kernels_CHOICE          with --cpu-kernels CHOICE (auto, on, off): the sliced PyTorch runner with
                                        the attention maps' C kernel so (hyperset.accel.cpu_kernels), in the same
                                        rounds: what `auto`'s choice on this CPU is worth
    pytorch_cpu_gemm_CHOICE             with --cpu-gemm CHOICE: the same with the products' C kernel so
                                        (hyperset.accel.cpu_gemm; it runs only where the maps' kernel does)

    python bench/onnx_bench.py --threads 1      # full run: T and 4T iterations, batch 1 and the solver's CPU batch
    python bench/onnx_bench.py --quick          # a short run to check that everything works
    python bench/onnx_bench.py --threads 1 --batches 128 --cpu-kernels off   # the C kernel's worth here
    python bench/onnx_bench.py --threads 1 --batches 128 --cpu-gemm off      # the products' kernel's worth here

The model is the shipped one (`hyperset/weights/sudoku`) when present, else a randomly initialised `sudoku-cpu`
preset with iters=24 (speed does not depend on the weights); the JSON says which. All runners compute the same
thing: logits and both energies after every iteration (the solver's trace). Runners are interleaved within each
repeat so that load from other processes spreads over all of them; the machine is shared, so compare medians.
Writes bench/results/onnx_bench.json and bench/results/onnx_bench.png.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hyperset.accel import cpu_gemm, cpu_kernels
from hyperset.checkpoint import atomic_write_json
from hyperset.solve import CPU_BATCH_SIZE

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))  # bench/flops.py
RESULTS = ROOT / "results"

import bench_args  # noqa: E402
import fma_peak  # noqa: E402


def flops_per_board(cfg: Any, iters: int, energies: bool = True, shared_projections: bool = True) -> dict[str, Any]:
    """Multiply-add FLOPs (2 per MAC) of one board through a Hyper-SET model: the products of bench/flops.py's
    model of a forward pass (`flops.matmuls`, the one count the ceilings use), per iteration by component and once
    per pass.

    Per iteration: the attention step's X W and back-projection, its per-head scores and (P + P^T) Z, the
    feedforward's X D and ReLU(U) D^T, the step sizes where they depend on t (made once per pass where they do not:
    conditioned on x0 with a dead time network, as the model runs them), and with `energies` the trace's E_ATTN and
    E_FF after every update (X W, the scores, X D); with `shared_projections` the energy's X W is the next attention
    step's, made once per iteration (one more for the first step, once per pass). Once: the head and what is made
    once per pass. Not counted: the embedding lookups, the RMSNorms, softmax/logsumexp, GELU/ReLU and the residual
    additions (elementwise, O(N d) or O(N^2 H) each). Only the Hyper-SET layer is modelled.
    """
    import flops as F

    if cfg.layer != "hyperset":
        raise ValueError(f"FLOP model only for the hyperset layer, not {cfg.layer!r}")
    mms = F.matmuls(cfg, 1, energies=energies, shared_projections=energies and shared_projections)
    per_iter = {c: sum(mm.flops for mm in mms if mm.component == c and not mm.once)
                for c in dict.fromkeys(mm.component for mm in mms)}
    per_iter = {c: v for c, v in per_iter.items() if v}
    once = sum(mm.flops for mm in mms if mm.once)
    steps = iters * cfg.n_layers
    return {"per_iteration": per_iter, "head": sum(mm.flops for mm in mms if mm.component == "readout"),
            "once_per_pass": once, "iterations": steps, "total": steps * sum(per_iter.values()) + once}


def matmul_flops(dtype: torch.dtype, n: int, repeats: int) -> dict[str, Any]:
    """Best-of-`repeats` FLOP/s of an n x n x n matmul (torch, the current number of threads). Without native
    bf16 (emulated, ~300x slower than fp32 on such CPUs) a bf16 matmul is timed once at n/4 and scaled."""
    from hyperset.device import cpu_has_native_bf16

    if dtype == torch.bfloat16 and not cpu_has_native_bf16():
        n, repeats = max(n // 4, 64), 1
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.matmul(a, b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        times.append(time.perf_counter() - t0)
    flops = 2 * n**3
    return {"n": n, "best_s": min(times), "median_s": statistics.median(times), "flops_per_s": flops / min(times),
            "median_flops_per_s": flops / statistics.median(times)}


def load_bench_model() -> tuple[Any, dict[str, Any], str]:
    from hyperset.config import preset_config
    from hyperset.models import HyperSETModel, load_checkpoint
    from hyperset.solve import bundled_checkpoint

    shipped = bundled_checkpoint()
    if (shipped / "config.json").is_file():
        model, info = load_checkpoint(shipped, task="sudoku")
        return model, info, f"shipped model ({shipped})"
    torch.manual_seed(0)
    model = HyperSETModel(preset_config("sudoku-cpu", iters=24)).eval()
    return model, {}, "sudoku-cpu preset, iters=24, random weights (hyperset/weights/sudoku not present)"


def bench_boards(batch: int) -> torch.Tensor:
    """Real puzzles from examples/, tiled to `batch` boards."""
    puzzles = []
    csv = ROOT.parent / "examples" / "mixed.csv"
    if csv.is_file():
        for line in csv.read_text().splitlines()[1:]:
            p = line.split(",")[0].strip()
            if len(p) == 81 and p.isdigit():
                puzzles.append([int(c) for c in p])
    if not puzzles:
        puzzles = torch.randint(0, 10, (8, 81)).tolist()
    reps = -(-batch // len(puzzles))
    return torch.tensor(puzzles * reps, dtype=torch.long)[:batch]


def machine_info(threads: int) -> dict[str, Any]:
    from hyperset.accel import fused
    from hyperset.device import cpu_has_native_bf16, cpu_model, cpu_vendor
    from hyperset.exports.runtime import describe_runtime

    cpu = cpu_model()
    rt = describe_runtime()
    return {"cpu": cpu, "cpu_vendor": cpu_vendor(), "logical_cpus": os.cpu_count(), "threads_used": threads,
            "python": sys.version.split()[0],
            "torch": torch.__version__, "onnxruntime": rt.get("onnxruntime_version"),
            "onnxruntime_build": rt.get("build_package"), "native_bf16": cpu_has_native_bf16(),
            "cpu_kernels": cpu_kernels.status(), "cpu_kernels_isa": cpu_kernels.isa(), "cpu_gemm": cpu_gemm.status(),
            "cpu_matmul_library": fused.cpu_matmul_library(), "cpu_precision": fused.cpu_precision(),
            "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def best_library_rates(F: Any, cfg: Any, batches: list[int], threads: int, torch_rates: dict[tuple, float]
                       ) -> tuple[dict[tuple, float], dict[str, Any]]:
    """The best fp32 FLOP/s any library here reaches at each matmul shape of the runners' work (the trace's
    energies included): PyTorch's (`torch_rates`, bench/flops.rate: ATen or oneDNN), numpy's BLAS and ONNX
    Runtime's, each timed at `threads` threads; with the libraries' names and their rates by shape (JSON keys)."""
    keys = list(dict.fromkeys(F._shape_key(mm) for b in batches for mm in F.matmuls(cfg, b, energies=True)))
    for b in batches:
        for mm in F.matmuls(cfg, b, energies=True):
            F.rate(mm, torch_rates)
    by_library: dict[str, dict[tuple, float]] = {"pytorch": {k: torch_rates[k] for k in keys}}
    names = {"pytorch": f"torch {torch.__version__} (ATen or oneDNN, the faster)"}
    try:
        by_library["numpy"], names["numpy"] = F.other_blas_rates(keys, threads)
    except bench_args.BenchInputError as e:
        names["numpy"] = f"not timed: {e}"
    import onnxruntime

    by_library["onnxruntime"] = F.ort_rates(keys, threads)
    names["onnxruntime"] = f"onnxruntime {onnxruntime.__version__} (CPU provider, MatMul/Gemm)"
    best = {k: max(r[k] for r in by_library.values()) for k in keys}
    return best, {"names": names, "rates": {lib: {k: r[k] for k in keys} for lib, r in by_library.items()}}


def sliced_ceiling(F: Any, cfg: Any, steps: int, batch: int, slicings: list[int], best: dict[tuple, float]
                   ) -> dict[str, Any]:
    """Boards/s if each of the model's products (the least work, `F.matmuls` with shared projections) ran at the
    best rate any library reaches at it (`best`, FLOP/s by shape key), the batch taken whole or in slices of any of
    `slicings` rows (the runners' slices, which keep a product's operands in cache): per product the fastest of
    those, and nothing else taking time."""
    per_board = 0.0
    layouts = {s: F.matmuls(cfg, s, energies=True, shared_projections=True) for s in slicings}
    for i in range(len(layouts[slicings[0]])):
        per_board += min((1 if mms[i].once else steps) * mms[i].flops / best[F._shape_key(mms[i])] / s
                         for s, mms in layouts.items())
    return {"roofline_boards_per_s": 1.0 / per_board, "rows_per_product_considered": slicings, "batch": batch}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import flops as F

    import hyperset.accel.rows as accel_rows
    from hyperset.accel import policy
    from hyperset.exports import export as E
    from hyperset.exports.runtime import OrtSession
    from hyperset.exports.solver_backend import ORT_SLICE_BYTES, OnnxSolverBackend, by_rows

    torch.set_num_threads(args.threads)
    model, info, source = load_bench_model()
    cfg = model.cfg
    iters_list = args.iters or [cfg.iters, 4 * cfg.iters]
    batches = args.batches
    with torch.no_grad():  # the rows the library's own choice takes for a large batch (`Ops.slice_rows`)
        probe = torch.zeros(1, cfg.seq_len, cfg.dim)
        rows = policy(probe).slice_rows(cfg, 1 << 30, probe.device)
    ort_rows = accel_rows.cache_rows(cfg, ORT_SLICE_BYTES)
    report: dict[str, Any] = {
        "quick": args.quick, "machine": machine_info(args.threads), "model_source": source,
        "model_config": cfg.to_dict(), "parameters": model.num_parameters(), "iters": iters_list, "batches": batches,
        "repeats": args.repeats, "slice_rows": rows, "ort_slice_rows": ort_rows,
        "note": "shared 2-vCPU machine: other processes (e.g. a training run) may take CPU time during the "
        "measurement; medians are reported, runners are interleaved per repeat",
    }
    print(f"model: {source}; threads {args.threads}; iters {iters_list}; batches {batches}; slices of {rows} "
          f"boards (torch), {ort_rows} (ONNX Runtime)", flush=True)

    print("matmul rooflines ...", flush=True)
    start = {"float32": matmul_flops(torch.float32, args.matmul_n, max(3, args.repeats)),
             "bfloat16": matmul_flops(torch.bfloat16, args.matmul_n, max(3, args.repeats))}
    rates: dict[tuple, float] = {}
    roofs = {(k, b): F.roofline(F.matmuls(cfg, b, energies=True), k * cfg.n_layers, b, torch.float32, rates)
             for k in iters_list for b in batches}
    least = {(k, b): F.roofline(F.matmuls(cfg, b, energies=True, shared_projections=True), k * cfg.n_layers, b,
                                torch.float32, rates) for k in iters_list for b in batches}
    # the ceiling takes each product at its best over the runners' slices and the library's other choice of rows
    # (slices sized by the widest intermediate, `cache_rows`), so that a runner's own choice cannot lower it
    slicings = {b: sorted({b, *(r for r in (rows, accel_rows.cache_rows(cfg), ort_rows) if r < b)}) for b in batches}
    sliced_rows = sorted({r for v in slicings.values() for r in v})
    best, libraries = best_library_rates(F, cfg, sliced_rows, args.threads, rates)
    ceilings = {(k, b): sliced_ceiling(F, cfg, k * cfg.n_layers, b, slicings[b], best)
                for k in iters_list for b in batches}
    print("the CPU's multiply-add peak ...", flush=True)
    peak_start = fma_peak.measure(args.threads)
    peak = peak_start
    report["flops_per_board"] = {str(k): flops_per_board(cfg, k) for k in iters_list}
    report["flops_counted"] = " ".join(flops_per_board.__doc__.split())

    workdir = Path(tempfile.mkdtemp(prefix="hyperset-bench-"))
    exports: dict[str, Any] = {}
    sessions: dict[str, OrtSession] = {}
    res = E.export_loop(model, workdir / "loop.onnx", opset=17, info=info)
    exports["loop"] = {"bytes": res.bytes, "seconds": res.seconds, "nodes": res.nodes}
    sessions["loop"] = OrtSession(res.path, "cpu", intra_op_threads=args.threads)
    for k in iters_list:
        print(f"exporting unrolled x{k} ...", flush=True)
        res = E.export_unrolled(model, k, workdir / f"unrolled{k}.onnx", opset=17, info=info)
        exports[f"unrolled_{k}"] = {"bytes": res.bytes, "seconds": res.seconds, "nodes": res.nodes}
        sessions[f"unrolled_{k}"] = OrtSession(res.path, "cpu", intra_op_threads=args.threads)
    report["exports"] = exports
    report["ort_provider"] = sessions["loop"].provider
    solver_backend = OnnxSolverBackend(sessions["loop"])

    def torch_run(whole: bool, kernels: str | None = None, gemm: str | None = None):
        def go(boards: torch.Tensor, k: int) -> None:
            slice_bytes = accel_rows.SLICE_BYTES
            accel_rows.SLICE_BYTES = 1 << 62 if whole else slice_bytes
            try:
                with torch.inference_mode(), (cpu_kernels.using_cpu_kernels(kernels) if kernels
                                              else contextlib.nullcontext()), \
                        (cpu_gemm.using_cpu_gemm(gemm) if gemm else contextlib.nullcontext()):
                    model.run(boards, iters=k, trace=True)
            finally:
                accel_rows.SLICE_BYTES = slice_bytes
        return go

    def ort_runner(graph: str, whole: bool):
        def go(boards: torch.Tensor, k: int) -> None:
            sess = sessions["loop" if graph == "loop" else f"unrolled_{k}"]
            feeds = {sess.input_names[0]: boards.numpy()}
            if graph == "loop":
                feeds["iters"] = np.asarray(k, dtype=np.int64)
            by_rows(sess.run, feeds, {sess.input_names[0]}, 0 if whole else solver_backend.rows)
        return go

    # "sliced": as the library runs on a CPU (hyperset.accel.rows.slice_rows; the onnx solver backend's `rows`);
    # "whole batch": one call, every op on all the boards at once
    runners = {"pytorch": torch_run(False), "pytorch_whole_batch": torch_run(True),
               "ort_loop": ort_runner("loop", False), "ort_loop_whole_batch": ort_runner("loop", True),
               "ort_unrolled": ort_runner("unrolled", False)}
    if args.cpu_kernels:
        runners[f"pytorch_cpu_kernels_{args.cpu_kernels}"] = torch_run(False, args.cpu_kernels)
    if args.cpu_gemm:
        runners[f"pytorch_cpu_gemm_{args.cpu_gemm}"] = torch_run(False, gemm=args.cpu_gemm)
    rows_out = []
    for k in iters_list:
        fpb = report["flops_per_board"][str(k)]["total"]
        for b in batches:
            boards = bench_boards(b)
            times: dict[str, list[float]] = {r: [] for r in runners}
            for fn in runners.values():  # warm-up (ORT allocations, torch kernels)
                fn(boards, k)
            for _ in range(args.repeats):
                for name, fn in runners.items():
                    t0 = time.perf_counter()
                    fn(boards, k)
                    times[name].append(time.perf_counter() - t0)
            roof = roofs[(k, b)]["roofline_boards_per_s"]
            low = least[(k, b)]["roofline_boards_per_s"]
            ceiling = ceilings[(k, b)]["roofline_boards_per_s"]
            for name, ts in times.items():
                med = statistics.median(ts)
                bps = b / med
                row = {"runner": name, "iters": k, "batch": b, "median_s": med, "min_s": min(ts),
                       "times_s": ts, "boards_per_s": bps, "flops_per_s": bps * fpb,
                       "roofline_boards_per_s": roof, "share_of_roofline": bps / roof,
                       "least_work_roofline_boards_per_s": low, "share_of_least_work_roofline": bps / low}
                rows_out.append(row)
                print(f"  iters {k:3d} batch {b:4d} {name:24s} {bps:8.1f} boards/s  {100 * bps / ceiling:5.1f} % of "
                      f"the best library's ceiling ({ceiling:.1f} boards/s), {100 * bps / roof:5.1f} % of torch's "
                      "matmul rates", flush=True)
    # the libraries' rates are timed before and after the runs (the live lines above are against the first timing);
    # per shape and library the better of the two is kept (less contention), and the rows' ceilings and shares of
    # them are those of the kept rates
    best_end, libraries_end = best_library_rates(F, cfg, sliced_rows, args.threads, {})
    libraries["rates_at_start"] = libraries["rates"]
    libraries["rates"] = {lib: {key: max(r[key], libraries_end["rates"].get(lib, r)[key]) for key in r}
                          for lib, r in libraries["rates"].items()}
    best_start, best = best, {key: max(best[key], best_end[key]) for key in best}
    ceilings_start = ceilings
    ceilings = {(k, b): sliced_ceiling(F, cfg, k * cfg.n_layers, b, slicings[b], best)
                for k in iters_list for b in batches}
    for row in rows_out:
        ceiling = ceilings[(row["iters"], row["batch"])]["roofline_boards_per_s"]
        row.update({"best_library_ceiling_boards_per_s": ceiling,
                    "share_of_best_library_ceiling": row["boards_per_s"] / ceiling,
                    "above_ceiling": row["boards_per_s"] > ceiling,
                    "best_library_ceiling_at_start_boards_per_s":
                        ceilings_start[(row["iters"], row["batch"])]["roofline_boards_per_s"]})
    # the peak is timed before and after the runs; the better of the two is kept (less contention)
    peak_end = fma_peak.measure(args.threads)
    peak = max(peak_start, peak_end, key=lambda p: p["fp32_gflops"] or 0.0)
    for row in rows_out:
        for dt in ("fp32", "bf16"):
            if peak.get(f"{dt}_gflops"):
                row[f"share_of_{dt}_fma_peak"] = row["flops_per_s"] / (1e9 * peak[f"{dt}_gflops"])
    report["results"] = rows_out
    report["roofline"] = {
        "what": "boards/s if the model's matmuls (forward, with the trace's energy matmuls) ran at the rates this "
                "thread count reaches at their shapes (bench/flops.py, fp32, timed in this run) and nothing else "
                "took time",
        "by_iters_and_batch": [{"iters": k, "batch": b, **r} for (k, b), r in roofs.items()],
        "least_work_by_iters_and_batch": [{"iters": k, "batch": b, **r} for (k, b), r in least.items()],
        "shapes": [{"m": key[0], "k": key[1], "n": key[2], "count": key[3], "layout": key[4], "flops_per_s": r}
                   for key, r in rates.items()]}
    report["best_library_ceiling"] = {
        "what": "boards/s if the model's matmuls (the least work: each iteration's head projections made once for "
                "the trace's energy and the next step) ran, each product, at the best rate any library here reaches "
                "at it on the whole batch, in any of the runners' slices of rows or in those sized by the widest "
                "intermediate (PyTorch's ATen or oneDNN, "
                "numpy's BLAS, ONNX Runtime's MatMul/Gemm; fp32, this thread count, timed before and after the "
                "runs, the better of the two kept) and nothing else took time; a runner above it (`above_ceiling`) "
                "runs some product faster than any library call here (the C kernels, fused "
                "operators) or the rates were timed under load",
        "libraries": libraries["names"],
        "by_iters_and_batch": [{"iters": k, "batch": b, **r} for (k, b), r in ceilings.items()],
        "shapes": [{"m": key[0], "k": key[1], "n": key[2], "count": key[3], "layout": key[4],
                    "flops_per_s": best[key], "flops_per_s_at_start": best_start[key],
                    "by_library": {lib: r[key] for lib, r in libraries["rates"].items()},
                    "by_library_at_start": {lib: r[key] for lib, r in libraries["rates_at_start"].items()}}
                   for key in best]}
    report["fma_peak"] = {**peak, "at_start_fp32_gflops": peak_start["fp32_gflops"],
                          "at_end_fp32_gflops": peak_end["fp32_gflops"]}
    fastest = max(best.values()) / 1e9
    if peak["fp32_gflops"] and fastest > peak["fp32_gflops"]:  # a ceiling is a ceiling: the peak's timing was loaded
        report["fma_peak"]["invalid"] = (f"a library reached {fastest:.1f} GFLOP/s at one shape, above the measured "
                                         f"fp32 peak ({peak['fp32_gflops']:.1f}): other processes took CPU time "
                                         "while the peak was timed; the shares of it are not valid")
    # the square matmul is measured before and after the runs; the better of the two is kept (less contention)
    end = {"float32": matmul_flops(torch.float32, args.matmul_n, max(3, args.repeats)),
           "bfloat16": matmul_flops(torch.bfloat16, args.matmul_n, max(3, args.repeats))}
    report["matmul"] = {dt: {**max(start[dt], end[dt], key=lambda m: m["flops_per_s"]),
                             "at_start_flops_per_s": start[dt]["flops_per_s"],
                             "at_end_flops_per_s": end[dt]["flops_per_s"]} for dt in start}
    bf16_fastest = report["matmul"]["bfloat16"]["flops_per_s"] / 1e9
    if peak.get("bf16_gflops") and bf16_fastest > peak["bf16_gflops"]:  # the same for bf16's
        report["fma_peak"]["bf16_invalid"] = (f"the bf16 matmul reached {bf16_fastest:.1f} GFLOP/s, above the "
                                              f"measured bf16 peak ({peak['bf16_gflops']:.1f}): the peak's timing "
                                              "was loaded or misses the CPU's fastest bf16 units")
    report["machine"]["load_average_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    for f in workdir.iterdir():
        f.unlink()
    workdir.rmdir()
    return report


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    runners = list(dict.fromkeys(r["runner"] for r in rows))
    groups = list(dict.fromkeys((r["iters"], r["batch"]) for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.8 / len(runners)
    for i, runner in enumerate(runners):
        vals = {(r["iters"], r["batch"]): r for r in rows if r["runner"] == runner}
        xs = np.arange(len(groups)) + (i - (len(runners) - 1) / 2) * width
        axes[0].bar(xs, [vals[g]["boards_per_s"] for g in groups], width, label=runner)
        axes[1].bar(xs, [100 * vals[g]["share_of_best_library_ceiling"] for g in groups], width, label=runner)
    labels = [f"T={k}\nbatch {b}" for k, b in groups]
    for ax in axes:
        ax.set_xticks(np.arange(len(groups)), labels)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(runners), fontsize=8)
    axes[0].set_ylabel("boards / s (median)")
    axes[0].set_yscale("log")
    axes[1].set_ylabel("% of the best library's fp32 matmul ceiling")
    axes[1].axhline(70, color="grey", lw=0.8, ls="--")
    axes[1].set_title(f"{report['machine']['threads_used']} thread(s); slices of {report['slice_rows']} boards "
                      f"(torch), {report['ort_slice_rows']} (ONNX Runtime)", fontsize=9)
    tag = "QUICK run on a contended machine — " if report["quick"] else ""
    fig.suptitle(f"{tag}Hyper-SET Sudoku, {report['model_source'].split(' (')[0]}, "
                 f"{report['machine']['cpu']}", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    bench_args.save_figure(fig, path)


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=bench_args.count, default=2,
                        help="torch and ONNX Runtime intra-op threads")
    parser.add_argument("--repeats", type=bench_args.count, default=None, help="timed runs per runner [5; quick: 2]")
    parser.add_argument("--quick", action="store_true", help="batches 1 and 16, 2 repeats, a 1024 matmul")
    parser.add_argument("--iters", type=bench_args.iteration_counts, default=None,
                        help="comma-separated iteration counts [T and 4T of the model]")
    parser.add_argument("--batches", type=bench_args.counts, default=None,
                        help=f"batch sizes, comma-separated [1, the solver's CPU batch {CPU_BATCH_SIZE}; quick: 1,16]")
    parser.add_argument("--matmul-n", type=bench_args.count, default=None,
                        help="matmul size for the roofline [2048; quick 1024]")
    parser.add_argument("--cpu-kernels", choices=cpu_kernels.CHOICES, default=None,
                        help="also the sliced PyTorch runner with the attention maps' C kernel so, in the same rounds "
                        "(pytorch_cpu_kernels_CHOICE)")
    parser.add_argument("--cpu-gemm", choices=cpu_gemm.CHOICES, default=None,
                        help="also the sliced PyTorch runner with the products' C kernel so, in the same rounds "
                        "(pytorch_cpu_gemm_CHOICE)")
    parser.add_argument("--out", type=bench_args.output_file, default=RESULTS / "onnx_bench.json")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (2 if args.quick else 5)
    args.batches = args.batches or ([1, 16] if args.quick else [1, CPU_BATCH_SIZE])
    args.matmul_n = args.matmul_n or (1024 if args.quick else 2048)
    report = run(args)
    report["command"] = bench_args.command_line("onnx_bench", argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, report)
    png = args.out.with_suffix(".png")
    plot(report, png)
    print(f"wrote {args.out} and {png}")


if __name__ == "__main__":
    main()
