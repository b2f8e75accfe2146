"""Rehearse the path users run at scale, end to end, with the commands they type (subprocesses).

    python experiments/rehearse.py --quick [--workdir DIR]     # CI size (tests/test_rehearsal.py), ~2 min
    python experiments/rehearse.py --full  [--workdir DIR]     # by hand: the real VQ-16 and GPT-B shapes

Stages (one timing line each, then a JSON summary on the last line of stdout): images, vq, extract,
train+stop, resume, sample, fid, board, each described in experiments/README.md. The driver exits 1
naming the first stage whose command or output is wrong. Parts: rehearsal/procs.py, rehearsal/stages.py.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

from mutor2d.cli import HelpFormatter
from mutor2d.config_files import parse_override
from mutor2d.evaluation.plan import STEPS_LIMIT

from rehearsal.procs import PY, ROOT, StageError, child_env, launcher, log_steps, run, stop_mid_run
from rehearsal.stages import (SIZES, RehearsalSize, check_board, check_codes, check_npz, check_record, check_resume,
                              check_stop, make_images, make_standin_inception, make_vq, seconds_per_step,
                              write_reference)
from rehearsal.stages import LAUNCHER_KILLED, checkpoint_of  # noqa: F401  (the tests reach them through the script)

CONFIG = "llamagen_b_mutor2d.yaml"
STAGES = ("images", "vq", "extract", "train+stop", "resume", "sample", "fid", "board")


def train_command(args, size: RehearsalSize, w: Path, data: Path) -> list[str]:
    """train.py with the shipped GPT-B MuToR-2D config on ``data``'s codes; --set only what must change."""
    sets = [f"train.batch_size={size.batch_size}", f"train.max_steps={size.max_steps}",
            f"data.path={data / 'codes'}", f"data.tokenizer={data / 'vq_ds16_c2i.pt'}",
            f"train.ckpt_every={size.ckpt_every}", f"train.sample_every={size.max_steps}", "train.log_every=1",
            "model.num_classes=2", "sample.classes=[0,1]",     # the data has 2 classes, the config 1000
            f"train.sharding={args.sharding}", *size.sets, *args.overrides]
    return (launcher(args.launcher) + [str(ROOT / "train.py"), "--config", CONFIG, "--out", str(w / "run")]
            + [word for s in sets for word in ("--set", s)])


def stage_jobs(args, size: RehearsalSize, w: Path, env: dict, state: dict) -> dict:
    """stage name -> a function returning that stage's details (each checks its own outputs)."""
    run_dir, logs = w / "run", w / "logs"
    data = Path(args.reuse).resolve() if args.reuse else w      # the ImageFolder, the VQ file and the codes
    train = train_command(args, size, w, data)
    n_images, augs = 2 * size.per_class, 2 * size.crops
    extract = launcher(args.launcher) + [
        str(ROOT / "tokenizers/extract_codes.py"), "--images", str(w / "images"), "--tokenizer",
        str(w / "vq_ds16_c2i.pt"), "--out", str(w / "codes"), "--crops", str(size.crops),
        "--shard-size", str(max(1, size.per_class)), "--no-progress"]     # 2 shards: one per process
    sample = launcher(args.launcher, script_is_python=False) + [
        str(ROOT / "sample.py"), "--ckpt", str(run_dir), "--num", str(size.num_samples),
        "--npz", str(run_dir / "samples.npz"), "--batch-size", str(size.sample_batch)]
    fid = [PY, str(ROOT / "eval/fid.py"), str(run_dir / "samples.npz"), "--ref", str(w / "ref_imagefolder256.npz"),
           "--inception-weights", str(w / "standin-inception.pth"), "--device", "cpu"]
    board = [PY, str(ROOT / "eval/leaderboard.py"), str(run_dir)]

    def stop():
        res = stop_mid_run(train, env, run_dir, size.stop_at, logs / "train.log", args.signal)
        state["stopped"] = check_stop(res, run_dir, size, args.signal, args.sharding)
        return state["stopped"]

    def resume():
        out = run("resume", train + ["--resume", "auto"], env, logs / "resume.log")
        found = check_resume(out, run_dir, state["stopped"]["step"], size.max_steps, args.sharding)
        return {**found, "seconds_per_step": seconds_per_step(log_steps(run_dir), size.batch_size)}

    def evaluate():
        write_reference(data / "images", w / "ref_imagefolder256.npz")
        make_standin_inception(w / "standin-inception.pth")
        run("fid", fid, env, logs / "fid.log")
        return check_record(run_dir)

    jobs = {
        "images": lambda: make_images(w / "images", size.per_class),
        "vq": lambda: make_vq(w / "vq_ds16_c2i.pt", size.vq_ch),
        "extract": lambda: (run("extract", extract, env, logs / "extract.log"),
                            check_codes(w / "codes", n_images, augs))[1],
        "train+stop": stop,
        "resume": resume,
        "sample": lambda: (run("sample", sample, env, logs / "sample.log"),
                           check_npz(run_dir / "samples.npz", size.num_samples))[1],
        "fid": evaluate,
        "board": lambda: check_board(run("board", board, env, logs / "board.log"), run_dir),
    }
    if args.reuse:                  # an earlier workdir of the same size provides the data
        for name in ("images", "vq", "extract"):
            jobs[name] = lambda: {"reused": str(data)}
    return jobs


