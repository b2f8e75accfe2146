"""Periodic jobs of the training loop that every run kind has: logging and checkpoints.

Each hook is called after every step with the run (``RunState``) and a ``StepStatus``: the steps done,
whether this is the last step, whether the run is being stopped by a signal, and whether the last
update was applied. Hooks run in order: logger, checkpointer, then the run kind's own (RunKind.hooks: sample
grids, evaluations).
"""
from __future__ import annotations

import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import checkpoint as ckpt_lib
from ..io import say, warn
from ..checkpoint.resume import Retention
from .runlog import JsonLog, skip_words
from .setup import RunState
from .sharding import all_finite, is_sharded


@dataclass
class StepStatus:
    done: int                   # steps done
    last: bool                  # done == train.max_steps
    stopping: bool = False      # a stop signal arrived: save now, then exit
    healthy: bool = True        # the last update was applied (engine/health.py)


def due(every: int, status: StepStatus, at_end: bool = True) -> bool:
    return bool(every and status.done % every == 0) or (at_end and status.last)


class Logger:
    """Averages step statistics over ``train.log_every`` steps and all processes; writes log.jsonl,
    the tracker and the progress. Rates come from the run kind (``rates``). Every skipped update
    is also a line of its own in log.jsonl (``read_skips``: its reason and the values judged), and the
    progress counts them (``skipped``, by reason, over the session).

    Progress (main process; ``start`` .. ``close``): a bar on a terminal (stderr a tty), else a line per
    logged step, at most one every ``LINE_S`` seconds besides the first and the last (a redirected log
    gets lines, not one line of bar redraws). At the first logged step one line says the expected time
    of the rest, measured so far, with what it depends on (device, threads, load). Other lines of the
    run go above the bar (``io.say``); the bar is closed before the line that ends the run."""

    LINE_S = 30.0

    def __init__(self, run: RunState):
        self.main = run.main
        self.session_skips: Counter[str] = Counter()
        self.log = JsonLog(run.run_dir / "log.jsonl", run.start, run.main)
        self.start_step, self.max_steps, self.bar = run.start, run.cfg.train.max_steps, None
        self.lines = run.main and not sys.stderr.isatty()
        self._reset()

    def start(self) -> None:
        """Open the progress (the session's clock starts here)."""
        from tqdm.auto import tqdm
        self.bar = tqdm(total=self.max_steps, initial=self.start_step, disable=not self.main or self.lines,
                        dynamic_ncols=True, desc="train", mininterval=1.0)
        self.started = self.line_at = time.perf_counter()
        self.estimated = self.lined = False

    def _reset(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.steps = self.applied = 0
        self.skipped: Counter[str] = Counter()
        self.t0 = time.perf_counter()

    def observe(self, sums: dict, applied: bool, reason: str | None, step: int, judged: dict) -> None:
        """Step ``step``'s statistics; a skipped update is counted under ``skipped_<reason>`` and written
        as a skip line with what the guard ``judged`` (Health.judged)."""
        self.steps += 1
        self.applied += int(applied)
        if applied:
            for k, v in sums.items():
                self.sums[k] = self.sums.get(k, 0.0) + v
        else:
            self.skipped[reason] += 1
            self.session_skips[reason] += 1
            self.log.write({"event": "skip", "step": step, "reason": reason, **judged})
            self.bar.set_postfix({"skipped": skip_words(self.session_skips)}, refresh=False)
        self.bar.update(1)

    def __call__(self, run: RunState, status: StepStatus) -> None:
        if self.steps == 0 or not (due(run.cfg.train.log_every, status) or status.stopping):
            return
        rec = self.record(run, status.done)
        self.log.write(rec)
        if run.cfg.train.tracker != "none":
            run.acc.log({f"train/{k}": v for k, v in rec.items() if k != "step"}, step=status.done)
        loss = rec.get("loss")
        rate = next((k for k in rec if k.endswith("_per_s")), None)
        shown = {"loss": f"{loss:.4f}" if loss is not None else "skipped", **({rate: f"{rec[rate]:.0f}"} if rate else {}),
                 **({"skipped": skip_words(self.session_skips)} if self.session_skips else {})}
        self.bar.set_postfix(shown, refresh=False)
        self._reset()
        if self.main:
            self._progress_lines(run, status, shown)

    def _progress_lines(self, run: RunState, status: StepStatus, shown: dict) -> None:
        """The expected time (once), and without a bar the step line (``LINE_S``)."""
        now = time.perf_counter()
        elapsed, done = now - self.started, status.done - self.start_step
        left = elapsed / done * (self.max_steps - status.done)
        if not self.estimated and not status.last:
            self.estimated = True
            say(f"expected time: about {duration(left)} more for steps {status.done + 1}-{self.max_steps} "
                f"({elapsed / done:.2g} s a step over steps {self.start_step + 1}-{status.done} on {machine_text(run)}; "
                f"a busier machine, or more threads than free cores (OMP_NUM_THREADS), takes longer)")
        if self.lines and (not self.lined or status.last or status.stopping or now - self.line_at >= self.LINE_S):
            self.lined, self.line_at = True, now
            values = ", ".join(f"{k} {v}" for k, v in shown.items())
            eta = "" if status.last else f", about {duration(left)} left"
            say(f"step {status.done}/{self.max_steps}: {values}; {duration(elapsed)} so far{eta}")

    def record(self, run: RunState, done: int) -> dict:
        dt = time.perf_counter() - self.t0
        rec = {"step": done, "lr": run.optimizer.param_groups[0]["lr"]}
        if (rule := run.step_rule()) is not None:   # a scheduled loss weight: its last update's value, as lr
            rec["reg_weight"] = rule.reg_weight
        vals = {}
        if keys := sorted(self.sums):
            summed = run.acc.reduce(torch.stack([self.sums[k] for k in keys]).to(run.device), reduction="sum")
            vals = dict(zip(keys, summed.tolist()))
            per_update = self.applied * run.acc.num_processes
            rec.update({k: v / per_update for k, v in vals.items() if k != "seq_tokens"})
        rec.update(run.kind.rates(run, self.steps, self.applied, dt, vals))
        rec.update({f"skipped_{why}": n for why, n in self.skipped.items()})
        return rec

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def duration(seconds: float) -> str:
    """A time in words, as a person reads an estimate: "40 s", "12 min", "2 h 5 min"."""
    if seconds < 90:
        return f"{round(seconds)} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60} min"


def machine_text(run: RunState) -> str:
    """What a CPU run's speed depends on: "cpu, 1 thread, load average 3.1 on 2 cores"; a GPU run's device."""
    if run.device.type != "cpu":
        return str(run.device)
    threads = torch.get_num_threads()
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return f"cpu, {threads} thread{'s' if threads > 1 else ''}{load} on {os.cpu_count()} cores"


# ----------------------------------------------------------------------------- checkpoints

class CheckpointHook:
    """Writes a checkpoint when due and the last update was healthy: RUN/checkpoints/step_N.pt, or
    step_N.dcp/ for a sharded run (every process takes part: RunState.checkpoint_state); ``kept`` (main
    process) knows the last good checkpoint and rotates around it (mutor2d.checkpoint.resume.Retention)."""

    def __init__(self, run: RunState):
        resumed = ckpt_lib.written_checkpoint(run.run_dir, run.start) if run.start else None   # .pt or .dcp/
        self.kept = Retention(run.run_dir, run.cfg.train.keep_ckpts, resumed, run.cfg.train.keep_every)

    def __call__(self, run: RunState, status: StepStatus) -> None:
        self.kept.observe(status.healthy)
        if not (due(run.cfg.train.ckpt_every, status) or status.stopping):
            return
        if not status.healthy or not all_finite(run.model.parameters()):
            if run.main:
                warn(f"step {status.done}: no checkpoint written (skipped update or non-finite weights); "
                     f"{self.kept.kept_message()}")
            return
        path = run.checkpoint_state(is_sharded(run.module)).save(run.run_dir, status.done, run.main)
        if run.main:
            self.kept.saved(path)
            what = "stopped by signal at step" if status.stopping else "step"
            say(f"{what} {status.done}: checkpoint {Path(path).absolute()}")
