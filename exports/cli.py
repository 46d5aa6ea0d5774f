"""`hyperset-export`: write a Hyper-SET checkpoint as an ONNX file (unrolled or Loop), check it, test parity."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click

from hyperset.cli_options import (
    OneLineCommand,
    check_output_file,
    device_option,
    echo_json,
    error_line,
    json_option,
    threads_option,
    version_option,
)
from hyperset.config import MAX_ITERS

from . import MAX_OPSET, MIN_OPSET

EXIT_OK, EXIT_PARITY, EXIT_BAD_INPUT = 0, 1, 2
SHIPPED = ("sudoku", "classifier", "mim")  # shorthands for the models shipped in the package


def resolve_checkpoint(name: str) -> Path:
    """A checkpoint folder, or the shorthand sudoku/classifier/mim for the models shipped in the package."""
    from hyperset.checkpoint import CheckpointError
    from hyperset.pretrained import PRETRAINED, pretrained_dir

    if not name.strip():  # not the current folder, as Path("") would make it
        raise CheckpointError("CHECKPOINT: an empty path (give a checkpoint folder, or one of "
                              f"{', '.join(SHIPPED)})")
    path = Path(name)
    if not path.exists() and name in PRETRAINED and name not in SHIPPED:
        raise CheckpointError(f"{name}: the shipped {name} model is not one hyperset-export writes (it exports "
                              f"{', '.join(SHIPPED)} or a checkpoint folder of such a model)")
    if path.exists() or name not in SHIPPED:
        return path
    return pretrained_dir(name)


def _fmt_parity(p: dict[str, Any]) -> str:
    return (f"iters {p['iters']:>3}: max |dlogits| {p['max_abs_logits']:.2e} (allowed {p['allowed']:.1e}; torch "
            f"fp32 from fp64 {p['fp32_error']:.1e}), predictions agree {p['prediction_agreement']:.1%}, "
            f"max rel |denergy| {p['max_rel_energy']:.1e} -> {'OK' if p['ok'] else 'MISMATCH'}")


def parity_depths(n: int, loop: bool) -> list[int]:
    """The iteration counts --parity checks: n, and with --loop also 2n, at most MAX_ITERS (once where equal)."""
    return list(dict.fromkeys([n, min(2 * n, MAX_ITERS)] if loop else [n]))


def _export(model: Any, info: dict[str, Any], out: str, n: int, loop: bool, opset: int, check: bool) -> Any:
    """Write the graph; a failed write names OUT, not the temporary file next to it."""
    from . import export as E

    try:
        if loop:
            return E.export_loop(model, out, default_iters=n, opset=opset, info=info, check=check, write_steps=True)
        return E.export_unrolled(model, n, out, opset=opset, info=info, check=check)
    except OSError as e:
        raise OSError(f"cannot write {e.filename or out}: {e.strerror or e}") from None


@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("checkpoint", type=str)
@click.option("--iters", type=click.IntRange(1, MAX_ITERS), default=None,
              help="unrolled iterations per layer (may exceed the trained depth); with --loop only the default "
                   "recorded in the metadata [default: trained depth]")
@click.option("--out", "-o", "out", type=click.Path(dir_okay=False), required=True, help="output .onnx file")
@click.option("--loop", is_flag=True,
              help="write the Loop graph (iters is a run-time input) plus OUT.step/.stem/.head.onnx next to it")
@click.option("--opset", type=click.IntRange(MIN_OPSET, MAX_OPSET), default=17, show_default=True,
              help="ONNX opset (legacy TorchScript exporter)")
@click.option("--check/--no-check", default=True, show_default=True,
              help="onnx.checker full check, and a load in ONNX Runtime (CPU), before the file is written")
@click.option("--parity", is_flag=True,
              help="compare with PyTorch in ONNX Runtime (at --iters; with --loop also at 2x --iters, at most "
                   f"{MAX_ITERS:,})")
@click.option("--parity-batch", type=click.IntRange(1, 64), default=4, show_default=True,
              help="inputs per --parity comparison")
@device_option(help="auto | cpu | cuda: the ONNX Runtime device for --parity")
@threads_option()
@json_option()
@version_option("hyperset-export")
def main(checkpoint: str, iters: int | None, out: str, loop: bool, opset: int, check: bool, parity: bool,
         parity_batch: int, device: str, threads: int | None, as_json: bool) -> None:
    """Export CHECKPOINT (a checkpoint folder, or sudoku / classifier / mim for the shipped models) to ONNX.

    Exit code 0 on success, 1 when --parity finds a mismatch, 2 on bad input (missing or corrupted checkpoint,
    unwritable output).
    """
    from hyperset.checkpoint import CheckpointError, check_finite
    from hyperset.contracts import check_contract
    from hyperset.extras import MissingExtra, require
    from hyperset.models import load_checkpoint

    try:
        require("onnx", "onnx", "onnxruntime", what="hyperset-export")
    except MissingExtra as e:
        click.echo(error_line("hyperset-export", e), err=True)
        sys.exit(EXIT_BAD_INPUT)
    from hyperset.device import set_cpu_threads

    from . import export as E
    from .runtime import OnnxModelError, ProviderError

    try:
        check_output_file("--out", out)
        if device not in ("auto", "cpu", "cuda"):
            raise click.UsageError(f"--device {device!r}: ONNX Runtime runs on auto, cpu or cuda")
        n_threads = set_cpu_threads(threads)
    except click.UsageError as e:
        _fail(e.message)
    try:
        if parity:  # the provider the parity check needs, before anything is exported
            from .runtime import choose_providers

            choose_providers(device)
        model, info = load_checkpoint(resolve_checkpoint(checkpoint), map_location="cpu")
        check_contract(model.cfg, checkpoint)
        check_finite(model, checkpoint, "finite weights to export")
        trained = E.trained_iterations(model, info)
        n = iters or trained
        started = time.time_ns() - 100_000_000  # file times come from a coarser clock
        try:
            result = _export(model, info, out, n, loop, opset, check)
            reports = []
            if parity:
                from .runtime import OrtSession

                session = OrtSession(result.path, device, intra_op_threads=n_threads)
                for k in parity_depths(n, loop):
                    reports.append(E.parity(model, result.path, k, batch=parity_batch, session=session).to_json())
        except KeyboardInterrupt:  # nothing left under the output's names: the files this export wrote go
            names = E.step_paths(out, model.cfg.n_layers)
            for p in (Path(out), *names["step"], names["stem"], names["head"]):
                with contextlib.suppress(OSError):
                    if p.is_file() and not p.is_symlink() and p.stat().st_mtime_ns >= started:
                        p.unlink()
            raise
    except (CheckpointError, OnnxModelError, ProviderError, OSError, ValueError) as e:
        _fail(str(e))

    payload = result.to_json()
    payload.update(checkpoint=checkpoint, task=model.cfg.task, layer=model.cfg.layer, trained_iterations=trained,
                   checked=check, parity=reports)
    if as_json:
        echo_json(payload)
    else:
        what = (f"Loop graph (iters is an input; default {n})" if loop
                else f"unrolled graph ({n} iterations per layer, trained depth {trained})")
        click.echo(f"wrote {result.path}: {model.cfg.task} {model.cfg.layer} model, {what}")
        click.echo(f"  {E.human_size(result.bytes)}, opset {result.opset}, {result.nodes} nodes, "
                   f"exported in {result.seconds:.1f} s"
                   f"{', onnx.checker full check and ONNX Runtime load OK' if check else ''}")
        for f in result.extra_files:
            click.echo(f"  also wrote {f} ({E.human_size(Path(f).stat().st_size)})")
        if reports:
            click.echo(f"  parity vs PyTorch on {reports[0]['provider']} (batch {reports[0]['batch']}):")
            for p in reports:
                click.echo(f"    {_fmt_parity(p)}")
    sys.exit(EXIT_OK if all(p["ok"] for p in reports) else EXIT_PARITY)


def _fail(message: str) -> NoReturn:
    click.echo(error_line("hyperset-export", message), err=True)
    sys.exit(EXIT_BAD_INPUT)


if __name__ == "__main__":
    main()
