"""Star-graph evaluation: greedy solve rate, first-step accuracy and teacher-forced register accuracy
of a checkpoint on the fixed held-out graphs of its config.

    python eval/stargraph.py --ckpt RUN_DIR_OR_FILE [--num 2000] [--json OUT.json]

Writes a JSON record (default RUN_DIR/eval/stargraph_stepXXXXXXXX.json; DIR/STEM_eval/ beside a checkpoint
file outside a run folder) that eval/leaderboard.py reads.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

from mutor2d import io
from mutor2d.checkpoint import inference, locate          # the command line parses before torch is imported (in main)
from mutor2d.cli import HelpFormatter
from mutor2d.engine.entry import run_entry
from mutor2d.evaluation import records
from mutor2d.plugins import load_plugins


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    ap.add_argument("--ckpt", required=True, help="checkpoint file or run folder (newest checkpoint)")
    ap.add_argument("--num", type=int, default=0, help="evaluate the first NUM test graphs (0 = all)")
    ap.add_argument("--offsets", default=None,
                    help="register offsets d to probe, e.g. 2,3,4 (default 2..path_len-1; register models only)")
    ap.add_argument("--batch-size", type=int, default=256, help="test graphs per forward")
    ap.add_argument("--no-ema", action="store_true", help="use the raw weights even if EMA exists")
    ap.add_argument("--json", default=None, help="record path (default: RUN/eval/stargraph_stepXXXXXXXX.json, or "
                                                 "DIR/STEM_eval/ beside a checkpoint file outside a run folder)")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    """The flags, checked: a bad --num or --batch-size is a one-line ValueError naming it."""
    args = build_parser().parse_args(argv)
    for flag, low, note in (("num", 0, " (0 = all test graphs)"), ("batch_size", 1, "")):
        if (value := getattr(args, flag)) < low:
            raise ValueError(f"--{flag.replace('_', '-')} {value}: expected >= {low}{note}")
    return args


def probe_offsets(text: str | None, path_len: int) -> list[int]:
    """--offsets, each in 1..path_len-1 (default 2..path_len-1)."""
    try:
        offsets = [int(d) for d in text.split(",") if d.strip()] if text else list(range(2, path_len))
    except ValueError:
        raise ValueError(f"--offsets {text}: expected comma-separated integers") from None
    if any(d < 1 or d >= path_len for d in offsets):
        raise ValueError(f"--offsets {text}: each d must be in 1..{path_len - 1}")
    return offsets


def make_record(cfg, step: int, path, rates: dict, tf: dict) -> dict:
    o, d = cfg.objective, cfg.data
    return {
        "method": o.name, "objective": dataclasses.asdict(o), "step": step,
        "metrics": {"solve_rate": rates["solve_rate"], "first_step_acc": rates["first_step_acc"],
                    "ntp_acc_by_position": tf["ntp"], "reg_acc_by_target": tf["reg"]},
        "evaluator": "stargraph greedy decoding + teacher-forced accuracy",
        "reference": f"held-out path-star graphs (degree {d.degree}, path_len {d.path_len}, "
                     f"{d.num_nodes} nodes, seed {d.data_seed + 1}{', reversed answers' if d.reverse_answer else ''})",
        "n": rates["n"], "sampling": {"temperature": 0.0}, "checkpoint": str(path), "seed": cfg.train.seed,
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    from mutor2d.data.stargraph import stargraph_dataset
    from mutor2d.evaluation.stargraph import solve_rates, teacher_forced_accuracy
    load_plugins()
    path = locate.resolve(args.ckpt)
    model, cfg, step = inference.load_model(path, use_ema=not args.no_ema)
    if cfg.data.name != "stargraph":
        raise ValueError(f"--ckpt {args.ckpt}: trained on data.name={cfg.data.name!r}, not stargraph")
    offsets = probe_offsets(args.offsets, cfg.data.path_len)
    test = stargraph_dataset(cfg.data, "test")
    if args.num:
        test.prompts, test.answers = test.prompts[: args.num], test.answers[: args.num]
    torch.manual_seed(0)
    rates = solve_rates(model, test, args.batch_size)
    tf = teacher_forced_accuracy(model, test, offsets, args.batch_size)
    record = make_record(cfg, step, path, rates, tf)
    where = Path(args.json) if args.json else locate.output_dir(path, "eval") / f"stargraph_step{step:08d}.json"
    with io.exit_on_write_error(str(where)):
        out = records.write_record(record, where)
    print(f"step {step}: solve rate {rates['solve_rate']:.3f}, first-step accuracy "
          f"{rates['first_step_acc']:.3f} on {rates['n']} graphs -> {out}")
    for d, accs in tf["reg"].items():
        print(f"  register d={d}: accuracy by target position {accs}")
    print(json.dumps({"solve_rate": rates["solve_rate"], "first_step_acc": rates["first_step_acc"]}))
    return record


if __name__ == "__main__":
    run_entry(main)