def rehearse(args) -> dict:
    """Run the stages in order (up to --until); returns the summary. StageError on the first fault."""
    size = SIZES[args.size]
    size = replace(size, max_steps=args.max_steps or size.max_steps, stop_at=args.stop_at or size.stop_at)
    w = Path(args.workdir).resolve()
    if w.exists() and any(w.iterdir()):
        raise StageError(f"--workdir {w}: expected a new or empty folder")
    (w / "logs").mkdir(parents=True, exist_ok=True)
    env, state = child_env(w), {}
    summary = {"size": args.size, "launcher": args.launcher, "workdir": str(w), "stages": {}}
    for name, job in stage_jobs(args, size, w, env, state).items():
        t0 = time.perf_counter()
        details = job()
        dt = time.perf_counter() - t0
        summary["stages"][name] = {"seconds": round(dt, 2), **details}
        brief = {k: val for k, val in details.items() if k not in ("row", "record")}
        print(f"[rehearse] {name:<10} {dt:7.1f} s  {json.dumps(brief)[:160]}", flush=True)
        if name == args.until:
            break
    summary["total_seconds"] = round(sum(s["seconds"] for s in summary["stages"].values()), 2)
    return summary


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    size = ap.add_mutually_exclusive_group(required=True)
    size.add_argument("--quick", dest="size", action="store_const", const="quick", help="CI size")
    size.add_argument("--full", dest="size", action="store_const", const="full",
                      help="the real VQ-16 and GPT-B shapes (by hand: minutes per training step on 2 cores)")
    ap.add_argument("--workdir", default="runs/rehearsal", help="new or empty folder for everything made")
    ap.add_argument("--launcher", choices=("torchrun", "accelerate"), default="accelerate",
                    help="how the multi-process stages are started")
    ap.add_argument("--sharding", choices=("ddp", "fsdp"), default="ddp",
                    help="train.sharding of the training stages (fsdp: FSDP2, sharded checkpoints)")
    ap.add_argument("--signal", choices=("workers", "group", "nonmain"), default="workers",
                    help="SIGTERM the training processes (workers), the launcher's whole process group, or "
                         "only the ranks > 0 (WORKAROUND for large checkpoints, see the notes: torchrun then "
                         "sends rank 0 its first SIGTERM, so rank 0 finishes writing before it exits)")
    ap.add_argument("--until", choices=STAGES[:-1],
                    help="stop after this stage, e.g. to time the full size's first stages (default: run all)")
    ap.add_argument("--reuse", metavar="DIR", help="take images, VQ file and codes from an earlier --workdir "
                    "of the same size (skips those stages; default: make them)")
    ap.add_argument("--max-steps", type=int, help="override the size's train.max_steps (default: the size's)")
    ap.add_argument("--stop-at", type=int, help="override the step the SIGTERM follows (default: the size's)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="one more train.py --set item (experiments, e.g. data.num_workers=0)")
    ap.add_argument("--json", help="also write the summary here (default: stdout only)")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    """The flags; argparse's one-line error for a value '' / 0, running for ever, or a file / folder mix-up."""
    ap = build_parser()
    args = ap.parse_args(argv)
    steps = SIZES[args.size].max_steps if args.max_steps is None else args.max_steps
    if not 1 <= steps <= STEPS_LIMIT:
        ap.error(f"--max-steps {args.max_steps}: expected 1..{STEPS_LIMIT}")
    if args.stop_at is not None and not 1 <= args.stop_at < steps:
        ap.error(f"--stop-at {args.stop_at}: expected a step in 1..{steps - 1} (before --max-steps)")
    for flag, value in (("--workdir", args.workdir), ("--reuse", args.reuse)):
        if value is not None and (not value.strip() or Path(value).is_file()):
            ap.error(f"{flag} {value!r}: expected a folder")
    if args.json is not None and (not args.json.strip() or Path(args.json).is_dir()):
        ap.error(f"--json {args.json!r}: expected the path of a .json file")
    for item in args.overrides:
        try:
            parse_override(item)
        except ValueError as e:
            ap.error(str(e))
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    try:
        summary = rehearse(args)
    except StageError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
