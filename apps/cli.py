"""``hyperset-app``: serve the Hyper-SET web app (Sudoku solver and masked image reconstruction).

    hyperset-app                                # shipped models, http://127.0.0.1:7860
    hyperset-app --port 8080 --checkpoint runs/sudoku-cpu/best --mim-checkpoint runs/mim-cpu/best
    hyperset-app --backend onnx                 # Sudoku on ONNX Runtime, every iteration shown from it

Listens on the loopback interface unless ``--host`` says otherwise; a public share link only with ``--share``.
Both models are loaded once at start-up and shared by every visitor; requests are queued and run one at a time.
Request bodies, image sizes and the time per solve are capped, and a solve nobody listens to stops
(``hyperset.apps.limits``).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

from hyperset.cli_options import OneLineCommand, package_version, usage_error_line

__all__ = ["cli", "listen_problem", "main", "options", "server_name"]


@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_version(), "--version", "-V", prog_name="hyperset-app", message="%(prog)s %(version)s")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="interface to listen on (127.0.0.1 or ::1: this machine only; 0.0.0.0 or :: for all)")
@click.option("--port", type=int, default=None, help="port [default: the first free one from 7860]")
@click.option("--checkpoint", metavar="DIR", default=None,
              help="Sudoku checkpoint folder [default: the model shipped in the package]")
@click.option("--mim-checkpoint", metavar="DIR", default=None,
              help="token-model checkpoint folder for reconstruction [default: the shipped one]")
@click.option("--mim-tokenizer", metavar="PATH", default=None,
              help="tokenizer folder or VQGAN file [default: the one named by the token model, else shipped]")
@click.option("--backend", type=click.Choice(["torch", "onnx"]), default="torch", show_default=True,
              help="Sudoku solver backend; onnx exports the model to cached ONNX graphs and runs every iteration "
                   "(the frames shown) and every answer with ONNX Runtime")
@click.option("--onnx-model", metavar="FILE", default=None,
              help="use this exported .onnx file (--backend onnx; its step graphs next to it give the frames)")
@click.option("--device", default="auto", show_default=True, help="auto | cpu | cuda | mps")
@click.option("--threads", type=int, default=None,
              help="CPU threads [default: the cores that other work leaves idle at start]")
@click.option("--share", is_flag=True, help="also create a public gradio.live link (off by default)")
def cli(**kw: Any) -> None:
    """Serve the Hyper-SET web app (Gradio): the Sudoku solver streaming every iteration, and masked image
    reconstruction. Exit code 2 on bad options or models that cannot be loaded."""
    sys.exit(serve(SimpleNamespace(**kw)))


def options(argv: list[str] | None = None) -> SimpleNamespace:
    """The parsed options (defaults filled in) as attributes, without serving: for ``load_models`` and tests."""
    ctx = cli.make_context("hyperset-app", list(argv or []))
    return SimpleNamespace(**ctx.params)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bare_host(host: str) -> str:
    """``host`` without the brackets a URL puts around an IPv6 address (``[::1]`` -> ``::1``)."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def server_name(host: str) -> str:
    """``host`` as Gradio's ``server_name`` takes it: an IPv6 address in brackets (Gradio writes the name into the
    server's URL as given, and reads a bracketed name as the address inside)."""
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def listen_problem(host: str, port: int | None) -> str | None:
    """Why the app cannot listen on ``host``:``port`` (None if it can); without a port, checks the host only."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port or 0, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as err:
        return f"--host {host}: not an address or a known host name ({getattr(err, 'strerror', None) or err})"
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: a closing port is free
        try:
            s.bind(address)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return f"--port {port} is in use on {host} (choose another, or leave --port out for a free one)"
            return f"--host {host}: cannot listen there ({err.strerror})"
    return None


def _fail(message: str) -> int:
    print(f"hyperset-app: error: {message}", file=sys.stderr)
    return 2


def _ort_device_name(name: str) -> bool:
    """Whether `name` is a device ONNX Runtime's backend takes (cpu, cuda, cuda:0, auto), whatever torch has."""
    from hyperset.device import check_device_name

    try:
        kind, index = check_device_name(name)
    except ValueError:
        return False
    return kind in ("auto", "cpu") or (kind == "cuda" and index in ("", "0"))


