"""The shared-core trainer: one loop for every task (Sudoku, classification, masked image modeling).

A task supplies the model config, deterministic batches for a given step, the loss and the evaluation. The
trainer owns everything else: device and mixed precision, the optimizer and schedule, clipping, progress,
JSON-lines metrics, best-on-validation selection, periodic atomic checkpoints and exact `--resume`.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm import tqdm

from hyperset.checkpoint import save_checkpoint
from hyperset.config import ModelConfig
from hyperset.device import autocast_dtype, describe, pick_device
from hyperset.models import HyperSETModel

from .state import load_training_state, save_training_state


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
    seed: int = 0
    eval_every: int = 500
    log_every: int = 20
    save_every_seconds: float = 300.0
    threads: int = 0  # 0: torch default

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown training keys: {', '.join(unknown)}")
        data = dict(data)
        if "betas" in data:
            data["betas"] = tuple(data["betas"])
        return cls(**data)


class Task(Protocol):
    name: str
    select_metric: str  # a key of evaluate()'s result; higher is better

    def model_config(self) -> ModelConfig: ...

    def batch(self, step: int, batch_size: int, seed: int, device: torch.device) -> dict[str, torch.Tensor]: ...

    def loss(self, model: HyperSETModel, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        ...

    def evaluate(self, model: HyperSETModel, device: torch.device, autocast: Any) -> dict[str, float]: ...

    def describe(self) -> dict[str, Any]: ...


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine from lr to min_lr exactly at the last step (or constant)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(cfg.steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r} (adamw or adam)")


@dataclass
class Trainer:
    task: Task
    cfg: TrainConfig
    out: Path
    device: str = "auto"
    resume: bool = False
    recipe_name: str = ""
    quiet: bool = False
    _stop: bool = field(default=False, init=False)

    def _amp_dtype(self, device: torch.device) -> torch.dtype | None:
        if self.cfg.amp == "off":
            return None
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.cfg.amp) or autocast_dtype(device)

    def _autocast(self, device: torch.device) -> Any:
        dtype = self._amp_dtype(device)
        if dtype is None:
            return contextlib.nullcontext
        return lambda: torch.autocast(device_type=device.type, dtype=dtype)

    def _log(self, record: dict[str, Any]) -> None:
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def _info(self, device: torch.device, step: int, metrics: dict[str, float] | None) -> dict[str, Any]:
        return {"task": self.task.name, "recipe": self.recipe_name, "train": asdict(self.cfg),
                "data": self.task.describe(), "trained_iterations": getattr(self.task.model_config(), "iters", None),
                "steps": step, "device": describe(device), "metrics": metrics or {}}

    def _handle_signal(self, signum: int, frame: Any) -> None:
        self._stop = True

    def fit(self) -> dict[str, Any]:
        cfg = self.cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        device = pick_device(self.device)
        torch.manual_seed(cfg.seed)
        self.out.mkdir(parents=True, exist_ok=True)
        build = getattr(self.task, "build_model", None)  # tasks that train another module (VQ tokenizer)
        model = (build() if build else HyperSETModel(self.task.model_config())).to(device)
        opt = make_optimizer(model, cfg)
        start, best, best_metrics, elapsed = 0, -math.inf, {}, 0.0
        last_dir = self.out / "last"
        if self.resume and (last_dir / "trainer.json").is_file():
            progress = load_training_state(last_dir, model, opt)
            start, best = progress["step"], progress.get("best", -math.inf)
            best_metrics, elapsed = progress.get("best_metrics", {}), progress.get("elapsed", 0.0)
            self._say(f"resumed from {last_dir} at step {start} (best {self.task.select_metric} = {best})")
        elif not self.resume and (last_dir / "trainer.json").is_file():
            raise SystemExit(f"{self.out} already holds a training run; pass --resume to continue it "
                             "or choose another --out")
        autocast = self._autocast(device)
        # fp16 needs loss scaling; bf16 and fp32 do not
        scaler = torch.amp.GradScaler(device.type, enabled=self._amp_dtype(device) == torch.float16)
        step_model = torch.compile(model) if cfg.compile else model
        self._say(f"training {self.task.name} on {describe(device)}: {model.num_parameters():,} parameters, "
                  f"{cfg.steps} steps of batch {cfg.batch_size}, amp={cfg.amp}")
        old_handlers = {s: signal.signal(s, self._handle_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        t0, last_save = time.time() - elapsed, time.time()

        def save_state(step: int) -> None:
            progress = {"step": step, "best": best, "best_metrics": best_metrics, "elapsed": time.time() - t0}
            save_training_state(last_dir, model, opt, progress, self._info(device, step, best_metrics), self._save)

        bar = tqdm(total=cfg.steps, initial=start, disable=self.quiet, dynamic_ncols=True,
                   mininterval=1.0 if sys.stderr.isatty() else 60.0, desc=self.task.name)
        running: dict[str, float] = {}
        step = start
        try:
            while step < cfg.steps and not self._stop:
                lr = lr_at(step, cfg)
                for group in opt.param_groups:
                    group["lr"] = lr
                model.train()
                batch = self.task.batch(step, cfg.batch_size, cfg.seed, device)
                with autocast():
                    loss, logs = self.task.loss(step_model, batch)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"loss became {loss.item()} at step {step}; last good state in {last_dir}")
                opt.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip if cfg.clip > 0 else 1e9)
                scaler.step(opt)
                scaler.update()
                step += 1
                for k, v in {"loss": loss.item(), "grad_norm": grad_norm.item(), **logs}.items():
                    running[k] = running.get(k, 0.0) + v
                bar.update(1)
                if step % cfg.log_every == 0 or step == cfg.steps:
                    avg = {k: v / cfg.log_every for k, v in running.items()}
                    running = {}
                    bar.set_postfix({k: f"{v:.3f}" for k, v in avg.items() if k in ("loss", "acc")})
                    self._log({"step": step, "time": round(time.time() - t0, 1), "lr": lr, **avg})
                if step % cfg.eval_every == 0 or step == cfg.steps:
                    metrics = self.task.evaluate(model, device, autocast)
                    self._log({"step": step, "time": round(time.time() - t0, 1), "eval": metrics})
                    bar.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
                    score = metrics[self.task.select_metric]
                    if score > best:
                        best, best_metrics = score, metrics
                        self._save(self.out / "best", model, self._info(device, step, metrics))
                    save_state(step)
                    last_save = time.time()
                elif time.time() - last_save > cfg.save_every_seconds:
                    save_state(step)
                    last_save = time.time()
        finally:
            bar.close()
            for s, h in old_handlers.items():
                signal.signal(s, h)
        save_state(step)
        if self._stop:
            self._say(f"stopped at step {step}; state saved in {last_dir} (continue with --resume)")
        return {"step": step, "best": best, "best_metrics": best_metrics, "out": str(self.out),
                "finished": step >= cfg.steps}

    def _save(self, directory: Path, model: torch.nn.Module, info: dict[str, Any]) -> None:
        save = getattr(self.task, "save", None)  # (directory, model, info) for tasks with their own module kind
        if save:
            save(directory, model, info)
        else:
            save_checkpoint(directory, model, info)

    def _say(self, message: str) -> None:
        if not self.quiet:
            tqdm.write(message)
