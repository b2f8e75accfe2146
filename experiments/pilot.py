"""The convergence study's pilot (docs/RESULTS.md, "The convergence study"): how much of a score's variance is
sampling and how much weights, and how many seeds the study needs.

    python experiments/compare.py --config study_photos_convergence.yaml --out runs/pilot --methods next-token \
        --seeds 100,101,102 --steps T --eval-steps 0.8T,0.9T,T --num 1000 --cfg 1.0 --compute-matched ''
    python experiments/pilot.py --out runs/pilot --steps T [--sample-seeds 5] [--nums 250,1000]

On the first seed's run: checkpoint T scored with each sampling seed at each sample count, with EMA and with
raw weights; checkpoints 0.8T and 0.9T with raw weights too (records in RUN/pilot/, apart from the study's).
Then, in log-FID: the sampling sd (over sampling seeds), the checkpoint-to-checkpoint sd of one run (over the
window 0.8T, 0.9T, T; raw against EMA), and the between-seed sd of the window mean (EMA, the study's
records of every seed). The primary statistic D is a difference of two such window means, so its sd is
taken as sqrt(2) x the between-seed sd (no credit for pairing); from it, the seeds that resolve a 15 %
FID gap at 80 % power, and the gap a given seed count resolves. Writes OUT/pilot.json and OUT/pilot.md.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

from mutor2d.cli import HelpFormatter          # the command line parses and checks before torch is imported
from mutor2d.engine.entry import run_entry
from mutor2d.evaluation.options import DEFAULT_CACHE
from mutor2d.evaluation.plan import StudyError
from mutor2d.evaluation.speedup import GAP, method_steps, resolvable_gap, seeds_needed, window_log_fid


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--out", required=True, help="the pilot's study folder (experiments/compare.py --out)")
    ap.add_argument("--steps", type=int, required=True, help="T: the checkpoint scored (its window 0.8T, 0.9T, T)")
    ap.add_argument("--sample-seeds", type=int, default=5, help="sampling seeds per (weights, sample count)")
    ap.add_argument("--nums", default="250,1000", help="sample counts")
    ap.add_argument("--cfg", type=float, default=1.0, help="CFG scale")
    ap.add_argument("--seeds-affordable", type=int, default=8, help="report the gap this many seeds resolve")
    ap.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="classifier / feature cache")
    return ap


def log_sd(values: list[float]) -> float:
    return statistics.stdev(math.log(v) for v in values) if len(values) > 1 else float("nan")


def score_first_run(out: Path, T: int, nums: list[int], sample_seeds: int, cfg: float, cache: Path) -> dict:
    """{(weights, num, sampling seed, step): FID} of the first seed's run (records in RUN/pilot/)."""
    from mutor2d.evaluation.study_runs import evaluate
    run = sorted((out / "next-token").glob("seed*"), key=lambda p: int(p.name[4:]))[0]
    fids = {}
    jobs = [(w, n, k, T) for w in ("ema", "raw") for n in nums for k in range(sample_seeds)]
    jobs += [("raw", max(nums), 0, s) for s in method_steps(T)[:-1]]
    for weights, num, k, step in jobs:
        [path] = evaluate(run, step, [cfg], num, "next-token", {"method": "pilot", "seed": k}, cache, seed=k,
                          tag=f"pilot_{weights}_n{num}_s{k}_", ema=weights == "ema", folder="pilot")
        fids[(weights, num, k, step)] = json.loads(path.read_text())["metrics"]["fid"]
    return {"run": str(run), "fids": fids}


def summary(out: Path, T: int, nums: list[int], cfg: float, scored: dict, affordable: int) -> dict:
    from mutor2d.evaluation.study_tables import collect, summarise
    fids = scored["fids"]
    sampling = {f"{w}, {n} samples": log_sd([v for (w2, n2, _, s), v in fids.items() if (w2, n2, s) == (w, n, T)])
                for w in ("ema", "raw") for n in nums}
    groups = summarise(collect(out), [cfg])
    ema_window = [groups[("next-token", s)]["by_seed"][cfg]["fid"] for s in method_steps(T)]
    first = int(Path(scored["run"]).name[4:])
    checkpoint = {"ema": log_sd([w[first] for w in ema_window]),
                  "raw": log_sd([fids[("raw", max(nums), 0, s)] for s in method_steps(T)])}
    per_seed = window_log_fid(groups, "next-token", method_steps(T), cfg)
    between = statistics.stdev(per_seed.values()) if len(per_seed) > 1 else float("nan")
    sd_d = math.sqrt(2) * between
    return {"T": T, "cfg": cfg, "run": scored["run"], "sampling_sd": sampling, "checkpoint_sd": checkpoint,
            "window_log_fid": per_seed, "between_seed_sd": between, "sd_D": sd_d,
            "seeds_needed": seeds_needed(sd_d), "gap": GAP, "seeds_affordable": affordable,
            "gap_resolved_by_affordable": resolvable_gap(sd_d, affordable),
            "fids": {"/".join(map(str, k)): v for k, v in fids.items()}}


def markdown(s: dict) -> str:
    lines = [f"Pilot at T = {s['T']} (cfg {s['cfg']:g}), sds in log-FID:", "",
             "| source | sd |", "|---|---|"]
    lines += [f"| sampling, {k} (checkpoint T, over sampling seeds) | {v:.3f} |" for k, v in s["sampling_sd"].items()]
    lines += [f"| checkpoints 0.8T, 0.9T, T of one run, {k} weights | {v:.3f} |" for k, v in s["checkpoint_sd"].items()]
    lines += [f"| training seeds, window mean (EMA; {len(s['window_log_fid'])} seeds) | {s['between_seed_sd']:.3f} |",
              f"| D (sqrt 2 x the above) | {s['sd_D']:.3f} |", "",
              f"Seeds for a {s['gap']:.3f} log-FID gap at 80 % power: {s['seeds_needed']}; {s['seeds_affordable']} "
              f"seeds resolve {s['gap_resolved_by_affordable']:.3f}."]
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    nums = [int(x) for x in args.nums.split(",") if x.strip()]
    if args.steps < 10 or args.sample_seeds < 2 or not nums or min(nums) < 10 or args.seeds_affordable < 2:
        raise StudyError(f"--steps {args.steps} / --sample-seeds {args.sample_seeds} / --nums {args.nums} / "
                         f"--seeds-affordable {args.seeds_affordable}: expected >= 10, >= 2, counts >= 10, >= 2")
    out = Path(args.out)
    import torch
    torch.set_num_threads(1)
    scored = score_first_run(out, args.steps, nums, args.sample_seeds, args.cfg, Path(args.cache_dir).expanduser())
    s = summary(out, args.steps, nums, args.cfg, scored, args.seeds_affordable)
    (out / "pilot.json").write_text(json.dumps(s, indent=1) + "\n")
    (out / "pilot.md").write_text(markdown(s) + "\n")
    print(markdown(s))
    return s


if __name__ == "__main__":
    run_entry(main)
