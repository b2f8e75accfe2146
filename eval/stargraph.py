"""Star-graph evaluation: greedy solve rate, first-step accuracy and teacher-forced register accuracy
of a checkpoint on the fixed held-out graphs of its config.

    python eval/stargraph.py --ckpt RUN_DIR_OR_FILE [--num 2000] [--json OUT.json]

Writes a JSON record (default RUN_DIR/eval/stargraph_stepXXXXXXXX.json) that eval/leaderboard.py reads.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from mutor2d import checkpoint
from mutor2d.config import ConfigError
from mutor2d.stargraph import build_stargraph, solve_rates, teacher_forced_accuracy


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", required=True, help="checkpoint file or run folder (newest checkpoint)")
    ap.add_argument("--num", type=int, default=0, help="evaluate the first NUM test graphs (0 = all)")
    ap.add_argument("--offsets", default=None,
                    help="register offsets d to probe, e.g. 2,3,4 (default 2..path_len-1; register models only)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--no-ema", action="store_true", help="use the raw weights even if EMA exists")
    ap.add_argument("--json", default=None, help="output JSON path")
    args = ap.parse_args(argv)
    try:
        path = checkpoint.resolve(args.ckpt)
        model, cfg, step = checkpoint.load_model(path, use_ema=not args.no_ema)
        if cfg.data.name != "stargraph":
            raise ValueError(f"--ckpt {args.ckpt}: trained on data.name={cfg.data.name!r}, not stargraph")
        offsets = ([int(d) for d in args.offsets.split(",") if d.strip()] if args.offsets
                   else list(range(2, cfg.data.path_len)))
        if any(d < 1 or d >= cfg.data.path_len for d in offsets):
            raise ValueError(f"--offsets {args.offsets}: each d must be in 1..{cfg.data.path_len - 1}")
    except (FileNotFoundError, ValueError, ConfigError) as e:
        raise SystemExit(f"error: {e}")
    test = build_stargraph(cfg.data, "test")
    if args.num:
        test.prompts, test.answers = test.prompts[: args.num], test.answers[: args.num]
    torch.manual_seed(0)
    rates = solve_rates(model, test, args.batch_size)
    tf = teacher_forced_accuracy(model, test, offsets, args.batch_size)
    o = cfg.objective
    record = {
        "method": o.name, "objective": dataclasses.asdict(o), "step": step,
        "metrics": {"solve_rate": rates["solve_rate"], "first_step_acc": rates["first_step_acc"],
                    "ntp_acc_by_position": tf["ntp"], "reg_acc_by_target": tf["reg"]},
        "evaluator": "stargraph greedy decoding + teacher-forced accuracy",
        "reference": f"held-out path-star graphs (degree {cfg.data.degree}, path_len {cfg.data.path_len}, "
                     f"{cfg.data.num_nodes} nodes, seed {cfg.data.data_seed + 1}"
                     f"{', reversed answers' if cfg.data.reverse_answer else ''})",
        "n": rates["n"], "sampling": {"temperature": 0.0}, "checkpoint": str(path),
        "seed": cfg.train.seed,
    }
    out = Path(args.json) if args.json else path.parent.parent / "eval" / f"stargraph_step{step:08d}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    print(f"step {step}: solve rate {rates['solve_rate']:.3f}, first-step accuracy "
          f"{rates['first_step_acc']:.3f} on {rates['n']} graphs -> {out}")
    for d, accs in tf["reg"].items():
        print(f"  register d={d}: accuracy by target position {accs}")
    print(json.dumps({"solve_rate": rates["solve_rate"], "first_step_acc": rates["first_step_acc"]}))
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
