"""Where a training step's time goes: the matmuls against everything else, and on a GPU the kernels it launches.

    python bench/step_profile.py [--peer DIR] [--threads 1] [--rounds 5] [--compile]   # CPU: the 85% budget
    python bench/step_profile.py --peer DIR --device cuda [--compile]                  # GPU: kernels per step

The configuration and runners of bench/peer_bench.py: the authors' Sudoku model at d=128 (4 heads, M=4d, 24
iterations, batch 64, loss on the last iteration, fp32) and their training step (AdamW, clipping at 1.0); `ours`
is the library in eager mode (hyperset.accel.fused, step sizes once), with --compile `ours_compiled` is the same under
torch.compile (as the trainer runs it with train.compile = true) and, with --peer DIR (a checkout of
huyunzhe/hyper-set, see peer_bench's docstring), `peer` is the authors' code. Every round runs, for each runner
in turn (the order reversed every round), a timed training step and then one under torch.profiler; medians of
--rounds rounds after one of warm-up:

  step_s       wall seconds of a training step, not profiled
  matmul_s     self time of the matmul ops (mm, bmm, baddbmm, addmm, and mkldnn::_linear_pointwise where the
               library's products run on oneDNN's GEMM, see hyperset.accel.fused.matmul) in the profiled step: on a CPU
               the time the products ran
  maps_kernel_s   self time of the attention maps' kernel (hyperset.accel.cpu_kernels: their products, softmax and
               transposed adds together, where it runs; not in matmul_s)
  other_s      step_s - matmul_s: elementwise work, softmax, reductions, copies, the optimizer, Python (and the
               maps' kernel)
  top_ops      the ops with the most self time in the median profiled step: [name, ms, calls]; a compiled
               step's fused elementwise kernels are its "compiled graph" rows
  kernels_of_compiled_graph   on a CPU, the compiled step's generated kernels one by one (inductor's kernel
               profiling): ["forward: <kernel>" or "backward: <kernel>", ms, calls], most time first; their names
               list the ops each fuses (e.g. "backward: _softmax" is the softmax the backward recomputes from
               the saved scores)
  matmul_shapes   on a CPU, the step's matmuls by op, shape (m x k by k x n, `count` of them per call) and
               layout (which operand is a transposed view, from the strides; empty where the profiler records
               no strides, as torch 2.11's): calls and ms per step (medians), the GFLOP/s they ran at in the
               step and the GFLOP/s the same shape and layout reach alone, timed
               repeatedly on warm operands as bench/flops.py times the roofline's shapes (the roofline's own
               timing where it has the shape: `isolated_gflops`) and on cold ones (`cold_gflops`: the calls go
               round copies of the operands and outputs that fill twice the last-level cache, so each reads its
               operands from memory and writes to memory, as after an op that wrote them out);
               `matmul_at_isolated_rates_s` and `matmul_at_cold_rates_s` are what the step's matmuls would take
               at those rates
  on a GPU     kernels (CUDA kernels, copies and fills launched in a step), gpu_busy_s (the sum of their
               durations; not the GPU-side ranges of annotations) and top_kernels; there the self times are host
               time, not the kernels' time

On a CPU the run also measures the fp32 training roofline at the configuration's shapes (bench/flops.py, as
peer_bench does: `roofline_boards_per_s`, PyTorch's, and `share_of_roofline`) and the CPU's, as peer_bench's goal
takes it (`cpu_roofline_boards_per_s`: the best rate PyTorch or numpy's BLAS reaches at each shape, PyTorch's alone
where numpy cannot run; `share_of_cpu_roofline`), and states the budget that 85% of the CPU's leaves:
`budget_85.step_s`, the step at 85% of it, and `budget_85.left_beside_matmuls_s`, what remains of it once our
matmuls have run as they run in the step (`budget_85.compiled` the same for the compiled step).
Writes bench/results/step_profile.json (step_profile_cuda.json on a GPU).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

# the profiler's library (kineto) reads its log level when torch loads: below 6 it prints two to five lines per
# profiled step to stderr (torch 2.13; its levels run VERBOSE 0, INFO, WARNING, STAGE, ERROR, USDT 5, so the
# per-step USDT lines go only with its errors: a profile that failed shows as a step without ops in the report)
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

import bench_args  # noqa: E402
import flops  # noqa: E402
import peer_bench  # noqa: E402
import torch  # noqa: E402
import torch._inductor.config as inductor_config  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from hyperset.checkpoint import atomic_write_json  # noqa: E402
from hyperset.models import HyperSETModel  # noqa: E402

ONEDNN_MM = "mkldnn::_linear_pointwise"  # hyperset.accel.fused.matmul's products on oneDNN's GEMM
MATMUL_OPS = ("aten::mm", "aten::bmm", "aten::baddbmm", "aten::addmm", ONEDNN_MM)
# the attention maps fused per (board, head), products and softmax together (hyperset.accel.cpu_kernels)
MAPS_KERNEL_OPS = ("hyperset::bisoftmax_maps", "hyperset::bisoftmax_maps_backward")
TOP = 12
COMPILED = "## Call CompiledFxGraph"  # the profiler's name for a call of code torch.compile generated
KERNEL = re.compile(r"^graph_\d+_cpp_fused_")  # a kernel it generated for a CPU, with kernel profiling on
BACKWARD = "CompiledFunctionBackward"


def _direction(event: Any) -> str:
    """"backward" where a generated kernel ran inside the compiled backward graph, else "forward"."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == BACKWARD:
            return "backward"
        parent = parent.cpu_parent
    return "forward"


