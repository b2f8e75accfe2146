"""The training loop: build the run, then per step one update and the hooks.

Rules:
  * Loss of a step = mean over micro-batches and processes of each micro-batch's loss (gradients are
    averaged the same way by accelerate/DDP). Update s uses lr(s+1): warmup reaches the full lr at W-1.
  * Non-finite guard: an update whose gradient norm (or loss) is not finite is skipped (optimizer
    untouched, gradients dropped) and counted in the log; after ``train.max_nonfinite`` skipped
    updates in a row the run stops with an error, and no checkpoint is written while the last update
    was skipped, so good weights are never replaced.
  * Stop signals: SIGTERM / SIGINT finish the current step, write a checkpoint and exit with
    ``PREEMPTED_EXIT`` (75, "try again": schedulers requeue on it); a second signal exits at once.
"""
from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import torch

from ..config import ConfigError, RunConfig
from .hooks import Logger, OnlineEval, SampleGrids, Tick, checkpoint_hook
from .setup import Run, build_run
from .sharding import global_tensor, is_sharded

PREEMPTED_EXIT = 75


class Preempted(Exception):
    """A stop signal ended the run after a checkpoint; train.py exits with PREEMPTED_EXIT."""


class Diverged(RuntimeError):
    """Too many non-finite updates in a row; one-line message."""


class StopSignals:
    """Catch SIGTERM/SIGINT while training: the first asks for a clean stop, the second exits at once.
    Once the stop checkpoint is written (``saved``), signals are ignored: a launcher that stops the
    other ranks when the first exits 75 must not turn their 75 into a death by signal."""

    def __init__(self, acc):
        self.acc, self.signum, self.old = acc, None, {}
        self.saved = False

    def _handle(self, signum, frame):
        if self.saved:
            return
        if self.signum is not None:
            os._exit(128 + signum)
        self.signum = signum

    def __enter__(self):
        for s in (signal.SIGTERM, signal.SIGINT):
            try:
                self.old[s] = signal.signal(s, self._handle)
            except ValueError:                     # not the main thread: no handlers
                pass
        return self

    def __exit__(self, *exc):
        for s, h in self.old.items():     # exiting 75 next: ignored, also through interpreter shutdown
            signal.signal(s, signal.SIG_IGN if self.saved and self.acc.num_processes > 1 else h)

    def requested(self) -> bool:
        """True on every process once any process got a signal."""
        if self.acc.num_processes == 1:
            return self.signum is not None
        flag = torch.tensor([0 if self.signum is None else 1], device=self.acc.device)
        return bool(self.acc.reduce(flag, reduction="sum").item())


def train_step(run: Run, batches, step: int) -> tuple[dict, bool]:
    """One update (``train.grad_accum`` micro-batches) -> (summed statistics, update applied)."""
    t, acc, module = run.cfg.train, run.acc, run.module
    sharded = is_sharded(module)
    run.scheduler.step_update(step + 1)
    sums: dict[str, torch.Tensor] = {}
    applied = True
    for _ in range(t.grad_accum):
        batch = next(batches)
        lengths = batch.get("lengths")
        with acc.accumulate(module):
            if sharded:                               # FSDP2: reduce-scatter on the last micro-batch only
                module.set_requires_gradient_sync(acc.sync_gradients)
            res = module(batch["body"].to(run.device, non_blocking=True),
                         batch["prefix"].to(run.device, non_blocking=True), run.grid,
                         lengths.to(run.device, non_blocking=True) if lengths is not None else None, run.layout_gen)
            acc.backward(res.loss)
            if acc.sync_gradients:
                clip = run.cfg.optim.grad_clip if run.cfg.optim.grad_clip > 0 else math.inf
                grad_norm = global_tensor(acc.clip_grad_norm_(module.parameters(), clip))  # over all shards
                applied = bool(torch.isfinite(grad_norm)) and bool(torch.isfinite(res.loss.detach()))
                if applied:
                    run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
        for k, v in {"loss": res.loss, **res.logs}.items():
            sums[k] = sums.get(k, 0.0) + v.detach().float() / t.grad_accum
        sums["seq_tokens"] = sums.get("seq_tokens", 0.0) + torch.as_tensor(res.tokens).detach().float()
    if run.ema is not None and applied:
        run.ema.update(run.model, step=step + 1)
    sums["grad_norm"] = grad_norm.detach().float()
    return sums, applied


def build_hooks(run: Run) -> list:
    """The periodic jobs, in the order they run after a step; ConfigError if one cannot run."""
    from ..generation import grid_classes
    cfg = run.cfg
    tokenizer = None
    if cfg.model.kind().per_class:
        from ..data import build_tokenizer
        from .rng import preserved_rng
        try:
            with preserved_rng(run.device):        # a VQ's init draws numbers: keep the training streams
                tokenizer = build_tokenizer(cfg.data)
        except (ValueError, OSError) as e:
            raise ConfigError(f"sample grids need the tokenizer: {e}") from None
    logger = Logger(run)
    hooks = [logger, checkpoint_hook]
    if tokenizer is not None:
        hooks.append(SampleGrids(tokenizer, grid_classes(cfg.sample, cfg.model.num_classes)))
        if cfg.train.eval_every:
            hooks.append(OnlineEval(tokenizer, logger.log))
    return hooks



def train(cfg: RunConfig, run_dir, resume: str | None = None) -> Path:
    """Train ``cfg`` into ``run_dir`` up to ``train.max_steps``; returns the run folder.

    resume: None (a fresh run; refuses a folder that has checkpoints), "auto" (the newest readable
    checkpoint of ``run_dir``, a fresh start if it has none) or a checkpoint file / run folder.
    Bad settings raise ConfigError (one line) before the first step."""
    run = build_run(cfg, run_dir, resume)
    hooks = build_hooks(run)
    if run.main:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        from .. import config as config_lib
        (run.run_dir / "config.yaml").write_text(config_lib.dump(run.cfg))
    if run.cfg.train.tracker != "none":
        run.acc.init_trackers("tb", config=_flat(run.cfg.to_dict()))
    run.module.train()
    try:
        _loop(run, hooks)
    finally:
        hooks[0].close()
        run.acc.end_training()
    return run.run_dir


def _loop(run: Run, hooks: list) -> None:
    t = run.cfg.train
    if run.start >= t.max_steps and run.main:
        print(f"nothing to do: the run is at step {run.start}, train.max_steps is {t.max_steps}", flush=True)
    batches, bad = iter(run.loader), 0
    with StopSignals(run.acc) as signals:
        for step in range(run.start, t.max_steps):
            sums, applied = train_step(run, batches, step)
            bad = 0 if applied else bad + 1
            hooks[0].observe(sums, applied)
            tick = Tick(step + 1, step + 1 == t.max_steps, signals.requested(), applied)
            for hook in hooks:
                hook(run, tick)
            if bad > t.max_nonfinite:
                raise Diverged(f"{bad} updates in a row had a non-finite loss or gradient (step {step + 1}, "
                               f"train.max_nonfinite={t.max_nonfinite}); the last good checkpoint is kept")
            if tick.stopping:
                hooks[0].log.write({"event": "preempted", "step": step + 1, "signal": signals.signum})
                signals.saved = True
                run.acc.wait_for_everyone()           # no process exits before the checkpoint is written
                raise Preempted(f"stopped by signal {signals.signum} at step {step + 1}; "
                                f"continue with --resume auto")


def _flat(d: dict, prefix: str = "") -> dict:
    """Nested config -> {"section.key": scalar} for tracker hyper-parameters."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out
