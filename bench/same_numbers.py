"""The same numbers before and after a change: the shipped models' outputs, accuracies and speed at two revisions.

    python bench/same_numbers.py --before a2e3df3 --rrn data/sudoku              # this tree against a revision
    python bench/same_numbers.py --before a2e3df3 --rrn data/sudoku --cifar data/cifar10 --rounds 5

The revision is exported (`git archive`) into a temporary folder, and every measurement runs in a fresh process
whose `hyperset` is imported from one of the two trees (PYTHONPATH; the process checks where it imported it from),
on one thread, with this file's code, so both sides do the same work:

    sudoku      the shipped Sudoku model on `--boards` seeded RRN validation boards: one-pass board accuracy at
                T, 2T and 4T and the logits at T; the solver's default strategy (search) and the commit strategy
    classifier  the shipped CIFAR-10 classifier's logits on the shipped sample images and seeded noise images,
                and its top-1 on the first `--images` CIFAR-10 test images when `--cifar` is given
    mim         the shipped masked image model: PSNR of the expected-code reconstruction of the sample images under
                a fixed 40% mask, and the reconstructions
    speed       boards per second of the default strategy on one board and on a batch of 128, in `--rounds`
                rounds that alternate the two trees (before, after, before, ...), median per tree

Printed side by side with the largest difference of every output; `--out` (default bench/results/same_numbers.json)
holds both sides, the differences and the device.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_args
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ONE = 1  # threads of every measuring process
SPEEDS = ("batch_1", "batch_128")  # what `_speed` measures


# ---- the measuring process (runs inside one tree) -------------------------------------------------------------

def _sudoku(rrn: str, boards: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    import torch

    from hyperset.pretrained import resolve
    from hyperset.solve import Solver
    from hyperset.sudoku.data import find_split, load_csv, protocol_split

    p, s = load_csv(find_split(rrn, "valid"))
    p, s = protocol_split(p, s, boards, 0)
    solver = Solver.load(resolve("sudoku"), "cpu")
    model, T = solver.model, solver.trained_iters
    x = torch.from_numpy(p.astype(np.int64))
    target = torch.from_numpy(s.astype(np.int64)) - 1
    out: dict[str, Any] = {"boards": boards, "trained_iterations": T, "one_pass": {}}
    arrays: dict[str, np.ndarray] = {}
    with torch.no_grad():
        logits = model(x, iters=4 * T, all_logits=True)
    for k in (1, 2, 4):
        pred = logits[k * T - 1].argmax(-1)
        out["one_pass"][f"{k}T"] = float((pred == target).all(-1).float().mean())
    arrays["sudoku_logits_T"] = logits[T - 1].float().numpy()
    puzzles = ["".join(map(str, row)) for row in p.tolist()]
    for name, kw in (("default", {}), ("commit", {"strategy": "commit"})):
        res = solver.solve(puzzles, **kw)
        answers = np.array([[int(c) for c in r.prediction] for r in res])
        out[name] = {"solved": float(np.mean([r.valid for r in res])),
                     "correct": float(np.mean((answers == s).all(-1)))}
        arrays[f"sudoku_{name}_answers"] = answers
    return out, arrays


def _images() -> Any:
    import torch

    from hyperset.vision.reconstruct import sample_images

    samples = torch.stack(list(sample_images().values())).float()
    noise = torch.rand(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return samples, noise


def _classifier(cifar: str | None, n: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    import torch

    import hyperset
    from hyperset.models import load_pretrained
    from hyperset.vision.data import normalize, read_cifar

    model = load_pretrained("classifier").eval()
    config = json.loads((Path(hyperset.__file__).parent / "weights" / "classifier" / "config.json").read_text())
    mean, std = config["data"]["normalization"]["mean"], config["data"]["normalization"]["std"]
    samples, noise = _images()
    with torch.no_grad():
        logits = model(normalize(torch.cat([samples, noise]), mean, std))
    out: dict[str, Any] = {"inputs": len(logits)}
    arrays = {"classifier_logits": logits.float().numpy()}
    if cifar:
        data = read_cifar("cifar10", cifar, "test")
        images = torch.from_numpy(np.ascontiguousarray(data.images[:n])).permute(0, 3, 1, 2).float() / 255
        labels = torch.from_numpy(np.asarray(data.labels[:n]))
        with torch.no_grad():
            pred = torch.cat([model(normalize(b, mean, std)).argmax(-1) for b in images.split(256)])
        out["cifar10_test"] = {"images": len(labels), "top1": float((pred == labels).float().mean())}
    return out, arrays


def _mim() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    import torch

    from hyperset.vision.metrics import psnr
    from hyperset.vision.reconstruct import load_mim

    pipe = load_mim()
    samples, _ = _images()
    g = pipe.grid
    order = torch.randperm(g * g, generator=torch.Generator().manual_seed(0))[: round(0.4 * g * g)]
    mask = torch.zeros(g * g, dtype=torch.bool)
    mask[order] = True
    mask = mask.view(1, g, g).expand(len(samples), -1, -1)
    with torch.no_grad():
        res = pipe.reconstruct(samples, mask, decode="expected")
    db = psnr(res.images.float().clamp(0, 1), samples)
    return {"images": len(samples), "masked_tokens": int(mask[0].sum()), "psnr_db": float(db.mean())}, \
        {"mim_images": res.images.float().numpy()}


def _speed(rrn: str) -> dict[str, float]:
    from hyperset.pretrained import resolve
    from hyperset.solve import Solver
    from hyperset.sudoku.data import find_split, load_csv, protocol_split

    p, _ = load_csv(find_split(rrn, "valid"))
    puzzles = ["".join(map(str, row)) for row in protocol_split(p, p, 128, 1)[0].tolist()]
    solver = Solver.load(resolve("sudoku"), "cpu")
    solver.solve(puzzles[:8])  # warm-up
    out = {}
    t0 = time.perf_counter()
    for q in puzzles[:8]:
        solver.solve([q])
    out["batch_1"] = 8 / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    solver.solve(puzzles)
    out["batch_128"] = 128 / (time.perf_counter() - t0)
    return out


def child(args: argparse.Namespace) -> None:
    import torch

    import hyperset

    torch.set_num_threads(ONE)
    where = Path(hyperset.__file__).resolve().parents[1]
    if where != Path(args.tree).resolve():
        raise SystemExit(f"same_numbers: imported hyperset from {where}, not from {args.tree}")
    if args.what == "speed":
        result: dict[str, Any] = _speed(args.rrn)
        arrays: dict[str, np.ndarray] = {}
    else:
        result, arrays = {}, {}
        for name, (r, a) in (("sudoku", _sudoku(args.rrn, args.boards)),
                             ("classifier", _classifier(args.cifar, args.images)), ("mim", _mim())):
            result[name] = r
            arrays.update(a)
    np.savez(str(args.out) + ".npz", **arrays)
    Path(str(args.out) + ".json").write_text(json.dumps(result))


# ---- the comparing process ---------------------------------------------------------------------------------

def _export(rev: str, dest: Path) -> None:
    archive = dest / "tree.tar"
    with open(archive, "wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev], stdout=f, check=True)
    with tarfile.open(archive) as t:
        t.extractall(dest / "tree", filter="data")
    archive.unlink()


def _run(tree: Path, what: str, out: Path, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=str(ONE), MKL_NUM_THREADS=str(ONE))
    cmd = [sys.executable, str(Path(__file__).resolve()), "_measure", "--tree", str(tree), "--what", what,
           "--out", str(out), "--rrn", str(Path(args.rrn).resolve()), "--boards", str(args.boards),
           "--images", str(args.images)] + (["--cifar", str(Path(args.cifar).resolve())] if args.cifar else [])
    subprocess.run(cmd, env=env, cwd=tree, check=True)
    with np.load(str(out) + ".npz") as z:
        arrays = {k: z[k] for k in z.files}
    return json.loads(Path(str(out) + ".json").read_text()), arrays


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def compare(args: argparse.Namespace) -> dict[str, Any]:
    from hyperset.device import cpu_model

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        _export(args.before, base)
        trees = {"before": base / "tree", "after": ROOT}
        numbers, arrays = {}, {}
        for side, tree in trees.items():
            print(f"  {side}: measuring the shipped models ({tree})", file=sys.stderr)
            numbers[side], arrays[side] = _run(tree, "numbers", base / f"{side}-numbers", args)
        speed: dict[str, dict[str, list[float]]] = {s: {k: [] for k in SPEEDS} for s in trees}
        for r in range(args.rounds):
            for side, tree in trees.items():
                got, _ = _run(tree, "speed", base / f"{side}-speed-{r}", args)
                for k, v in got.items():
                    speed[side][k].append(v)
            print(f"  speed round {r + 1}/{args.rounds}: " + ", ".join(
                f"{s} {speed[s]['batch_128'][-1]:.1f}" for s in trees) + " boards/s at batch 128", file=sys.stderr)
    flat = {s: _flat(numbers[s]) for s in trees}
    diffs = {k: float(np.abs(arrays["after"][k].astype(np.float64) - arrays["before"][k]).max())
             for k in arrays["after"]}
    medians = {s: {k: statistics.median(v) for k, v in speed[s].items()} for s in trees}
    return {"before": args.before, "after": _head(), "numbers": numbers,
            "same_numbers": all(flat["before"][k] == flat["after"].get(k) for k in flat["before"]),
            "max_abs_diff": diffs, "speed": {"rounds": speed, "median": medians,
                                             "after_over_before": {k: medians["after"][k] / medians["before"][k]
                                                                   for k in SPEEDS}},
            "device": f"{cpu_model()}, {ONE} thread", "command": "python bench/same_numbers.py "
            + " ".join(sys.argv[1:])}


def _head() -> str:
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return rev.stdout.strip() + (" + working tree" if dirty else "")


def report(result: dict[str, Any]) -> str:
    flat = {s: _flat(result["numbers"][s]) for s in ("before", "after")}
    lines = [f"{'':34} {'before':>12} {'after':>12}"]
    for k, v in flat["before"].items():
        lines.append(f"{k:34} {v:>12.4g} {flat['after'].get(k, float('nan')):>12.4g}")
    for k, v in result["max_abs_diff"].items():
        lines.append(f"{k + ': largest difference':34} {v:>25.3g}")
    for k, r in result["speed"]["after_over_before"].items():
        m = result["speed"]["median"]
        lines.append(f"{'speed ' + k + ' (boards/s)':34} {m['before'][k]:>12.2f} {m['after'][k]:>12.2f}  "
                     f"after/before {r:.3f}")
    lines.append("same numbers: " + ("yes" if result["same_numbers"] else "NO"))
    return "\n".join(lines)


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", default="compare", choices=["compare", "_measure"], help=argparse.SUPPRESS)
    ap.add_argument("--before", help="the revision to compare this tree with (any git revision)")
    ap.add_argument("--rrn", required=True, help="folder of the RRN-style validation CSV")
    ap.add_argument("--cifar", default=None, help="folder holding cifar-10-batches-py (optional)")
    ap.add_argument("--boards", type=bench_args.count, default=200, help="RRN validation boards")
    ap.add_argument("--images", type=bench_args.count, default=1000, help="CIFAR-10 test images, with --cifar")
    ap.add_argument("--rounds", type=bench_args.count, default=5, help="alternating speed rounds")
    ap.add_argument("--out", type=bench_args.output_file, default=RESULTS / "same_numbers.json",
                    help="the JSON to write (default bench/results/same_numbers.json)")
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    ap.add_argument("--what", dest="part", choices=["numbers", "speed"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.what == "_measure":
        args.what = args.part
        child(args)
        return
    if not args.before:
        ap.error("--before REV is required")
    from hyperset.checkpoint import atomic_write_json
    from hyperset.sudoku.data import find_split

    find_split(args.rrn, "valid")  # a missing data folder ends here, before any work
    if args.cifar and not (Path(args.cifar) / "cifar-10-batches-py").is_dir():
        raise bench_args.BenchInputError(f"--cifar {args.cifar}: no cifar-10-batches-py folder in it")
    known = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", args.before + "^{commit}"],
                           capture_output=True)
    if known.returncode:
        raise bench_args.BenchInputError(f"--before {args.before}: not a revision of this repository")
    result = compare(args)
    print(report(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