def _transposed(shape: list[int], strides: list[int]) -> bool:
    """Whether a matrix operand is a transposed view (its columns are contiguous, its rows are not)."""
    return shape[-1] > 1 and shape[-2] > 1 and strides[-2] == 1 and strides[-1] != 1


def matmul_shape(event: Any) -> tuple[str, int, int, int, int, str] | None:
    """(op, m, k, n, count, layout) of a matmul op's call from its operands' recorded shapes and strides (the
    profiler's record_shapes), or None where they were not recorded."""
    # profilers before these two attributes (torch 2.11's, for one) record no strides: no layout, so no shape
    shapes = getattr(event, "structured_input_shapes", None)
    strides = getattr(event, "structured_input_strides", None)
    first = 1 if event.name in ("aten::addmm", "aten::baddbmm") else 0  # after the tensor added to
    try:
        a, b = shapes[first], shapes[first + 1]
        sa, sb = strides[first], strides[first + 1]
    except (IndexError, TypeError):
        return None
    if event.name == ONEDNN_MM:  # a (..., k) times a weight b given as b^T (n, k)
        if not (len(a) >= 2 and len(b) == 2 and len(sa) == len(a) and len(sb) == 2):
            return None
        return event.name, math.prod(a[:-1]), a[-1], b[0], 1, "n" + ("n" if _transposed(b, sb) else "t")
    if not (len(a) == len(b) and len(a) in (2, 3) and len(sa) == len(a) and len(sb) == len(b)):
        return None
    layout = "".join("t" if _transposed(t, st) else "n" for t, st in ((a, sa), (b, sb)))
    return event.name, a[-2], a[-1], b[-1], a[0] if len(a) == 3 else 1, layout


def gpu_kernels(events: Any) -> list[Any]:
    """The events that ran on the GPU: kernels, copies and fills, without the GPU-side ranges of user annotations
    (a compiled graph's call is one, spanning its kernels and the gaps between them)."""
    return [e for e in events
            if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]


def profile_step(runner: peer_bench.Runner, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """One training step under torch.profiler: its wall time, the matmuls' self time (in all and by shape), the top
    ops (and kernels)."""
    cuda = x.is_cuda
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True) as prof:
        t0 = time.perf_counter()
        runner.train(x, y)
        sync()
        step_s = time.perf_counter() - t0
    seconds: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    kernel_s: Counter[str] = Counter()
    kernel_calls: Counter[str] = Counter()
    for e in prof.key_averages():
        kernel = KERNEL.match(e.key) is not None
        if kernel or e.key.startswith(("aten::", COMPILED)) or e.key in (ONEDNN_MM, *MAPS_KERNEL_OPS):
            # all of the generated code in one row: its graphs' calls and, with kernel profiling, their kernels
            name = "compiled graph" if kernel or e.key.startswith(COMPILED) else e.key
            seconds[name] += e.self_cpu_time_total / 1e6
            calls[name] += 0 if kernel else e.count  # the calls of the graphs, not of their kernels
    shape_s: Counter[tuple] = Counter()
    shape_calls: Counter[tuple] = Counter()
    for e in prof.events():
        if KERNEL.match(e.name):
            name = f"{_direction(e)}: {KERNEL.sub('', e.name)}"
            kernel_s[name] += e.self_cpu_time_total / 1e6
            kernel_calls[name] += 1
        elif e.name in MATMUL_OPS and (key := matmul_shape(e)) is not None:
            shape_s[key] += e.self_cpu_time_total / 1e6
            shape_calls[key] += 1
    rows = [(name, s, calls[name]) for name, s in seconds.items()]
    top = sorted(rows, key=lambda r: -r[1])[:TOP]
    out: dict[str, Any] = {"profiled_step_s": step_s, "matmul_s": sum(s for name, s, _ in rows if name in MATMUL_OPS),
                           "maps_kernel_s": sum(s for name, s, _ in rows if name in MAPS_KERNEL_OPS),
                           "top_ops": [[name, round(1e3 * s, 3), n] for name, s, n in top],
                           "matmul_shapes": {key: (s, shape_calls[key]) for key, s in shape_s.items()}}
    if kernel_s:
        out["kernels_of_compiled_graph"] = [[name, round(1e3 * s, 3), kernel_calls[name]]
                                            for name, s in kernel_s.most_common()]
    if cuda:
        kernels = gpu_kernels(prof.events())
        out.update(kernels=len(kernels), gpu_busy_s=sum(e.device_time for e in kernels) / 1e6,
                   top_kernels=Counter(e.name[:100] for e in kernels).most_common(TOP))
    return out


