"""The convergence study's GPU protocol: one block of seeds of the pre-registered test (docs/RESULTS.md, "The
convergence study"; mutor2d/evaluation/speedup.py) at GPU scale, in one command that fits one lent device call.

    python experiments/gpu_study.py --block K --out "$OUT"          # on the device: seeds 2K, 2K+1
    python experiments/gpu_study.py --merge DIR [DIR ...] --into runs/gpu_study   # here: blocks -> one study
    python experiments/compare.py --report-only --out runs/gpu_study --config study_photos_convergence_gpu.yaml \
        --methods next-token,mutor-2d-D4 --seeds 0,1,... --steps 2000 ... (the flags --print-flags shows)

A block trains next-token to 2T = 4,000 steps and dense MuToR-2D (D = 4) to T = 2,000 for each of its seeds, all
as concurrent processes on the one GPU (configs/study_photos_convergence_gpu.yaml: an 8 x 256 decoder, batch 256,
bf16, EMA), scores every checkpoint of the protocol with 2,000 class-balanced samples at cfg 2 on the device, then
deletes the checkpoints and sample files, leaving records (with provenance), logs and configs: what the device
call brings back. It carries (device call `carry`, under 64 MiB with the tree): data/photos_codes,
data/photos_codes_test, runs/vq_photos/checkpoints/step_00002000.pt and runs/gpu_cache (the photos classifier:
`mkdir -p runs/gpu_cache && cp ~/.cache/mutor2d/photos_classifier_*.pt runs/gpu_cache/`; the script reads it
through MUTOR2D_CACHE=runs/gpu_cache). --toy runs the same path at CPU test sizes (tests/test_speedup.py).
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

from mutor2d.cli import HelpFormatter
from mutor2d.engine.entry import run_entry
from mutor2d.evaluation.plan import StudyError
from mutor2d.evaluation.speedup import method_steps, reference_steps

ROOT = Path(__file__).resolve().parent.parent
METHODS = "next-token,mutor-2d-D4"
SCALES = {   # T, samples per score, extra steps scored (the convergence ratio's curve), device, processes, overrides
    "gpu": dict(T=2000, num=2000, ntp_extra=[1000, 2400, 2800, 3200], method_extra=[1000], device="cuda", jobs=2,
                config="study_photos_convergence_gpu.yaml", overrides=[]),
    "toy": dict(T=10, num=10, ntp_extra=[], method_extra=[], device="cpu", jobs=0,    # in this process
                config="study_photos_convergence.yaml",
                overrides=["model.n_layer=1", "model.n_head=2", "model.dim=32", "train.batch_size=4",
                           "optim.warmup_steps=1", "train.log_every=1", "train.ema_decay=0.5"]),
}


def study_flags(block: int, per_block: int, out: Path, scale: str, extra: list[str]) -> list[str]:
    """experiments/compare.py's flags for one block (its seeds per_block * block ...), then ``extra``."""
    s = SCALES[scale]
    seeds = range(block * per_block, (block + 1) * per_block)
    evals = sorted(set(method_steps(s["T"]) + s["method_extra"]))
    ntp = sorted(set(reference_steps(s["T"]) + s["ntp_extra"]) - set(evals))
    flags = ["--config", s["config"], "--out", str(out), "--methods", METHODS, "--seeds", ",".join(map(str, seeds)),
             "--steps", str(s["T"]), "--eval-steps", ",".join(map(str, evals)),
             "--ntp-eval-steps", ",".join(map(str, ntp)), "--speedup", "mutor-2d-D4", "--num", str(s["num"]),
             "--cfg", "2.0", "--compute-matched", "", "--jobs", str(max(1, s["jobs"] * per_block)),
             "--device", s["device"], "--floor-draws", "2"]
    return flags + [f for o in s["overrides"] for f in ("--set", o)] + extra


def prune(out: Path) -> None:
    """Leave records, logs, configs and provenance: drop every run's checkpoints and sample files."""
    for run in out.glob("*/seed*"):
        for heavy in ("checkpoints", "samples"):
            shutil.rmtree(run / heavy, ignore_errors=True)


def merge(blocks: list[Path], into: Path) -> None:
    """Copy the run folders of each block into one study folder; a seed in two blocks is an error."""
    for block in blocks:
        for run in sorted(block.glob("*/seed*")):
            dest = into / run.parent.name / run.name
            if dest.exists():
                raise StudyError(f"{run}: {dest} exists already (each block holds other seeds)")
            shutil.copytree(run, dest)
        if (block / "floor").is_dir() and not (into / "floor").exists():
            shutil.copytree(block / "floor", into / "floor")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--block", type=int, default=0, help="block number K: seeds per_block*K ...")
    ap.add_argument("--per-block", type=int, default=2, help="seeds per block (2 x as many concurrent processes)")
    ap.add_argument("--out", help="the block's study folder")
    ap.add_argument("--toy", action="store_true", help="CPU test sizes, through the same path")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="one more override for every run")
    ap.add_argument("--cache-dir", default=None, help="classifier cache (default MUTOR2D_CACHE)")
    ap.add_argument("--print-flags", action="store_true", help="print the compare.py flags and stop")
    ap.add_argument("--merge", nargs="+", type=Path, help="block folders to merge (with --into)")
    ap.add_argument("--into", type=Path, help="the merged study folder")
    return ap


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.merge:
        if not args.into:
            raise StudyError("--merge: expected --into FOLDER")
        return merge(args.merge, args.into)
    if not args.out or args.block < 0 or args.per_block < 1:
        raise StudyError(f"--out {args.out!r} / --block {args.block} / --per-block {args.per_block}: expected a "
                         "folder, K >= 0 and >= 1 seeds")
    extra = [f for o in args.overrides for f in ("--set", o)] + (["--cache-dir", args.cache_dir] if args.cache_dir else [])
    flags = study_flags(args.block, args.per_block, Path(args.out), "toy" if args.toy else "gpu", extra)
    if args.print_flags:
        return print(" ".join(flags))
    sys.path.insert(0, str(ROOT / "experiments"))
    import compare
    compare.main(flags)
    prune(Path(args.out))


if __name__ == "__main__":
    run_entry(main)
