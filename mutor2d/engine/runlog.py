"""RUN/log.jsonl: one line per logged step (averages over ``train.log_every`` steps), one per skipped
update (``{"event": "skip", ...}``: engine/health.py's verdict) and one per event of the run's life
(resume, preempted). Torch-free, so that tables over runs (leaderboards, studies) read it cheaply."""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter
from pathlib import Path

from ..cli import HelpFormatter


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
    return dict(Counter(skip["reason"] for skip in read_skips(run_dir) if upto is None or skip["step"] <= upto))


def skip_words(counts: dict[str, int]) -> str:
    """Skipped updates by reason in words: "0", or "3 (1 nonfinite, 2 blowup)"."""
    total = sum(counts.values())
    return f"{total} ({', '.join(f'{n} {why}' for why, n in sorted(counts.items()))})" if total else "0"


def last_step(run_dir) -> int:
    """The last step the run logged (0 when none)."""
    return max((r.get("step", 0) for r in read_log(run_dir)), default=0) if (Path(run_dir) / "log.jsonl").is_file() else 0


def eval_text(record: dict) -> str:
    """A log record's evaluation (its ``eval_*`` values) in words: "accuracy 0.912, n 100"; "" if none."""
    return ", ".join(f"{k[len('eval_'):]} {v:.4g}" if isinstance(v, float) else f"{k[len('eval_'):]} {v}"
                     for k, v in record.items() if k.startswith("eval_") and v is not None)


def summary(run_dir, first: int, last: int, seconds: float, checkpoint: Path | None,
            describe=eval_text) -> str:
    """The end-of-run line: the steps this session trained and its time, the last logged loss and the
    last evaluation of RUN/log.jsonl (in words by ``describe``: a record -> its evaluation, "" if it
    has none; the run kind's ``eval_text`` when it has one), the newest ``checkpoint`` and the run
    folder (absolute paths)."""
    records = read_log(run_dir) if (Path(run_dir) / "log.jsonl").is_file() else []
    loss = next((r["loss"] for r in reversed(records) if r.get("loss") is not None), None)
    evaluated = next((r for r in reversed(records) if describe(r)), None)
    minutes, secs = divmod(round(seconds), 60)
    samples = Path(run_dir) / "samples"
    parts = [f"done: steps {first}-{last} in {minutes} min {secs} s",
             f"last logged loss {loss:.4f}" if loss is not None else "no loss logged",
             f"evaluation at step {evaluated['step']}: {describe(evaluated)}" if evaluated else "",
             f"newest checkpoint {Path(checkpoint).absolute()}" if checkpoint else "",
             f"run folder {Path(run_dir).absolute()}",
             f"sample grids {samples.absolute()}" if samples.is_dir() else ""]
    return "; ".join(p for p in parts if p)


def seedless(run_dir) -> str:
    """A run folder's name without its seed (``NAME_sN`` or ``NAME/seedN``): the arm it belongs to."""
    return re.sub(r"(_s\d+|/seed\d+)$", "", str(run_dir))


def skip_table(runs: list) -> str:
    """Markdown: per arm (runs grouped by :func:`seedless`), the runs, updates trained, updates the
    blow-up guard skipped (by reason) and the share skipped: the guard's false positives when the runs
    are healthy."""
    groups: dict[str, list[Path]] = {}
    for run in runs:
        groups.setdefault(seedless(run), []).append(Path(run))
    lines = ["| runs | count | updates | skipped | share skipped |", "|---|---|---|---|---|"]
    for arm, members in groups.items():
        updates = sum(last_step(r) for r in members)
        by = sum((Counter(skip_counts(r)) for r in members), Counter())
        share = f"{sum(by.values()) / updates:.2%}" if updates else "–"
        lines.append(f"| {arm} | {len(members)} | {updates} | {skip_words(by)} | {share} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m mutor2d.engine.runlog", formatter_class=HelpFormatter,
                                 description="The blow-up guard's skipped updates per arm (seeds pooled), as markdown.")
    ap.add_argument("runs", nargs="+", help="run folders (holding log.jsonl)")
    return ap


def main(argv=None) -> str:
    args = build_parser().parse_args(argv)
    if missing := [f for f in args.runs if not (Path(f) / "log.jsonl").is_file()]:
        print(f"error: {missing[0]!r} is not a run folder (no log.jsonl)", file=sys.stderr)
        raise SystemExit(2)
    text = skip_table(args.runs)
    print(text)
    return text


if __name__ == "__main__":
    from ..preempt import exit_on_ctrl_c
    exit_on_ctrl_c()        # python -m: a Ctrl-C mid-way is one line, exit 130
    main()