def load_models(args: Any) -> tuple[Any, Any, str, str]:
    """(solver or None, MIM pipeline or None, note on the Sudoku model, note on the MIM model).

    A model named on the command line must load (a ``SystemExit`` message otherwise); a missing shipped model
    only disables its tab."""
    from hyperset.checkpoint import CheckpointError
    from hyperset.device import pick_device, set_cpu_threads
    from hyperset.solve import Solver
    from hyperset.vision.reconstruct import MIMWeightsMissing, load_mim

    try:
        device = pick_device(args.device)
    except Exception as err:
        # --backend onnx: ONNX Runtime judges the device for the solver (a CPU build of torch beside
        # onnxruntime-gpu can still solve on the GPU); torch, for the reconstruction tab, then runs on the CPU
        if args.backend != "onnx" or not _ort_device_name(args.device):
            raise SystemExit(_fail(f"--device {args.device}: {err}")) from None
        import torch

        device = torch.device("cpu")
        args.torch_note = f" (--device {args.device}: {err})"
    try:
        threads = set_cpu_threads(getattr(args, "threads", None))
    except ValueError as err:
        raise SystemExit(_fail(f"--threads: {err}")) from None
    solver, mim, sudoku_note, mim_note = None, None, "", ""
    try:
        solver = Solver.load(args.checkpoint, device=str(device) if args.backend == "torch" else "cpu")
    except (CheckpointError, FileNotFoundError, OSError, ValueError) as err:
        if args.checkpoint:
            raise SystemExit(_fail(f"cannot load the Sudoku checkpoint {args.checkpoint}: {err}")) from None
        sudoku_note = f"The shipped Sudoku model is not in this package ({err}); start with --checkpoint DIR."
    if solver is not None and args.backend == "onnx":
        try:
            from hyperset.backends import backend_factory  # the "onnx" entry point: hyperset.exports

            create_backend = backend_factory("onnx")
            solver = solver.with_backend(create_backend(solver.model, info=solver.info, path=args.onnx_model,
                                                        device=args.device, threads=threads))
        except Exception as err:
            raise SystemExit(_fail(f"cannot start the ONNX backend: {type(err).__name__}: {err}")) from None
        try:  # the app draws every iteration: the backend must read the board after each one
            solver.check_iters(solver.default_iters, per_iteration=True)
        except ValueError as err:
            raise SystemExit(_fail(f"cannot start the ONNX backend: {err}")) from None
    elif args.onnx_model and args.backend != "onnx":
        raise SystemExit(_fail("--onnx-model needs --backend onnx"))
    try:
        mim = load_mim(args.mim_checkpoint, tokenizer=args.mim_tokenizer, device=device)
    except MIMWeightsMissing as err:
        mim_note = f"{err}. Start with --mim-checkpoint DIR."
    except (CheckpointError, FileNotFoundError, OSError, ValueError) as err:
        if args.mim_checkpoint or args.mim_tokenizer:
            raise SystemExit(_fail(f"cannot load the reconstruction model: {err}")) from None
        mim_note = f"The shipped reconstruction model could not be loaded ({err}); start with --mim-checkpoint DIR."
    return solver, mim, sudoku_note, mim_note


def main(argv: list[str] | None = None) -> int:
    """``hyperset-app``: the exit code (2 on bad options, as a one-line error)."""
    try:
        return cli.main(args=argv, prog_name="hyperset-app", standalone_mode=False) or 0
    except SystemExit as stop:
        return int(stop.code or 0)
    except click.exceptions.Exit as stop:  # --help, --version
        return stop.exit_code
    except click.UsageError as err:
        click.echo(usage_error_line(err, "hyperset-app"), err=True)
        return err.exit_code
    except click.ClickException as err:
        err.show()
        return err.exit_code


