"""Periodic jobs of the training loop that every run kind has: logging and checkpoints.

Each hook is called after every step with the run (``RunState``) and a ``StepStatus``: the steps done,
whether this is the last step, whether the run is being stopped by a signal, and whether the last
update was applied. Hooks run in order: logger, checkpointer, then the run kind's own (RunKind.hooks: sample
grids, evaluations).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .. import checkpoint as ckpt_lib
from ..io import warn
from ..checkpoint.resume import Retention
from .runlog import JsonLog
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
    the tracker and the progress bar. Rates come from the run kind (``rates``). Every skipped update
    is also a line of its own in log.jsonl (``read_skips``: its reason and the values judged), and the
    progress bar counts them (``skipped``, by reason, over the session)."""

    def __init__(self, run: RunState):
        from tqdm.auto import tqdm
        self.main = run.main
        self.session_skips: dict[str, int] = {}
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

    def observe(self, sums: dict, applied: bool, reason: str | None = "nonfinite", step: int | None = None,
                judged: dict | None = None) -> None:
        """One step's statistics; a skipped update is counted under ``skipped_<reason>`` and, given its
        ``step``, written as a skip line with what the guard ``judged`` (Health.judged)."""
        self.steps += 1
        self.applied += int(applied)
        if applied:
            for k, v in sums.items():
                self.sums[k] = self.sums.get(k, 0.0) + v
        else:
            self.skipped[reason] = self.skipped.get(reason, 0) + 1
            self.session_skips[reason] = self.session_skips.get(reason, 0) + 1
            if step is not None:
                self.log.write({"event": "skip", "step": step, "reason": reason, **(judged or {})})
            self.bar.set_postfix({"skipped": self.skip_text()}, refresh=False)
        self.bar.update(1)

    def skip_text(self) -> str:
        """This session's skipped updates: "0", or "3 (1 nonfinite, 2 blowup)"."""
        total = sum(self.session_skips.values())
        parts = ", ".join(f"{n} {why}" for why, n in sorted(self.session_skips.items()))
        return f"{total} ({parts})" if total else "0"

    def __call__(self, run: RunState, status: StepStatus) -> None:
        if self.steps == 0 or not (due(run.cfg.train.log_every, status) or status.stopping):
            return
        rec = self.record(run, status.done)
        self.log.write(rec)
        if self.tracker:
            run.acc.log({f"train/{k}": v for k, v in rec.items() if k != "step"}, step=status.done)
        loss = rec.get("loss")
        rate = next((k for k in rec if k.endswith("_per_s")), None)
        self.bar.set_postfix({"loss": f"{loss:.4f}" if loss is not None else "skipped",
                              **({rate: f"{rec[rate]:.0f}"} if rate else {}),
                              **({"skipped": self.skip_text()} if self.session_skips else {})}, refresh=False)
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
        if status.stopping and run.main:
            print(f"stopped by signal at step {status.done}: checkpoint {path}", flush=True)
