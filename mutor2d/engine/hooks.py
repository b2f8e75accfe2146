"""Periodic jobs of the training loop that every run kind has: logging and checkpoints.

Each hook is called after every step with the run (``RunState``) and a ``StepStatus``: the steps done,
whether this is the last step, whether the run is being stopped by a signal, and whether the last
update was applied. Hooks run in order: logger, checkpointer, then the run kind's own (RunKind.hooks: sample
grids, evaluations).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import checkpoint as ckpt_lib
from ..io import warn
from ..checkpoint.resume import Retention
from .health import SkipWatch
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


# ----------------------------------------------------------------------------- log.jsonl

def _finite(record: dict) -> dict:
    """JSON has no NaN/Infinity: non-finite numbers are written as null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


class JsonLog:
    """RUN/log.jsonl, appended by the main process and never rewritten. A resumed run first writes
    ``{"event": "resume", "step": S}``; ``read_log`` then drops older records of steps after S."""

    def __init__(self, path: Path, start_step: int, enabled: bool):
        self.path, self.enabled = path, enabled
        if enabled and start_step > 0 and path.exists():
            with open(path, "rb+") as f:            # finish a line cut by a crash
                f.seek(0, 2)
                if f.tell() and (f.seek(-1, 2), f.read(1))[1] != b"\n":
                    f.write(b"\n")
            self.write({"event": "resume", "step": start_step})

    def write(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(_finite(record), allow_nan=False) + "\n")


def read_log(run_dir) -> list[dict]:
    """The records of RUN/log.jsonl as the run's history: records of steps redone after a resume are
    replaced by the new ones; cut lines are skipped; events (resume, preempted) are not returned."""
    out: list[dict] = []
    for line in (Path(run_dir) / "log.jsonl").read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("event") == "resume":
            out = [r for r in out if r.get("step", 0) <= rec["step"]]
        elif "event" not in rec:
            out.append(rec)
    return out


class Logger:
    """Averages step statistics over ``train.log_every`` steps and all processes; writes log.jsonl,
    the tracker and the progress bar. Rates come from the run kind (``rates``). Warns (main process)
    when the blow-up guard skips too many updates (health.SkipWatch)."""

    def __init__(self, run: RunState):
        from tqdm.auto import tqdm
        self.main = run.main
        self.skip_watch = SkipWatch(run.cfg.train.blowup_factor, run.cfg.train.blowup_window)
        self.log = JsonLog(run.run_dir / "log.jsonl", run.start, run.main)
        self.tracker = run.cfg.train.tracker != "none"
        self.bar = tqdm(total=run.cfg.train.max_steps, initial=run.start, disable=not run.main,
                        dynamic_ncols=True, desc="train", mininterval=1.0)
        self._reset()

    def _reset(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.steps = self.applied = 0
        self.skipped: dict[str, int] = {}
        self.t0 = time.perf_counter()

    def observe(self, sums: dict, applied: bool, reason: str | None = "nonfinite") -> None:
        """One step's statistics; a skipped update is counted under ``skipped_<reason>``."""
        self.steps += 1
        self.applied += int(applied)
        if applied:
            for k, v in sums.items():
                self.sums[k] = self.sums.get(k, 0.0) + v
        else:
            self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.bar.update(1)
        alarm = self.skip_watch.observe(not applied and reason == "blowup")
        if alarm and self.main:
            warn(alarm)

    def __call__(self, run: RunState, status: StepStatus) -> None:
        if not due(run.cfg.train.log_every, status) and not status.stopping:
            return
        if self.steps == 0:
            return
        rec = self.record(run, status.done)
        self.log.write(rec)
        if self.tracker:
            run.acc.log({f"train/{k}": v for k, v in rec.items() if k != "step"}, step=status.done)
        loss = rec.get("loss")
        rate = next((k for k in rec if k.endswith("_per_s")), None)
        self.bar.set_postfix({"loss": f"{loss:.4f}" if loss is not None else "skipped",
                              **({rate: f"{rec[rate]:.0f}"} if rate else {})}, refresh=False)
        self._reset()

    def record(self, run: RunState, done: int) -> dict:
        dt = time.perf_counter() - self.t0
        rec = {"step": done, "lr": run.optimizer.param_groups[0]["lr"]}
        rule = run.step_rule()
        if rule is not None:                 # a scheduled loss weight: its value at the last update, as lr
            rec["reg_weight"] = rule.reg_weight
        vals = {}
        if self.sums:
            keys = sorted(self.sums)
            vals = run.acc.reduce(torch.stack([self.sums[k] for k in keys]).to(run.device), reduction="sum")
            vals = dict(zip(keys, vals.tolist()))
            for k in keys:
                if k != "seq_tokens":
                    rec[k] = vals[k] / (self.applied * run.acc.num_processes)
        rec.update(run.kind.rates(run, self.steps, self.applied, dt, vals))
        rec.update({f"skipped_{why}": n for why, n in self.skipped.items()})
        return rec

    def close(self) -> None:
        self.bar.close()


# ----------------------------------------------------------------------------- checkpoints

def params_finite(run: RunState) -> bool:
    return all_finite(run.model.parameters())


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
        if not status.healthy or not params_finite(run):
            if run.main:
                warn(f"step {status.done}: no checkpoint written (skipped update or non-finite weights); "
                     f"{self.kept.kept_message()}")
            return
        path = run.checkpoint_state(is_sharded(run.module)).save(run.run_dir, status.done, run.main)
        if run.main:
            self.kept.saved(path)
        if status.stopping and run.main:
            print(f"stopped by signal at step {status.done}: checkpoint {path}", flush=True)
