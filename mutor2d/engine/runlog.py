"""RUN/log.jsonl: one line per logged step (averages over ``train.log_every`` steps), one per skipped
update (``{"event": "skip", ...}``: engine/health.py's verdict) and one per event of the run's life
(resume, preempted). Torch-free, so that tables over runs (leaderboards, studies) read it cheaply."""
from __future__ import annotations

import json
import math
from pathlib import Path


def _finite(record):
    """JSON has no NaN/Infinity: non-finite numbers are written as null (in nested records too)."""
    if isinstance(record, dict):
        return {k: _finite(v) for k, v in record.items()}
    return None if isinstance(record, float) and not math.isfinite(record) else record


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
    replaced by the new ones; cut lines are skipped; events (resume, preempted, skip) are not returned."""
    return _history(run_dir, lambda rec: "event" not in rec)


def read_skips(run_dir) -> list[dict]:
    """The run's skipped updates, one ``{"event": "skip", "step", "reason", "quantity", "values",
    "limits"}`` each (engine/health.py), as its history: those of steps redone after a resume dropped."""
    return _history(run_dir, lambda rec: rec.get("event") == "skip")


def _history(run_dir, keep) -> list[dict]:
    out: list[dict] = []
    for line in (Path(run_dir) / "log.jsonl").read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("event") == "resume":
            out = [r for r in out if r.get("step", 0) <= rec["step"]]
        elif keep(rec):
            out.append(rec)
    return out


def skip_counts(run_dir, upto: int | None = None) -> dict[str, int]:
    """Skipped updates of the run (up to step ``upto``) by reason; {} when none or no log."""
    if not (Path(run_dir) / "log.jsonl").is_file():
        return {}
    out: dict[str, int] = {}
    for skip in read_skips(run_dir):
        if upto is None or skip["step"] <= upto:
            out[skip["reason"]] = out.get(skip["reason"], 0) + 1
    return out