def serve(args: Any) -> int:
    """Check the options, load the models and serve until Ctrl+C; the exit code."""
    from hyperset.extras import MissingExtra, require

    try:  # before the models load: without Gradio there is nothing to serve them with
        require("app", "gradio", "PIL", what="hyperset-app")
    except MissingExtra as err:
        return _fail(str(err))
    if args.threads is not None and args.threads < 1:
        return _fail(f"--threads: threads must be at least 1, got {args.threads}")
    if args.port is not None and not 0 < args.port < 65536:
        return _fail(f"--port must be 1-65535 (got {args.port})")
    args.host = _bare_host(args.host)
    if problem := listen_problem(args.host, args.port):
        return _fail(problem)
    for name in ("checkpoint", "mim_checkpoint", "onnx_model"):
        value = getattr(args, name)
        if value and not Path(value).exists():
            return _fail(f"--{name.replace('_', '-')} {value}: no such file or folder")
    try:
        solver, mim, sudoku_note, mim_note = load_models(args)
    except SystemExit as stop:
        return int(stop.code or 2)
    if solver is None and mim is None:
        return _fail(f"no model to serve. {sudoku_note} {mim_note}".strip())

    from .gradio_start import import_gradio, no_interim_apps

    import_gradio()  # Gradio without the work it does for its own development (hyperset.apps.gradio_start)
    from .app import build_demo, launch_kwargs

    with no_interim_apps():  # launch() makes the app it serves
        demo = build_demo(solver, mim, sudoku_note, mim_note)
    if solver is not None:
        line = f"Sudoku: {solver.backend_name} on {solver.device_name()}, trained depth {solver.trained_iters}"
        if solver.backend is not None:
            session = getattr(solver.backend, "session", None)
            provider = getattr(session, "provider", None)
            line += (f"; ONNX Runtime provider used: {provider} ({solver.backend.path}); every frame comes from "
                     "ONNX Runtime (the exported step graph)")
        print(line)
    else:
        print(f"Sudoku tab disabled: {sudoku_note}")
    if mim is not None:
        print(f"Reconstruction: torch on {mim.device}{getattr(args, 'torch_note', '')}, {mim.image_size}x"
              f"{mim.image_size} images, trained depth {mim.trained_iters}")
    else:
        print(f"Reconstruction tab disabled: {mim_note}")
    if not _is_loopback(args.host):
        print(f"Note: listening on {args.host}, reachable from other machines.")
    if args.share:
        print("Note: --share creates a public link that anyone with the address can use.")
    try:
        demo.launch(server_name=server_name(args.host), server_port=args.port, share=args.share,
                    prevent_thread_lock=True, quiet=True, **launch_kwargs())
    except Exception as err:  # the port was taken meanwhile, no free port from 7860, an address Gradio refuses
        with contextlib.suppress(Exception):
            demo.close()
        reason = str(err) if isinstance(err, OSError) else f"{type(err).__name__}: {err}"
        return _fail(f"cannot start the server: {' '.join(reason.split())}")
    print(f"Running on {demo.local_url}", flush=True)
    if args.share and getattr(demo, "share_url", None):
        print(f"Public link: {demo.share_url}", flush=True)
    return serve_until_stopped(demo)


def serve_until_stopped(demo: Any) -> int:
    """Wait while the server runs; Ctrl-C closes it with one line and the shell's 130 (gradio's block_thread()
    swallows the Ctrl-C and returns, so the exit code would be 0). 0 when the server stops by itself."""
    try:
        while demo.is_running:
            time.sleep(0.1)
    except KeyboardInterrupt:
        print("hyperset-app: interrupted", file=sys.stderr)
        with contextlib.suppress(Exception):
            demo.close()
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
