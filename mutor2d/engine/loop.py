"""The training loop: build the run, then per step one update and the hooks.

Rules:
  * Loss of a step = mean over micro-batches and processes of each micro-batch's loss (gradients are
    averaged the same way by accelerate/DDP). Update s uses lr(s+1): warmup reaches the full lr at W-1.
  * An objective whose rule depends on the step (a reg_weight schedule) gets ``set_step(s, max_steps)``
    before update s, as the lr scheduler does: a pure function of (config, s), so resumes are exact.
  * Health guard (engine/health.py): an unhealthy update is skipped (optimizer untouched, gradients
    dropped) and logged as a skip line with the values judged; after ``train.max_nonfinite`` in a row
    skipped for non-finite values or exploded weights the run stops naming the last good checkpoint
    (mutor2d.checkpoint.resume), and no checkpoint is written while the last update was skipped. The
    run ends with one line: steps trained, updates skipped by reason.
  * One live run per folder (engine/lock.py): a second one is refused before it touches the folder.
  * A run resumed at ``train.max_steps`` says "nothing to do" and writes nothing: no log line, config,
    tracker file or model folder; unless its kind's final outputs are missing (a session killed between
    its last checkpoint and them: RunKind.finished), then it writes those. Every other run starts with
    one line: kind, device, parameters, folder.
  * Stop signals: SIGTERM / SIGINT finish the current step, write a checkpoint and exit with
    ``PREEMPTED_EXIT`` (75, "try again": schedulers requeue on it); a second signal exits at once.
    Ctrl-C outside the steps (start-up, the final outputs) stops at once: 75 when the run has a
    checkpoint, else 130 (``interrupted``); one line either way.
  * Terminal output: the progress bar opens after the start-up writes and is closed before the line
    that ends the run (an error's, or the summary, the last line of a finished run); lines during the
    steps go above it (``io.say``). A failed start leaves no half-written file (config.yaml is written
    atomically).
"""
from __future__ import annotations

import contextlib
import errno
import math
import os
import signal
import time
from functools import partial
from pathlib import Path

import torch

from .. import checkpoint as ckpt_lib
from ..io import say, write_text_atomic
from ..preempt import Preempted
from . import runlog
from .config import flat
from .entry import Diverged
from .hooks import CheckpointHook, Logger, StepStatus
from ..run_configs import run_kind
from .lock import run_lock
from .setup import ResumeWith, RunState, build_run, record_provenance
from .sharding import global_tensor, is_sharded


class StopSignals:
    """Catch SIGTERM/SIGINT while training: the first asks for a clean stop, the second exits at once.
    Once the stop checkpoint is written (``saved``), signals are ignored: a launcher that stops the
    other ranks when the first exits 75 must not turn their 75 into a death by signal."""

    def __init__(self, acc):
        self.acc, self.signum, self.old, self.saved = acc, None, {}, False

    def _handle(self, signum, frame):
        if self.saved:
            return
        if self.signum is not None:
            os._exit(128 + signum)
        self.signum = signum

    def __enter__(self):
        for s in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: no handlers
                self.old[s] = signal.signal(s, self._handle)
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


def train_step(run: RunState, batches, step: int) -> tuple[dict, bool]:
    """One update (``train.grad_accum`` micro-batches) -> (summed statistics, update applied)."""
    t, acc, module = run.cfg.train, run.acc, run.module
    sharded = is_sharded(module)
    run.scheduler.step_update(step + 1)
    if (rule := run.step_rule()) is not None:
        rule.set_step(step, t.max_steps)
    sums: dict[str, torch.Tensor] = {}
    applied = True
    for _ in range(t.grad_accum):
        with acc.accumulate(module):
            if sharded:                               # FSDP2: reduce-scatter on the last micro-batch only
                module.set_requires_gradient_sync(acc.sync_gradients)
            res = module(next(batches), run.layout_gen)
            acc.backward(res.loss)
            if acc.sync_gradients:
                clip = run.cfg.optim.grad_clip if run.cfg.optim.grad_clip > 0 else math.inf
                grad_norm = global_tensor(acc.clip_grad_norm_(module.parameters(), clip))  # over all shards
                weights = weight_norm(module)
                applied = run.health.judge(res.loss.detach(), grad_norm, acc, weights) is None
                if applied:
                    run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
        for k, v in {"loss": res.loss, **res.logs}.items():
            sums[k] = sums.get(k, 0.0) + v.detach().float() / t.grad_accum
        sums["seq_tokens"] = sums.get("seq_tokens", 0.0) + torch.as_tensor(res.tokens).detach().float()
    if run.ema is not None and applied:
        run.ema.update(run.model, step=step + 1)
    sums["grad_norm"] = grad_norm.detach().float()
    sums["weight_norm"] = weights.detach().float()        # the trained weights the update started from
    return sums, applied