def rounds_of(runners: dict[str, peer_bench.Runner], x: torch.Tensor, y: torch.Tensor,
              rounds: int) -> dict[str, dict[str, Any]]:
    """Each round, each runner in turn (the order reversed every round): a timed training step, then a profiled
    one. Medians over the rounds, after one round of warm-up; the top ops and kernels of the median profiled step."""
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    seen: dict[str, list[tuple[float, dict[str, Any]]]] = {n: [] for n in runners}
    for r in range(rounds + 1):
        for name in (list(runners) if r % 2 == 0 else list(reversed(runners))):
            sync()
            t0 = time.perf_counter()
            runners[name].train(x, y)
            sync()
            seconds = time.perf_counter() - t0
            prof = profile_step(runners[name], x, y)
            if r:
                seen[name].append((seconds, prof))
    out = {}
    for name, got in seen.items():
        profs = sorted((p for _, p in got), key=lambda p: p["profiled_step_s"])
        mid = profs[len(profs) // 2]
        step_s = statistics.median(s for s, _ in got)
        matmul_s = statistics.median(p["matmul_s"] for p in profs)
        row = {"step_s": step_s, "profiled_step_s": mid["profiled_step_s"], "matmul_s": matmul_s,
               "maps_kernel_s": statistics.median(p["maps_kernel_s"] for p in profs),
               "other_s": step_s - matmul_s, "matmul_share": matmul_s / step_s, "top_ops": mid["top_ops"]}
        if "kernels_of_compiled_graph" in mid:
            row["kernels_of_compiled_graph"] = mid["kernels_of_compiled_graph"]
        keys = {k for p in profs for k in p["matmul_shapes"]}
        row["matmul_shapes"] = {k: (statistics.median(p["matmul_shapes"].get(k, (0.0, 0))[0] for p in profs),
                                    max(p["matmul_shapes"].get(k, (0.0, 0))[1] for p in profs)) for k in keys}
        if "kernels" in mid:
            row.update({k: statistics.median(p[k] for p in profs) for k in ("kernels", "gpu_busy_s")},
                       top_kernels=mid["top_kernels"])
        out[name] = row
    return out


def matmuls_against_isolated_rates(row: dict[str, Any], rates: dict[tuple, float],
                                   cold_rates: dict[tuple, float]) -> None:
    """Replace a runner's `matmul_shapes` ({(op, m, k, n, count, layout): (seconds, calls)}) by a list, most time
    first, of each shape's time and rate in the step beside the rates of the same shape alone, warm and cold
    (bench/flops.py's timing; `rates` and `cold_rates`, fp32 FLOP/s by shape, are caches: `rates` holds the
    roofline's, and both take the shapes they lack); add `matmul_at_isolated_rates_s` and `matmul_at_cold_rates_s`
    where there are shapes."""
    shapes, at_isolated, at_cold = [], 0.0, 0.0
    for (op, m, k, n, count, layout), (seconds, calls) in row.pop("matmul_shapes").items():
        mm = flops.MatMul("step", op, m, k, n, count, layout=layout)
        alone, cold = flops.rate(mm, rates), flops.rate(mm, cold_rates, cold=True)
        isolated_s, cold_s = calls * mm.flops / alone, calls * mm.flops / cold
        at_isolated += isolated_s
        at_cold += cold_s
        shapes.append({"op": op, "m": m, "k": k, "n": n, "count": count, "layout": layout, "calls": calls,
                       "ms": 1e3 * seconds, "in_step_gflops": calls * mm.flops / seconds / 1e9 if seconds else None,
                       "isolated_gflops": alone / 1e9, "isolated_ms": 1e3 * isolated_s,
                       "cold_gflops": cold / 1e9, "cold_ms": 1e3 * cold_s})
    row["matmul_shapes"] = sorted(shapes, key=lambda r: -r["ms"])
    if shapes:  # none where the profiler recorded no strides: no sums that would read as 0 s of matmuls
        row["matmul_at_isolated_rates_s"] = at_isolated
        row["matmul_at_cold_rates_s"] = at_cold


def run(peer_dir: Path | None, device: str = "cpu", rounds: int = 5, threads: int = 1,
        batch: int = peer_bench.BATCH, compiled: bool = False) -> dict[str, Any]:
    torch.set_num_threads(threads)
    dev, info = peer_bench.machine_on(device, threads)
    cfg = peer_bench.our_config()
    x, y = (t[:batch].to(dev) for t in peer_bench.batch())
    torch.manual_seed(0)
    runners = {"ours": peer_bench.Runner("ours", HyperSETModel(cfg), False, device=dev)}
    if compiled:
        torch.compiler.reset()  # compiled anew below, with the kernel records, not taken from earlier in the process
        torch.manual_seed(0)
        runners["ours_compiled"] = peer_bench.Runner("ours", HyperSETModel(cfg), False, compiled=True, device=dev)
    if peer_dir is not None:
        runners["peer"] = peer_bench.Runner("peer", peer_bench.load_peer(peer_dir, cfg), False, device=dev)
    rep: dict[str, Any] = {"machine": info, "config": cfg.to_dict(), "batch": batch, "rounds": rounds,
                           "dtype": "float32"}
    print(f"{rounds} rounds of a timed and a profiled training step of {', '.join(runners)} ...", flush=True)
    # the CPU kernels torch.compile generates report to the profiler one by one (a record per kernel call)
    with inductor_config.patch({"cpp.enable_kernel_profile": True}):
        rep["runners"] = rounds_of(runners, x, y, rounds)
    if dev.type == "cpu":
        rates: dict[str, dict[tuple, float]] = {}  # by dtype: the rooflines' shape rates, reused by shape below
        roofs = peer_bench.rooflines(cfg, batch, rates)
        roof, least = (roofs[k]["float32"]["training"] for k in ("configuration", "least_work"))
        # the 85% budget is held against the CPU's roofline, as peer_bench's goal: the best rate PyTorch or
        # numpy's BLAS reaches at each shape (PyTorch's alone where numpy cannot run)
        blas = peer_bench.other_blas(cfg, threads, batch)
        timed = [roofs["configuration"]["float32"]] + ([blas["float32"]] if blas is not None else [])
        cpu_roof = flops.best_of_rooflines(cfg, batch, None, True, *timed)["training"]["roofline_boards_per_s"]
        step_85 = batch / (0.85 * cpu_roof)
        ours = rep["runners"]["ours"]
        rep["roofline_boards_per_s"] = roof["roofline_boards_per_s"]
        rep["least_work_roofline_boards_per_s"] = least["roofline_boards_per_s"]
        rep["other_blas_library"] = blas["library"] if blas is not None else None
        rep["cpu_roofline_boards_per_s"] = cpu_roof
        cold_rates: dict[tuple, float] = {}
        for r in rep["runners"].values():
            r["share_of_roofline"] = batch / r["step_s"] / roof["roofline_boards_per_s"]
            r["share_of_cpu_roofline"] = batch / r["step_s"] / cpu_roof
            matmuls_against_isolated_rates(r, rates["float32"], cold_rates)
        rep["budget_85"] = {"step_s": step_85, "our_matmuls_at_roofline_rates_s": least["seconds_per_batch"],
                            "left_beside_matmuls_s": step_85 - ours["matmul_s"],
                            "our_other_s": ours["other_s"]}
        if compiled:
            comp = rep["runners"]["ours_compiled"]
            rep["budget_85"]["compiled"] = {"left_beside_matmuls_s": step_85 - comp["matmul_s"],
                                            "other_s": comp["other_s"]}
    else:
        for r in rep["runners"].values():  # on a GPU the ops' self times are host time: no rates
            r.pop("matmul_shapes")
    info["load_average_1min_at_end"] = flops.load_average()
    return rep


def print_summary(rep: dict[str, Any]) -> None:
    m = rep["machine"]
    where = f"{m['gpu']} (CUDA {m['cuda']}), host {m['cpu']}" if "gpu" in m else f"{m['cpu']}, {m['threads']} thread(s)"
    print(f"{where}; fp32 training step, batch {rep['batch']}, medians of {rep['rounds']} rounds")
    for name, r in rep["runners"].items():
        line = (f"  {name:13s} step {r['step_s']:.3f} s: matmuls {r['matmul_s']:.3f} s ({r['matmul_share']:.0%}), "
                f"the rest {r['other_s']:.3f} s"
                + (f" (the maps' kernel {r['maps_kernel_s']:.3f} s)" if r.get("maps_kernel_s") else ""))
        if "kernels" in r:
            line += f"; {r['kernels']:.0f} kernels, GPU busy {1e3 * r['gpu_busy_s']:.1f} ms"
        if "share_of_roofline" in r:
            line += (f"; {r['share_of_roofline']:.0%} of PyTorch's roofline, {r['share_of_cpu_roofline']:.0%} of the "
                     f"CPU's")
        print(line)
        if "matmul_at_isolated_rates_s" in r:
            print(f"    its matmuls would take {r['matmul_at_isolated_rates_s']:.3f} s at the rates their shapes reach "
                  f"alone on warm operands, {r['matmul_at_cold_rates_s']:.3f} s on operands from memory; the slowest "
                  f"against the warm rates:")
            timed = [sh for sh in r["matmul_shapes"] if sh["in_step_gflops"]]
            for sh in sorted(timed, key=lambda sh: sh["isolated_ms"] - sh["ms"])[:4]:
                shape = f"{sh['op']} {sh['count']} x ({sh['m']} x {sh['k']}) ({sh['k']} x {sh['n']}) {sh['layout']}"
                print(f"    {sh['ms']:8.1f} ms {sh['calls']:4d} calls  {shape}: {sh['in_step_gflops']:.0f} GFLOP/s "
                      f"in the step, {sh['isolated_gflops']:.0f} alone warm, {sh['cold_gflops']:.0f} cold")
        for name, ms, n in r.get("kernels_of_compiled_graph", [])[:TOP]:
            print(f"    {ms:8.1f} ms {n:4d} calls  {name}")
    if "budget_85" in rep:
        b = rep["budget_85"]
        other = (f"the best rate of PyTorch's matmuls or {rep['other_blas_library']} at each shape; PyTorch's alone "
                 f"{rep['roofline_boards_per_s']:.1f}" if rep.get("other_blas_library") else "PyTorch's matmuls")
        print(f"  the CPU's roofline: {rep['cpu_roofline_boards_per_s']:.1f} boards/s ({other})")
        print(f"  85% of the CPU's roofline: a step of {b['step_s']:.3f} s; our "
              f"matmuls as they run leave {b['left_beside_matmuls_s']:.3f} s for work that now takes "
              f"{b['our_other_s']:.3f} s (at the roofline's rates they would take "
              f"{b['our_matmuls_at_roofline_rates_s']:.3f} s)")
        if "compiled" in b:
            print(f"  compiled: its matmuls leave {b['compiled']['left_beside_matmuls_s']:.3f} s for work that takes "
                  f"{b['compiled']['other_s']:.3f} s")


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", type=bench_args.peer_checkout, default=None,
                    help="a checkout of huyunzhe/hyper-set (else ours only)")
    ap.add_argument("--device", type=bench_args.device, default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--rounds", type=bench_args.count, default=5)
    ap.add_argument("--threads", type=bench_args.count, default=1)
    ap.add_argument("--compile", action="store_true", help="also our step under torch.compile")
    ap.add_argument("--batch", type=bench_args.count, default=peer_bench.BATCH,
                    help=argparse.SUPPRESS)  # small runs in tests
    ap.add_argument("--out", type=bench_args.output_file, default=None,
                    help="default bench/results/step_profile.json (step_profile_cuda.json on a GPU)")
    args = ap.parse_args(argv)
    rep = run(args.peer, args.device, args.rounds, args.threads, args.batch, args.compile)
    rep["command"] = bench_args.command_line("step_profile", argv)
    print_summary(rep)
    out = args.out or flops.RESULTS / ("step_profile.json" if args.device == "cpu" else "step_profile_cuda.json")
    atomic_write_json(out, rep)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
