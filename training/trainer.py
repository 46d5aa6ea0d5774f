"""The shared-core trainer: one loop for every task (Sudoku, classification, masked image modeling).

A task supplies the model config, deterministic batches for a given step, the loss and the evaluation. The
trainer owns everything else: device and mixed precision, the optimizer and schedule, clipping, progress,
JSON-lines metrics, best-on-validation selection, periodic atomic checkpoints and exact `--resume`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from hyperset.checkpoint import (
    CheckpointError,
    atomic_write_bytes,
    check_finite,
    checkpoint_dir,
    load_weights_into,
    read_config,
    read_json_file,
)
from hyperset.cli_options import stdout_to_devnull
from hyperset.config import TableError, check_table
from hyperset.device import autocast_dtype, autocast_name, describe, pick_device

from .state import check_run, load_training_state, recover_folder, replace_folder, run_lock, save_training_state
from .task import Task

__all__ = ["DivergedError", "Task", "TrainConfig", "Trainer", "lr_at", "parse_schedule"]

# the largest global batch a recipe may ask for: far past what fits in memory at once (accum_steps splits a batch)
MAX_BATCH = 65_536
# the values a recipe's [train] table may give these keys
CHOICES = {"optimizer": ("adamw", "adam"), "schedule": ("cosine", "constant"), "amp": ("auto", "off", "bf16", "fp16"),
           # torch.compile's `mode`; reduce-overhead also replays the compiled graphs as CUDA graphs (on CUDA)
           "compile_mode": ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")}


@dataclass
class TrainConfig:
    """Optimisation recipe. Steps count optimizer updates; `epochs` recipes are converted by the task."""

    steps: int = 1000
    batch_size: int = 32
    optimizer: str = "adamw"  # adamw (decoupled wd) | adam (coupled L2, the paper's image recipe)
    lr: float = 1e-3
    min_lr: float = 1e-5
    warmup_steps: int = 0
    schedule: str = "cosine"  # cosine | constant
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    clip: float = 1.0
    amp: str = "auto"  # auto | off | bf16 | fp16
    compile: bool = False
    compile_mode: str = "default"  # with compile = true: torch.compile's mode (reduce-overhead: CUDA graphs on CUDA)
    seed: int = 0
    eval_every: int = 500
    log_every: int = 20
    save_every_seconds: float = 300.0
    threads: int = 0  # 0: torch default
    accum_steps: int = 1  # gradient accumulation: the global batch is split into this many micro-steps

    def __post_init__(self) -> None:
        # the types first (as from_dict checks a recipe's): TrainConfig(steps=1.5) or compile="no" went on silently
        check_table(type(self), {f.name: getattr(self, f.name) for f in fields(self)}, "train")
        checks = [  # (holds, the key it is about, what to say)
            (self.steps >= 1 and self.batch_size >= 1 and self.accum_steps >= 1, "steps",
             f"train.steps, batch_size and accum_steps must be >= 1, got {self.steps}, {self.batch_size} and "
             f"{self.accum_steps}"),
            (self.batch_size <= MAX_BATCH, "batch_size",
             f"train.batch_size = {self.batch_size}: must be at most {MAX_BATCH:,} (the global batch; it has to fit "
             "in memory in accum_steps parts)"),
            (self.eval_every >= 1 and self.log_every >= 1, "eval_every",
             f"train.eval_every and log_every must be >= 1, got {self.eval_every} and {self.log_every}"),
            (self.warmup_steps >= 0, "warmup_steps", f"train.warmup_steps = {self.warmup_steps}: must be >= 0"),
            (0 <= self.threads <= 1024, "threads",
             f"train.threads = {self.threads}: must be between 0 (torch's default) and 1024"),
            (0 < self.lr < math.inf, "lr", f"train.lr = {self.lr!r}: must be a positive finite number"),
            (0 <= self.min_lr <= self.lr, "min_lr",
             f"train.min_lr = {self.min_lr!r}: must be between 0 and train.lr = {self.lr!r} (the cosine falls from "
             "lr to min_lr)"),
            (0 <= self.weight_decay < math.inf, "weight_decay",
             f"train.weight_decay = {self.weight_decay!r}: must be >= 0"),
            (len(self.betas) == 2 and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in self.betas), "betas",
             f"train.betas = {list(self.betas)!r}: must be two numbers in [0, 1)"),
            (self.save_every_seconds >= 0, "save_every_seconds",
             f"train.save_every_seconds = {self.save_every_seconds!r}: must be >= 0"),
            (0 <= self.clip < math.inf, "clip",
             f"train.clip = {self.clip!r}: must be a finite number >= 0 (0: no clipping)"),
            (self.seed >= 0, "seed", f"train.seed = {self.seed}: must be >= 0"),
            (self.batch_size % self.accum_steps == 0, "accum_steps",
             f"train.accum_steps = {self.accum_steps}: must divide train.batch_size = {self.batch_size}"),
            (self.compile or self.compile_mode == "default", "compile_mode",
             f"train.compile_mode = {self.compile_mode!r} is torch.compile's mode: it needs train.compile = true"),
        ] + [(getattr(self, key) in allowed, key, f"train.{key} must be one of {', '.join(allowed)}, got "
                                                  f"{getattr(self, key)!r}") for key, allowed in CHOICES.items()]
        for ok, key, message in checks:
            if not ok:
                raise TableError(message, "train", key)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        check_table(cls, data, "train")
        data = dict(data)
        if "betas" in data:
            data["betas"] = tuple(data["betas"])
        return cls(**data)


class DivergedError(RuntimeError):
    """The loss or the weights stopped being finite; nothing of the diverged steps was saved."""


def split_batch(batch: dict[str, torch.Tensor], parts: int) -> list[dict[str, torch.Tensor]]:
    """Split every tensor of a batch into `parts` equal row chunks (processes x accumulation steps)."""
    if parts == 1:
        return [batch]
    chunks = {k: v.chunk(parts) for k, v in batch.items()}
    return [{k: c[i] for k, c in chunks.items()} for i in range(parts)]


@dataclass
class DistEnv:
    """The process group as torchrun sets it up (WORLD_SIZE, RANK, LOCAL_RANK); one process otherwise."""

    world: int
    rank: int
    device: torch.device
    owns_group: bool = False  # this setup created the process group, so close() destroys it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def setup(cls, requested: str) -> DistEnv:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls(1, 0, pick_device(requested))
        device = pick_device(requested)
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        owns = not dist.is_initialized()
        if owns:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return cls(dist.get_world_size(), dist.get_rank(), device, owns)

    def close(self) -> None:
        """Destroy the process group this setup created. A process that exits with it alive can abort in gloo's
        or NCCL's threads during interpreter shutdown ("terminate called without an active exception")."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_group = False

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.world == 1:
            return model
        ids = [self.device.index] if self.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def maybe_no_sync(self, net: torch.nn.Module, sync: bool) -> Any:
        if self.world == 1 or sync:
            return contextlib.nullcontext()
        return net.no_sync()

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over processes (each holds its share of a weighted mean over the global batch)."""
        if self.world > 1:
            values = values.clone()
            dist.all_reduce(values)
        return values

    def any(self, flag: bool) -> bool:
        if self.world == 1:
            return bool(flag)
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t)
        return bool(t.item() > 0)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def lr_at(step: int, cfg: TrainConfig, steps: int | None = None) -> float:
    """Linear warm-up, then cosine from lr to min_lr exactly at the last step (or constant); `steps` is the budget
    of the cosine (default cfg.steps: a piecewise schedule passes its segment's)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    span = max((steps or cfg.steps) - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def parse_schedule(spec: str) -> list[dict[str, int]]:
    """A piecewise lr plan: "FROM:STEPS,..." (from step FROM on, a cosine over STEPS steps), or a JSON file or run
    folder whose `schedule` list was recorded by another run (config.json / trainer.json), to replay its budget."""
    path = Path(spec)
    if path.exists():
        files = [path] if path.is_file() else [path / "trainer.json", path / "config.json", path / "last/trainer.json"]
        for f in files:
            if f.is_file():
                try:
                    plan = read_json_file(f, "a JSON object with a 'schedule' list").get("schedule")
                except AttributeError:
                    raise ValueError(f"{f}: not a JSON object with a 'schedule' list") from None
                except CheckpointError as e:
                    raise ValueError(str(e)) from None
                if plan:
                    return check_schedule(plan, str(f))
        raise ValueError(f"{spec}: no recorded 'schedule' list found in {', '.join(str(f) for f in files)}")
    plan = []
    for part in spec.split(","):
        try:
            start, steps = part.split(":")
            plan.append({"from_step": int(start), "steps": int(steps)})
        except ValueError:
            also = (f", or a run folder or JSON file that records one ({spec} does not exist)"
                    if ":" not in spec or "/" in spec or spec.endswith(".json") else "")
            raise ValueError(f"--schedule {spec!r}: expected FROM:STEPS[,FROM:STEPS...] "
                             f"(e.g. 0:30000,13166:22000){also}, got {part!r}") from None
    return check_schedule(plan, "--schedule")


def check_schedule(plan: list[dict[str, int]], where: str) -> list[dict[str, int]]:
    if not isinstance(plan, list) or not plan:
        raise ValueError(f"{where}: a schedule is a non-empty list of {{from_step, steps}} entries, got {plan!r}")
    try:
        plan = [{"from_step": int(p["from_step"]), "steps": int(p["steps"])} for p in plan]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{where}: each schedule entry needs integer from_step and steps") from None
    if plan[0]["from_step"] != 0:
        raise ValueError(f"{where}: the schedule must start at step 0, not {plan[0]['from_step']}")
    for a, b in zip(plan, plan[1:]):
        if b["from_step"] <= a["from_step"]:
            raise ValueError(f"{where}: schedule steps must increase ({a['from_step']} then {b['from_step']})")
    for p in plan:
        if p["steps"] <= p["from_step"]:
            raise ValueError(f"{where}: a segment from step {p['from_step']} cannot end at step {p['steps']}")
    return plan


def segment_budget(plan: list[dict[str, int]], step: int) -> int:
    """The step budget whose cosine applies at `step` under a piecewise plan."""
    return next(p["steps"] for p in reversed(plan) if step >= p["from_step"])


def compile_problem(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot run on `device` in this environment, or None when it can: a one-line function is
    compiled and run once. On a CPU the compiler needs a working C++ compiler (``CXX``, else g++), on a GPU Triton."""
    try:
        torch.compile(lambda t: t * 2 + 1)(torch.ones(4, device=device))
    except Exception as e:  # torch.compile's errors share no base class narrower than Exception
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    return None


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r} (adamw or adam)")


@dataclass
class _Run:
    """The state one fit shares between its steps, its logging and its checkpoints."""

    env: DistEnv
    model: torch.nn.Module  # this process's replica (what is saved and evaluated)
    opt: torch.optim.Optimizer
    step_model: torch.nn.Module  # the model wrapped for DDP (and compiled): what the loss runs
    scaler: torch.amp.GradScaler
    autocast: Callable[[], Any]
    micro: int  # processes x accumulation steps: the parts of a global batch
    cuda_graphs: bool = False  # the compiled graphs replay as CUDA graphs: every micro-step marks a new one
    step: int = 0
    best: float = -math.inf
    best_metrics: dict[str, float] = field(default_factory=dict)
    t0: float = 0.0
    last_save: float = 0.0
    lr: float = 0.0
    # since the last log line, on the device: this process's shares of the loss and the logged values (summed
    # over steps; an all-reduce at the log adds the other processes' shares), the gradient norms, the steps
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    count: int = 0
    eval_pending: bool = False  # last/ was saved when the evaluation of its step failed: evaluate it first

    @property
    def device(self) -> torch.device:
        return self.env.device

    @property
    def elapsed(self) -> float:
        """Seconds of training so far, the resumed run's earlier ones included."""
        return time.time() - self.t0


class _Unbreakable:
    """Standard error for the progress bar, as it is when each write happens (a test may replace it), where a
    failed write (the reader of a `2>&1 | tee` pipe ended by the same Ctrl-C, a closed terminal) is dropped: the
    bar must never stop a run before it saves."""

    def write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(sys.stderr, name)


@dataclass
class Trainer:
    """One training run of a task: ``fit`` = resume, then train steps, with logging, evaluation and checkpoints
    at their intervals, until the step budget or a stop signal (SIGTERM / SIGINT: the state is saved first)."""

    task: Task
    cfg: TrainConfig
    out: Path
    device: str = "auto"
    resume: bool = False
    recipe_name: str = ""
    quiet: bool = False
    # a planned piecewise schedule (parse_schedule); it sets the total steps and replaces --steps
    plan: list[dict[str, int]] | None = None
    # a checkpoint folder whose weights a new run starts from (a fine-tune); a resumed run ignores it
    init_from: str | None = None
    # the command-line settings the run was started with (--set, --steps, ...), kept in last/trainer.json so that
    # --resume alone continues the run as it was started (hyperset-train reads them back: `recorded_command`)
    command: dict[str, Any] | None = None
    _stop: bool = field(default=False, init=False)
    _stop_signal: int | None = field(default=None, init=False)  # the signal that asked the run to stop
    _stop_reason: str | None = field(default=None, init=False)  # why `stop` asked the run to stop
    _main: bool = field(default=True, init=False)  # this process reports the run (rank 0)
    # the lr schedules this run has followed: [{"from_step": s, "steps": n}, ...]; a resume with another --steps
    # adds an entry (the cosine is then recomputed over the new budget from that step on)
    _schedule: list[dict[str, int]] = field(default_factory=list, init=False)
    # the step of the state in last/ (None: nothing saved yet), named when a run diverges
    _saved_step: int | None = field(default=None, init=False)
    _checked_step: int | None = field(default=None, init=False)  # the step whose weights _check_finite passed

    def __post_init__(self) -> None:
        if not isinstance(self.cfg, TrainConfig):
            raise TypeError(f"cfg must be a TrainConfig (TrainConfig.from_dict makes one), got "
                            f"{type(self.cfg).__name__}")
        self.out = Path(self.out)  # a str works as well
        for name in ("resume", "quiet"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.plan is not None:
            self.plan = check_schedule(self.plan, "plan")

    # ------------------------------------------------------------------------------------------------ the run

    def fit(self) -> dict[str, Any]:
        if self.plan:
            self.cfg = replace(self.cfg, steps=self.plan[-1]["steps"])
        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        env = DistEnv.setup(self.device)
        self.quiet = self.quiet or not env.is_main
        self._main = env.is_main
        with contextlib.ExitStack() as held:
            held.callback(env.close)  # last out, after the lock is released
            if env.is_main:
                self.out.mkdir(parents=True, exist_ok=True)
                held.enter_context(run_lock(self.out))  # before anything in the folder is read or changed
                for folder in ("last", "best"):
                    recover_folder(self.out / folder)
                for stale in self.out.glob(".metrics.jsonl.*.tmp"):  # a rewrite of the log cut short by a kill
                    stale.unlink(missing_ok=True)
            env.barrier()
            return self._train(env)

    def _train(self, env: DistEnv) -> dict[str, Any]:
        cfg = self.cfg
        run = self._start(env)
        # SIGHUP: the terminal or ssh connection closed; a signal already ignored (SIGHUP under nohup) stays ignored
        stops = [s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None))
                 if s is not None and signal.getsignal(s) is not signal.SIG_IGN]
        old_handlers = {s: signal.signal(s, self._handle_signal) for s in stops}
        bar = tqdm(total=cfg.steps, initial=run.step, disable=self.quiet, dynamic_ncols=True, file=_Unbreakable(),
                   mininterval=1.0 if sys.stderr.isatty() else 60.0, desc=self.task.name)
        try:
            if run.eval_pending:  # the evaluation that failed at the step last/ holds
                self._evaluate_and_checkpoint(run)
            while run.step < cfg.steps and not self._agreed(run, self._stop):
                self._train_step(run)
                bar.update(1)
                if run.step % cfg.log_every == 0 or run.step == cfg.steps:
                    self._log_interval(run, bar)
                if run.step % cfg.eval_every == 0 or run.step == cfg.steps:
                    self._evaluate_and_checkpoint(run)
                elif self._agreed(run, time.time() - run.last_save > cfg.save_every_seconds):
                    self._save_last(run, self._pending(run))
                    run.last_save = time.time()
            bar.close()
            # the final save runs under the same handlers: a second Ctrl-C / SIGTERM while it writes is noted, not
            # obeyed (the default handlers stopped it half-way, losing the steps since the last save)
            self._save_last(run, self._pending(run))
        finally:
            bar.close()
            for s, h in old_handlers.items():
                signal.signal(s, h)
        env.barrier()
        stopped = env.any(self._stop)
        # best: the selection metric of best/, None before the first evaluation (best/ does not exist yet)
        return {"step": run.step, "steps": cfg.steps, "best": run.best if math.isfinite(run.best) else None,
                "best_metrics": run.best_metrics, "out": str(self.out), "finished": run.step >= cfg.steps,
                "stopped_by": (signal.Signals(self._stop_signal).name if self._stop_signal else
                               self._stop_reason or "another process")
                if stopped and run.step < cfg.steps else None,
                "world_size": env.world, "rank": env.rank}

    def _agreed(self, run: _Run, flag: bool) -> bool:
        """A decision every process takes together (stop, save on the clock): one process reads its flag at every
        step; a process group agrees on it (one all-reduce) at logging intervals only."""
        if run.env.world == 1:
            return flag
        return run.env.any(flag) if run.step % self.cfg.log_every == 0 else False

    # ------------------------------------------------------------------------------------------------ resume

    def _start(self, env: DistEnv) -> _Run:
        """The model and optimizer, from last/ when resuming (with the schedule ledger), wrapped for the run."""
        cfg, device = self.cfg, env.device
        torch.manual_seed(cfg.seed)
        model = self.task.build_model().to(device)
        self.model = model  # the trained module (this process's replica), for callers that inspect it
        opt = make_optimizer(model, cfg)
        self._saved_step = self._checked_step = None
        progress = self._resume(model, opt)
        if env.is_main:
            self._trim_log(progress["step"])
        if self.init_from and progress["step"] == 0:
            self._start_from(model, Path(self.init_from))
        micro = env.world * cfg.accum_steps
        if cfg.batch_size % micro:
            raise ValueError(f"global batch {cfg.batch_size} is not divisible by processes x accum-steps = {micro}")
        net = env.wrap(model)
        # fp16 needs loss scaling; bf16 and fp32 do not
        scaler = torch.amp.GradScaler(device.type, enabled=self._amp_dtype(device) == torch.float16)
        compiled = cfg.compile
        if compiled and (problem := compile_problem(device)) is not None:
            self._warn(f"train.compile = true, but torch.compile does not work on {device.type} here ({problem}): "
                      f"training without it (the same results, slower)")
            compiled = False
        mode = None if cfg.compile_mode == "default" else cfg.compile_mode
        cuda_graphs = compiled and cfg.compile_mode == "reduce-overhead"
        if cuda_graphs and device.type != "cuda":
            self._warn(f"train.compile_mode = reduce-overhead: CUDA graphs need a CUDA device; on {device.type} it "
                      "compiles as the default mode does")
            cuda_graphs = False
        run = _Run(env, model, opt, torch.compile(net, mode=mode) if compiled else net, scaler,
                   self._autocast(device), micro, cuda_graphs, step=progress["step"], best=progress["best"],
                   best_metrics=progress["best_metrics"], t0=time.time() - progress["elapsed"],
                   last_save=time.time())
        if progress.get("pending") is not None:
            self._restore_pending(run, progress["pending"])
        run.eval_pending = bool(progress.get("eval_pending"))
        self._say(f"training {self.task.name} on {describe(device)} x {env.world} process(es): "
                  f"{sum(p.numel() for p in model.parameters()):,} parameters, {cfg.steps} steps, global batch "
                  f"{cfg.batch_size} ({cfg.batch_size // micro} per process and micro-step, {cfg.accum_steps} "
                  f"accumulation steps), lr {cfg.lr:g}, amp={cfg.amp}")
        return run

    def _resume(self, model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
        """Load last/ into model and optimizer when resuming and set the schedule ledger; the progress to go on
        from (step 0 for a new run)."""
        cfg, last_dir = self.cfg, self.out / "last"
        self._schedule = [{"from_step": 0, "steps": segment_budget(self.plan, 0) if self.plan else cfg.steps}]
        fresh = {"step": 0, "best": -math.inf, "best_metrics": {}, "elapsed": 0.0}
        if not (last_dir / "trainer.json").is_file():
            # last/ is there (replace_folder names no folder before it is whole) but not its progress: someone
            # else's files or a damaged state; a new run would overwrite it, best/ and the log. (best/ alone is
            # what a kill during the first save leaves: that run starts again.)
            if last_dir.exists():
                raise CheckpointError(f"{last_dir} has no trainer.json: not a training state this command can "
                                      "resume, and a new run would overwrite it; move it away or choose another "
                                      "--out")
            # a finished run whose last/ was removed keeps best/ and its log: a new run would replace both
            log = self.out / "metrics.jsonl"
            earlier = [name for name, there in (("best", (self.out / "best").is_dir()),
                                                ("metrics.jsonl", log.is_file() and log.stat().st_size > 0)) if there]
            if earlier and not self.resume:
                raise CheckpointError(f"{self.out} holds an earlier run's {' and '.join(earlier)} but no last/ to "
                                      "resume from; a new run would replace them: choose another --out (or remove "
                                      "them to start over there)")
            if self.resume:
                self._warn(f"nothing to resume in {self.out} (no {last_dir / 'trainer.json'}): starting a new run")
            return fresh
        if not self.resume:
            raise ValueError(f"{self.out} already holds a training run; pass --resume to continue it "
                             "or choose another --out")
        # the state is global (replicas are identical), so any number of processes can resume it
        check_run(last_dir, self.task.name, self.recipe_name)
        progress = {**fresh, **load_training_state(last_dir, model, opt)}
        start = progress["step"]
        self._saved_step = start
        if cfg.steps < start:
            raise ValueError(f"the run in {self.out} is at step {start}; --steps {cfg.steps} would end it before "
                             "that (give at least the steps it has done)")
        self._say(f"resumed from {last_dir} at step {start} (best {self.task.select_metric} = {progress['best']})")
        self._schedule = (check_schedule(progress["schedule"], str(last_dir / "trainer.json"))
                          if progress.get("schedule") else
                          [{"from_step": 0, "steps": progress.get("saved_steps") or cfg.steps}])
        before = self._schedule[-1]["steps"]
        if self.plan:
            for boundary in sorted({p["from_step"] for p in self._schedule + self.plan if p["from_step"] < start}):
                had, planned = segment_budget(self._schedule, boundary), segment_budget(self.plan, boundary)
                if had != planned:
                    raise ValueError(f"the run in {self.out} followed a cosine over {had} steps at step "
                                     f"{boundary}, the planned schedule says {planned}; it cannot be replayed")
        elif before != cfg.steps:
            self._schedule.append({"from_step": start, "steps": cfg.steps})
            self._say(f"schedule changed at step {start}: {before} -> {cfg.steps} steps "
                      f"(lr {lr_at(start, cfg, before):.3g} -> {lr_at(start, cfg):.3g})")
        return progress

    def _start_from(self, model: torch.nn.Module, directory: Path) -> None:
        """Load another checkpoint's weights (same shapes) into a new run's model; a time network trained dead
        (time_init "zero") is revived when this run's model asks for a live one (outputs unchanged), and the step
        sizes' output layer starts again where this run's model constrains them positive and the source's were
        signed (`StepSizes.restart_positive`)."""
        source = checkpoint_dir(directory)
        load_weights_into(model, source, "weights to start from")
        check_finite(model, directory, "finite weights to start from (--init-from)")
        notes = []
        core = getattr(model, "core", None)
        sizes = core.step_sizes if core is not None else None
        if sizes is not None and core.cfg.time_init == "live" and sizes.revive_time_network():
            notes.append("its dead time network revived (L1 re-initialised)")
        signed = read_config(source).get("model", {}).get("step_sign", "signed") != "positive"
        if sizes is not None and signed and sizes.restart_positive():
            notes.append("its signed step sizes' output layer restarted positive (alpha = gamma = step_init)")
        self._say(f"weights from {directory}" + "".join(f"; {n}" for n in notes))

    # ------------------------------------------------------------------------------------------------ a step

    def _lr(self, step: int) -> float:
        """The learning rate of a step under the schedule it follows (a planned segment starting here enters the
        ledger)."""
        budget = segment_budget(self.plan or self._schedule, step)  # a resume without a plan: its record
        if budget != self._schedule[-1]["steps"]:  # a planned segment starts here
            self._schedule.append({"from_step": step, "steps": budget})
            self._say(f"planned schedule: from step {step} a cosine over {budget} steps "
                      f"(lr {lr_at(step, self.cfg, self._schedule[-2]['steps']):.3g} -> "
                      f"{lr_at(step, self.cfg, budget):.3g})")
        return lr_at(step, self.cfg, budget)

    def _train_step(self, run: _Run) -> None:
        """One optimizer update on the global batch of run.step: this process's micro-batches, each weighted by
        its share of the supervised units, gradients accumulated, clipped, applied. Nothing is read back to the
        host here: the loss and logged values are summed on the device for the next log line."""
        cfg, env, task = self.cfg, run.env, self.task
        run.lr = self._lr(run.step)
        for group in run.opt.param_groups:
            group["lr"] = run.lr
        run.model.train()
        pieces = split_batch(task.batch(run.step, cfg.batch_size, cfg.seed, run.device), run.micro)
        weights = [task.loss_weight(p) for p in pieces]
        total = sum(weights)
        run.opt.zero_grad(set_to_none=True)
        mine = range(env.rank * cfg.accum_steps, (env.rank + 1) * cfg.accum_steps)
        for j, i in enumerate(mine):
            if run.cuda_graphs:
                # a new replay of the graphs: the previous micro-step's outputs (read into run.sums) may be
                # overwritten, which the CUDA graph trees otherwise guard against by copying or by refusing
                torch.compiler.cudagraph_mark_step_begin()
            with env.maybe_no_sync(run.step_model, j == cfg.accum_steps - 1), run.autocast():
                loss, logs = task.loss(run.step_model, pieces[i])
            # weighted so that micro-batches and processes add up to the mean over the global batch;
            # DDP averages gradients over processes, hence the factor world
            share = weights[i] / total
            run.scaler.scale(loss * (share * env.world)).backward()
            self._accumulate(run, {"loss": loss, **logs}, share)
        run.scaler.unscale_(run.opt)
        grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.clip if cfg.clip > 0 else 1e9)
        run.scaler.step(run.opt)
        run.scaler.update()
        self._accumulate(run, {"grad_norm": grad_norm}, 1.0 / env.world)  # the same on every process
        run.step += 1
        run.count += 1

    @staticmethod
    def _accumulate(run: _Run, values: dict[str, torch.Tensor | float], weight: torch.Tensor | float) -> None:
        dtype = torch.float32 if run.device.type == "mps" else torch.float64
        for k, v in values.items():
            v = torch.as_tensor(v).detach().to(run.device, dtype) * weight
            run.sums[k] = run.sums[k] + v if k in run.sums else v

    def _log_interval(self, run: _Run, bar: Any) -> None:
        """The means since the last log line (one all-reduce, one read to the host): metrics.jsonl and the
        progress bar; a loss that stopped being finite ends the run here (nothing of it is saved)."""
        pending = self._pending(run)
        keys = sorted(pending["sums"])
        means = {k: v / pending["count"] for k, v in pending["sums"].items()}
        run.sums, run.count = {}, 0
        if not math.isfinite(means.get("loss", 0.0)):
            raise self._diverged(run.step, f"the loss became {means['loss']}")
        if run.env.is_main:
            # refresh=False: drawn at the bar's next update, within its mininterval (60 s off a terminal: a log
            # file gets a frame a minute, not one at every log line)
            bar.set_postfix({k: f"{v:.3f}" for k, v in means.items() if k in ("loss", "acc")}, refresh=False)
            self._log({"step": run.step, "time": round(run.elapsed, 3), "lr": run.lr,
                       **{k: means[k] for k in ("loss", *sorted(set(keys) - {"loss", "grad_norm"}), "grad_norm")}})

    # ------------------------------------------------------------------------------------------------ checkpoints

    def _evaluate_and_checkpoint(self, run: _Run) -> None:
        """Evaluate (main process); a new best goes to best/, the state to last/."""
        pending = self._pending(run)  # every process takes part in its sum
        if run.env.is_main:
            try:
                metrics = self.task.evaluate(run.model, run.device, run.autocast)
            except Exception as e:  # e.g. an unreadable validation image: the steps trained so far are kept
                run.eval_pending = True  # a resumed run evaluates this step first
                self._save_last(run, pending)
                if not isinstance(e, (ValueError, OSError)):
                    raise
                raise ValueError(f"evaluation at step {run.step} failed: {e}; the state at step {run.step} is in "
                                 f"{self.out / 'last'}: fix the cause and continue with --resume") from None
            run.eval_pending = False
            self._log({"step": run.step, "time": round(run.elapsed, 3), "eval": metrics})
            score = metrics[self.task.select_metric]
            if score > run.best:
                self._check_finite(run)
                run.best, run.best_metrics = score, metrics
                info = self._info(run.device, run.step, metrics)
                with self._writing(self.out / "best", run.step):
                    replace_folder(self.out / "best", partial(self._save, model=run.model, info=info))
            self._save_last(run, pending)
            self._say(f"step {run.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        run.env.barrier()
        run.last_save = time.time()

    def _pending(self, run: _Run) -> dict[str, Any] | None:
        """The sums of the steps since the last log line over every process (one all-reduce; every process calls
        it at the same step), for last/: a resumed run's next log line then covers the same steps, with the same
        means, as that of an uninterrupted run. None when the last step was logged."""
        if run.count == 0:
            return None
        keys = sorted(run.sums)
        values = run.env.sum(torch.stack([run.sums[k] for k in keys])).tolist()
        return {"count": run.count, "sums": dict(zip(keys, values))}

    def _restore_pending(self, run: _Run, pending: Any) -> None:
        """Put back the sums `_pending` saved: their values on the main process, zeros under the same names on the
        others (the next log line sums over processes, which must hold the same names)."""
        where = self.out / "last" / "trainer.json"
        if not (isinstance(pending, dict) and isinstance(pending.get("count"), int) and pending["count"] > 0
                and isinstance(pending.get("sums"), dict)
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pending["sums"].values())):
            raise CheckpointError(f"{where}: pending = {pending!r} is not the sums of unlogged steps")
        run.count = pending["count"]
        dtype = torch.float32 if run.device.type == "mps" else torch.float64
        run.sums = {k: torch.tensor(float(v) if run.env.is_main else 0.0, dtype=dtype, device=run.device)
                    for k, v in pending["sums"].items()}

    def _save_last(self, run: _Run, pending: dict[str, Any] | None) -> None:
        """The training state (weights, optimizer, RNG, progress, the sums of the steps not yet logged) to last/,
        from the main process, once the weights passed _check_finite."""
        if not run.env.is_main:
            return
        self._check_finite(run)
        progress = {"step": run.step, "best": run.best, "best_metrics": run.best_metrics,
                    "elapsed": run.elapsed, "world_size": run.env.world, "schedule": self._schedule}
        if self.command:
            progress["command"] = self.command
        if pending:
            progress["pending"] = pending
        if run.eval_pending:
            progress["eval_pending"] = True
        with self._writing(self.out / "last", run.step):
            save_training_state(self.out / "last", run.model, run.opt, progress,
                                self._info(run.device, run.step, run.best_metrics), self._save)
        self._saved_step = run.step

    @contextlib.contextmanager
    def _writing(self, folder: Path, step: int) -> Iterator[None]:
        """A save that fails (a full disk, a file-size limit) says which folder, at which step, and what is kept:
        replace_folder leaves the previous folder whole and removes the half-written one."""
        try:
            yield
        except OSError as e:
            last = self.out / "last"
            kept = (f"no state was saved before ({last} holds nothing)" if self._saved_step is None
                    else f"the last good state (step {self._saved_step}) is still in {last}")
            raise OSError(f"cannot save {folder} at step {step}: {e.strerror or e}; {kept}") from None

    def _check_finite(self, run: _Run) -> None:
        """Before any save: the losses since the last log line were finite, and the weights are finite and give a
        finite loss on the next batch. A step can leave weights finite but useless (1e30 after lr=1e30); only the
        next forward pass shows it, so it runs here (eval mode, no gradient, the random state untouched: the run
        goes on exactly as without it)."""
        step, model = run.step, run.model
        if step == self._checked_step:  # best/ and last/ saved at one evaluation: checked once
            return
        # a save between log lines reads the pending loss sum (one host sync per save): a non-finite loss whose
        # step left the weights finite (fp16 loss scaling skips such a step) ends the run here, not at the log
        pending = run.sums.get("loss")
        if pending is not None and not bool(torch.isfinite(pending)):
            raise self._diverged(step, f"the loss became {float(pending) / run.count}")
        bad = [name for name, p in model.named_parameters() if not bool(p.isfinite().all())]
        if bad:
            raise self._diverged(step, f"non-finite weights after the optimizer step ({', '.join(bad[:3])})")
        batch = split_batch(self.task.batch(step, self.cfg.batch_size, self.cfg.seed, run.device), run.micro)[0]
        was_training = model.training
        devices = [run.device.index or 0] if run.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad(), run.autocast():
            model.eval()
            try:
                loss, _ = self.task.loss(model, batch)
            finally:
                model.train(was_training)
        if not torch.isfinite(loss):
            raise self._diverged(step, f"its weights give a loss of {loss.item()} on the next batch")
        self._checked_step = step

    def _diverged(self, step: int, what: str) -> DivergedError:
        last = self.out / "last"
        kept = (f"no state was saved yet ({last} holds nothing)" if self._saved_step is None
                else f"last good state (step {self._saved_step}) in {last}")
        return DivergedError(f"training diverged at step {step}: {what}; nothing of it was saved, {kept}; "
                             "resume with --resume and a smaller train.lr")

    def _save(self, directory: Path, model: torch.nn.Module, info: dict[str, Any]) -> None:
        self.task.save(directory, model, info)

    # ------------------------------------------------------------------------------------------------ helpers

    def _amp_dtype(self, device: torch.device) -> torch.dtype | None:
        if self.cfg.amp == "off":
            return None
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.cfg.amp) or autocast_dtype(device)

    def _autocast(self, device: torch.device) -> Callable[[], Any]:
        dtype = self._amp_dtype(device)
        if dtype is None:
            return contextlib.nullcontext
        return lambda: torch.autocast(device_type=device.type, dtype=dtype)

    def _trim_log(self, step: int) -> None:
        """metrics.jsonl as of the state the run starts from: the lines of steps after it (logged before a kill,
        or by a run that never saved) are dropped, so that a resumed run logs each step once. Atomic."""
        path = self.out / "metrics.jsonl"
        if not path.is_file():
            return
        kept, dropped = [], 0
        for line in path.read_text(errors="replace").splitlines():
            try:
                at = json.loads(line)["step"]
            except (ValueError, KeyError, TypeError):  # a line cut short by a kill mid-write
                at = math.inf
            if at <= step:
                kept.append(line + "\n")
            else:
                dropped += 1
        if dropped:
            atomic_write_bytes(path, "".join(kept).encode())
            self._say(f"{path}: dropped {dropped} line(s) logged after step {step}, the step the run goes on from")

    def _log(self, record: dict[str, Any]) -> None:
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def _info(self, device: torch.device, step: int, metrics: dict[str, float] | None) -> dict[str, Any]:
        return {"task": self.task.name, "recipe": self.recipe_name, "train": asdict(self.cfg),
                "data": self.task.describe(), "trained_iterations": getattr(self.task.model_config(), "iters", None),
                "steps": step, "schedule": self._schedule, "device": describe(device), "metrics": metrics or {},
                "metrics_precision": self._precision(device)}

    def _precision(self, device: torch.device) -> str:
        """The precision the evaluations (the recorded metrics) ran in: "fp32" or e.g. "bf16 autocast"."""
        return autocast_name(self._amp_dtype(device))

    def stop(self, reason: str) -> None:
        """Ask the run to stop after its current step with last/ saved, as SIGINT does, from any thread (a
        deadline's timer, say) and whatever the process does with its signals; `reason` is the result's
        `stopped_by`."""
        self._stop_reason = reason
        self._stop = True

    def _handle_signal(self, signum: int, frame: Any) -> None:
        first = not self._stop
        self._stop, self._stop_signal = True, signum
        if self._main:  # at once, not when the step or the evaluation under way is done (tens of seconds later)
            name = signal.Signals(signum).name
            message = (f"{name}: stopping after the current step, then saving last/" if first else
                       f"{name}: already stopping after the current step; last/ will be saved")
            # straight to the descriptor: the signal may have interrupted a write to sys.stderr, whose lock it holds
            with contextlib.suppress(OSError, ValueError):  # stderr gone with the terminal
                os.write(2, f"\n{message}\n".encode(errors="replace"))

    def _say(self, message: str) -> None:
        if self.quiet:
            return
        try:
            tqdm.write(message)
        except OSError:  # standard output went away (`| tee` ended by the same Ctrl-C, a closed terminal):
            self.quiet = True  # train and save on, silently; never lose the state for a progress line
            stdout_to_devnull()

    def _warn(self, message: str) -> None:
        """What the run does differently from what was asked: on standard error from the main process, also when
        quiet (--quiet, --json)."""
        if self._main:
            tqdm.write(f"warning: {message}", file=_Unbreakable())  # stderr gone (a closed pipe): the run goes on