def weight_norm(module: torch.nn.Module) -> torch.Tensor:
    """The global norm of the trained parameters (over all shards)."""
    trained = [p.detach() for p in module.parameters() if p.requires_grad]
    return global_tensor(torch.nn.utils.get_total_norm(trained))


class Hooks:
    """The loop's periodic jobs by name, run in this order after every step: the logger, the
    checkpointer, then the run kind's own (sample writer, evaluator); ConfigError if one cannot run."""

    def __init__(self, run: RunState):
        self.logger, self.checkpointer = Logger(run), CheckpointHook(run)
        self.kind_hooks = run.kind.hooks(run, self.logger.log)

    def __iter__(self):
        return iter([self.logger, self.checkpointer, *self.kind_hooks])


def train(cfg, run_dir, resume: str | None = None, kind=None, resume_with: ResumeWith | None = None) -> Path:
    """Train ``cfg`` into ``run_dir`` up to ``train.max_steps``; returns the run folder.

    resume: None (a fresh run; refuses a folder that has checkpoints), "auto" (the newest readable
    checkpoint of ``run_dir``, a fresh start if it has none) or a checkpoint file / run folder; the
    point is decided once, after the run's lock is taken (mutor2d.checkpoint.resume.find_resume). A
    resumed run keeps ``cfg`` (its model, objective and data must be the checkpoint's), or with ``resume_with``
    (train.py's) continues with its saved config plus its overrides (engine.setup.ResumeWith).
    Bad settings raise ConfigError (one line) before the first step; so does a folder another live run
    holds (RunLocked). ``kind``: the run kind's parts (default: those registered for ``cfg.task``,
    mutor2d.run_configs.run_kind)."""
    try:
        with run_lock(run_dir):
            return _train(cfg, run_dir, resume, kind or run_kind(cfg.task)(), resume_with)
    except ckpt_lib.CheckpointWriteError:
        raise
    except KeyboardInterrupt:                # Ctrl-C outside the steps (start-up, final outputs): they stop with 75
        raise interrupted(run_dir) from None
    except OSError as e:                     # the run folder refused a write: disk full, read-only, not ours
        if e.errno not in WRITE_ERRNOS:
            raise
        raise ckpt_lib.CheckpointWriteError(f"could not write into run folder {str(Path(run_dir).absolute())!r} "
                                            f"({e.strerror}{f': {e.filename}' if e.filename else ''}); "
                                            f"{kept_checkpoints(run_dir)}") from None


WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM)


def kept_checkpoints(run_dir) -> str:
    """What a run that could not write leaves: its checkpoints, untouched."""
    kept = ckpt_lib.list_checkpoints(run_dir) if Path(run_dir).is_dir() else []
    return f"its checkpoints are kept (newest: {kept[-1].name})" if kept else "no checkpoint had been written"


def interrupted(run_dir) -> BaseException:
    """What a Ctrl-C outside the training steps ends a run with: Preempted (exit 75) when the run has a
    checkpoint to continue from, else a KeyboardInterrupt (exit 130) saying there is none."""
    if Path(run_dir).is_dir() and ckpt_lib.list_checkpoints(run_dir):
        return Preempted(f"interrupted by Ctrl-C; {kept_checkpoints(run_dir)}: continue with --resume auto")
    return KeyboardInterrupt("no checkpoint had been written; run the same command to start again")


