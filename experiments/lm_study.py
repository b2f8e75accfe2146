"""CPU-scale language study: next-token vs MuToR-1D (vs the multi-head baseline) on a synthetic task.

    python experiments/lm_study.py --out runs/lm_study [--seeds 0 1 2] [--plot docs/lm_study.png]
    python experiments/lm_study.py --task stargraph --out runs/lm_stargraph [--plot docs/lm_stargraph.png]
    python experiments/lm_study.py [--task stargraph] --quick --out /tmp/lm_study_quick   # seconds (CI)
    python experiments/lm_study.py --task arith_pretrained --seeds 0 1 2 3 4 5 6 7 --out runs/lm_pretrained
    python experiments/lm_study.py --task stargraph_pretrained --seeds 0 1 2 3 4 5 6 7 --out runs/lm_stargraph_pretrained
    python experiments/lm_study.py --task arith_settings --seeds 0 1 2 3 4 5 6 7 --out runs/lm_settings
    python experiments/lm_study.py --task arith_budget --seeds 0 1 2 3 4 5 6 7 --out runs/lm_budget

Tasks (arith, stargraph, arith_pretrained[_4step], stargraph_pretrained, arith_settings, arith_budget)
and what the study writes: experiments/README.md; protocols and results: docs/RESULTS.md. The parts:
lmstudy/tasks.py, lmstudy/runs.py (train.py per arm and seed, resumable), lmstudy/report.py.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

from mutor2d.cli import HelpFormatter
from mutor2d.evaluation.plan import STEPS_LIMIT, StudyError

if (HERE := str(Path(__file__).resolve().parent)) not in sys.path:     # lmstudy/, also when loaded by path
    sys.path.insert(0, HERE)
# with the parts the tests reach through the script (the names not used here: hence noqa)
from lmstudy.report import (BOOTSTRAP_DRAWS, SKIP_TOLERANCE, bootstrap, bootstrap_table,  # noqa: F401
                            check_bases, check_skips, curve_table, interval_table, plot, plot_bands,
                            reference_arm, table, write_summary)
from lmstudy.runs import (arms, base_recipe, load_jsonl, records_of, run_all, run_name,  # noqa: F401
                          write_data)
from lmstudy.tasks import TASKS, graph_edges, graph_key, stargraph_records, stargraph_tokenizer  # noqa: F401


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    ap.add_argument("--task", choices=list(TASKS), default="arith", help="the task")
    ap.add_argument("--out", default=None, help="study folder (data, models, runs, table.md; default "
                                                "runs/lm_study for arith, runs/lm_stargraph for stargraph)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default 0 1 2)")
    ap.add_argument("--max-steps", type=int, default=None, help="training steps per run (default: the study's)")
    ap.add_argument("--plot", default=None, help="plot file (default OUT/lm_study.png, OUT/lm_stargraph.png)")
    ap.add_argument("--quick", action="store_true", help="a tiny version for CI (one seed, a few steps)")
    ap.add_argument("--skip-tolerance", type=float, default=SKIP_TOLERANCE,
                    help="paired arms may differ in skipped updates by this share of the steps (default 0.01)")
    ap.add_argument("--allow-skip-mismatch", action="store_true",
                    help="report paired differences even when the arms' skipped updates differ by more")
    ap.add_argument("--bases", default="runs/bases", help="shared pretrained bases, one folder per recipe's key "
                                                          "(BASES/KEY12; reused by every study of that recipe)")
    ap.add_argument("--allow-mixed-bases", action="store_true",
                    help="pair arms whose runs fine-tuned different initial weights (refused by default)")
    return ap


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """argparse's one-line error for a flag taken as not given ('', 0), running for ever, or a file for a folder."""
    if not 0 <= args.skip_tolerance < 1:
        ap.error(f"--skip-tolerance {args.skip_tolerance}: expected a share of the steps in [0, 1)")
    if args.max_steps is not None and not 1 <= args.max_steps <= STEPS_LIMIT:
        ap.error(f"--max-steps {args.max_steps}: expected 1..{STEPS_LIMIT}")
    for flag, value, what, folder in (("--out", args.out, "a study folder", True),
                                      ("--bases", args.bases, "a folder of bases", True),
                                      ("--plot", args.plot, "a .png path", False)):
        if value is not None and (not value.strip() or (folder and Path(value).is_file())):
            ap.error(f"{flag} {value!r}: expected {what}")


def main(argv=None) -> str:
    ap = build_parser()
    args = ap.parse_args(argv)
    check_args(ap, args)
    task = TASKS[args.task]
    size = task.quick if args.quick else task.size
    if args.max_steps is not None:
        size = dataclasses.replace(size, max_steps=args.max_steps)
    import torch
    torch.set_num_threads(1)                 # the study machine is shared; 2 threads ran slower here
    out = Path(args.out or f"runs/{task.stem}")
    runs, shared = run_all(out, task, size, args.seeds[:1] if args.quick else args.seeds, Path(args.bases))
    bases = check_bases(runs, args.allow_mixed_bases)
    if not args.allow_skip_mismatch:
        check_skips(runs, size.max_steps, task.reference, args.skip_tolerance)
    text = (table(runs, size.max_steps) + "\n\nIntervals and paired differences:\n\n"
            + interval_table(runs, size.max_steps, out, task.reference) + "\n\nMean test accuracy by step:\n\n" + curve_table(runs))
    boot = bootstrap(runs, task.reference) if task.bootstrap else None
    if boot:
        text += ("\n\nPer step, intervals over seeds and test items (paired bootstrap, "
                 f"{BOOTSTRAP_DRAWS} draws):\n\n" + bootstrap_table(boot, task.reference))
    (out / "table.md").write_text(text + "\n")
    write_summary(out, args.task, runs, size, bases, shared, boot)
    print(text)
    path = Path(args.plot or out / f"{task.stem}.png")
    print(f"plot: {plot_bands(boot, path, task.title) if boot else plot(runs, path, task.title)}", file=sys.stderr)
    return text


if __name__ == "__main__":
    try:
        main()
    except StudyError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
