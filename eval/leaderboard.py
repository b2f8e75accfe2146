"""Leaderboard of evaluation records: a markdown table and a plot of FID against training step.

    python eval/leaderboard.py RUN_DIR_OR_RECORD... [--plot OUT.png] [--paper | --no-paper]

Reads RUN_DIR/eval/*.json (written by eval/fid.py) or record files given directly. The MuToR paper's
reported ImageNet rows are shown alongside when a record's reference names ImageNet. A commit column
names each run's code; one warning line says when the runs differ in code, library versions or data.
The decoding column gives forwards per image, not the speed each sample file recorded (its tokens/s
depend on the machine and its load at the time; bench/sample.py times decoding modes side by side).
"""
from __future__ import annotations

import argparse
import sys

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

from mutor2d.cli import HelpFormatter
from mutor2d.engine.entry import run_entry
from mutor2d.evaluation import records
from mutor2d.io import warn
from mutor2d.plugins import load_plugins


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    ap.add_argument("runs", nargs="+", help="run folders (their eval/*.json) or record files")
    ap.add_argument("--plot", default=None, help="write a PNG of FID against training step here (default: no plot)")
    ap.add_argument("--paper", action=argparse.BooleanOptionalAction, default=None,
                    help="show the paper's ImageNet rows (default: when a record's reference is ImageNet)")
    return ap


def main(argv=None) -> str:
    args = build_parser().parse_args(argv)
    load_plugins()
    recs, notes = records.read_records(args.runs)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if not recs:
        raise records.RecordError("no evaluation records found in " + ", ".join(args.runs))
    table = records.markdown_table(recs, paper=args.paper)
    print(table)
    for line in filter(None, (records.provenance_warning(recs), records.data_set_warning(recs))):
        warn(line)
    if args.plot:
        print(f"plot: {records.plot_fid(recs, args.plot, paper=args.paper)}", file=sys.stderr)
    return table


if __name__ == "__main__":
    run_entry(main)