def _train(cfg, run_dir, resume: str | None, kind, resume_with) -> Path:
    run = build_run(cfg, run_dir, resume, kind, resume_with)
    if run is None:                                # resumed at train.max_steps: nothing is rewritten
        return Path(run_dir)
    hooks = Hooks(run)
    if run.main:
        print(startup_line(run), flush=True)
        from .. import config as config_lib
        write_text_atomic(run.run_dir / "config.yaml", config_lib.dump(run.cfg))    # a failed write leaves none
        run.provenance = record_provenance(run)
    if run.cfg.train.tracker != "none":                      # the config as the tracker's hyper-parameters
        run.acc.init_trackers("tb", config={k: v if isinstance(v, (int, float, str, bool)) else str(v)
                                            for k, v in flat(run.cfg.to_dict()).items()})
    run.module.train()
    t0 = time.perf_counter()
    hooks.logger.start()                      # the progress bar: closed before any line that ends the run
    try:
        _loop(run, hooks)
        run.kind.finish(run)
    finally:
        hooks.logger.close()
        run.acc.end_training()
    if run.main and run.start < run.cfg.train.max_steps:
        kept = ckpt_lib.list_checkpoints(run.run_dir)
        describe = partial(run.kind.eval_text, run.cfg) if hasattr(run.kind, "eval_text") else runlog.eval_text
        print(runlog.summary(run.run_dir, run.start + 1, run.cfg.train.max_steps, time.perf_counter() - t0,
                             kept[-1] if kept else None, describe), flush=True)
    return run.run_dir


def startup_line(run: RunState) -> str:
    """What is trained where: run kind, device and processes, parameters (trained ones), run folder."""
    params = list(run.model.parameters())
    total, trained = sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)
    where = f"{run.device}" + (f" x {run.acc.num_processes} processes" if run.acc.num_processes > 1 else "")
    return (f"{run.cfg.task} run on {where}: {short_count(total)} parameters ({short_count(trained)} trained); "
            f"run folder {run.run_dir.absolute()}")


def short_count(n: int) -> str:
    """1234567 -> '1.23M'."""
    return next((f"{n / size:.3g}{unit}" for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)) if n >= size),
                str(n))


def _loop(run: RunState, hooks: Hooks) -> None:
    t = run.cfg.train
    if run.start >= t.max_steps and run.main:
        say(f"no step to train: the run is at step {run.start}, train.max_steps is {t.max_steps}; writing the "
            f"final outputs its last session did not finish")
    batches, bad = iter(run.loader), 0
    with StopSignals(run.acc) as signals:
        for step in range(run.start, t.max_steps):
            sums, applied = train_step(run, batches, step)
            bad = 0 if applied else bad + int(run.health.fatal)
            hooks.logger.observe(sums, applied, run.health.last, step + 1, run.health.judged)
            status = StepStatus(step + 1, step + 1 == t.max_steps, signals.requested(), applied)
            for hook in hooks:
                hook(run, status)
            if bad > t.max_nonfinite:
                raise Diverged(f"{bad} updates in a row had a non-finite loss, gradient or weight norm or exploded weights (step "
                               f"{step + 1}, train.max_nonfinite={t.max_nonfinite}); "
                               f"{hooks.checkpointer.kept.after_divergence()}")
            if status.stopping:
                hooks.logger.log.write({"event": "preempted", "step": step + 1, "signal": signals.signum})
                signals.saved = True
                run.acc.wait_for_everyone()           # no process exits before the checkpoint is written
                raise Preempted(f"stopped by signal {signals.signum} at step {step + 1}; "
                                f"continue with --resume auto")
    if run.main and run.start < t.max_steps:
        say(f"trained steps {run.start + 1}-{t.max_steps}: {runlog.skip_words(hooks.logger.session_skips)} "
            f"updates skipped by the blow-up guard; run folder {run.run_dir.absolute()}")
