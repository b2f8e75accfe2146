"""Position extrapolation: regular-token NLL by position past the trained length, several runs side by side.

    python eval/extrapolation.py lm --run next-token=RUN_A --run mutor-1d=RUN_B ... --data LONG.jsonl \
        [--data-name gsm8k] [--limit N] --out curves.json
    python eval/extrapolation.py image --run next-token=RUN_A --run mutor-2d=RUN_B ... [--stack 2] \
        [--wrap] [--split test] --out curves.json

``--run LABEL=RUN`` is repeatable; runs sharing a label (seeds) are pooled in the table (mean ± sd over
runs). Teacher-forced next-token NLL, nats per token, the regular pathway only (registers absent).

lm: a language-model run folder of train.py (task lm) on held-out lines (--data, the formats of
data.name) with answers longer than the run's training answers; NLL per answer position. The trained
limits are the longest training answer of the run, then of its base when model.hf is a run folder
too (mutor2d.lm.extrapolation); positions past them are marked "base range" / "beyond".

image: an image run folder or checkpoint on grids taller than trained: ``--stack`` test images of one
class stacked vertically, conditioned on that class (mutor2d.evaluation.extrapolation); NLL per grid
row, rows >= the trained height "beyond". Every test image appears once in every block, so "beyond
minus inside" compares the very same tokens at their native and at shifted rows; --wrap (the control)
keeps the stacking but gives every block the trained rows' positions (row mod the trained height).

Writes --out (JSON: each run's curve, its trained limits, the table's numbers) and prints the table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

from mutor2d.cli import HelpFormatter          # the command line parses and checks before torch is imported
from mutor2d.engine.entry import run_entry


def labelled_run(text: str) -> tuple[str, str]:
    label, sep, run = text.partition("=")
    if not sep or not label or not run:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL=RUN")
    return label, run


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:6]))
    sub = ap.add_subparsers(dest="kind", required=True, metavar="{lm,image}", help="what the runs are (each takes --help)")
    lm = sub.add_parser("lm", formatter_class=HelpFormatter, help="language-model runs on longer answers",
                        description="NLL per answer position of language-model runs on held-out longer answers.")
    lm.add_argument("--data", required=True, help="held-out jsonl file (answers longer than the training ones)")
    lm.add_argument("--data-name", choices=["jsonl", "gsm8k", "math"], default="gsm8k",
                    help="format of --data, as the config's data.name")
    lm.add_argument("--limit", type=int, default=0, help="the first N lines only (0 = all)")
    image = sub.add_parser("image", formatter_class=HelpFormatter, help="image runs on taller grids",
                           description="NLL per grid row of image runs on grids of --stack test images stacked "
                                       "vertically (same class, its class prefix).")
    image.add_argument("--stack", type=int, default=2, help="images per grid (grid height: stack x trained height)")
    image.add_argument("--wrap", action="store_true",
                       help="the control: every block at the trained rows' position ids (row mod trained height), "
                            "the context above without new positions")
    image.add_argument("--split", choices=["test", "val"], default="test", help="the data split the images come from")
    for p in (lm, image):
        p.add_argument("--run", action="append", type=labelled_run, required=True, metavar="LABEL=RUN",
                       help="a run folder (image runs: also a checkpoint) under a label; repeatable, a label "
                            "shared by several runs pools them")
        p.add_argument("--out", required=True, help="JSON file to write")
    return ap


STACK_LIMIT = 256       # images a grid: 65,536 tokens of 16x16 codes


def parse_args(argv=None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not 2 <= getattr(args, "stack", 2) <= STACK_LIMIT:
        ap.error(f"--stack {args.stack}: expected 2..{STACK_LIMIT} (a grid taller than trained)")
    if getattr(args, "limit", 0) < 0:
        ap.error(f"--limit {args.limit}: expected >= 0")
    if Path(args.out).is_dir():
        ap.error(f"--out {args.out}: is a folder; expected the path of the JSON file to write")
    for _, run in args.run:
        if not Path(run).exists():
            ap.error(f"--run {run}: no such run folder or checkpoint")
    return args


def curves(args) -> list[dict]:
    """[{"label", "run", "curve", ...}] for every --run."""
    import torch
    torch.set_num_threads(1)
    if args.kind == "lm":
        from mutor2d.lm.extrapolation import answer_curve
        from mutor2d.lm.records import load_records
        records = load_records(args.data_name, args.data)[:args.limit or None]
        out = []
        for label, run in args.run:
            curve, chain = answer_curve(run, records)
            out.append({"label": label, "run": run, "curve": curve, "trained": chain})
        return out
    from mutor2d.evaluation.extrapolation import image_curve, open_image_run
    out = []
    for label, run in args.run:
        model, cfg, grid, codes, labels = open_image_run(run, args.split)
        curve = image_curve(model, cfg.model, grid, codes, labels, args.stack, args.wrap)
        out.append({"label": label, "run": run, "curve": curve,
                    "trained_grid": list(grid), "grid": [args.stack * grid[0], grid[1]]})
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    from mutor2d import provenance
    from mutor2d.evaluation.extrapolation import summarise, table
    from mutor2d.evaluation.records import run_provenance
    from mutor2d.io import exit_on_write_error, write_text_atomic
    found = curves(args)
    summary = summarise(found)
    unit = "answer token" if args.kind == "lm" else "row"
    result = {"kind": args.kind, "unit": unit, **{k: vars(args).get(k) for k in ("data", "stack", "wrap")},
              "runs": [{**r, "curve": r["curve"].to_dict()} for r in found], "summary": summary,
              "provenance": {"eval": provenance.provenance(),
                             "runs": {r["label"]: run_provenance(Path(r["run"]), r["run"]) for r in found}}}
    with exit_on_write_error(args.out):
        write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")
    print(table(summary, unit))
    print(f"wrote {args.out}", file=sys.stderr)
    return result


if __name__ == "__main__":
    run_entry(main)
