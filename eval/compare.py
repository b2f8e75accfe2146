"""Digits study: next-token vs MuToR (1D, 2D dense/sparse) vs the multi-head baseline, trained,
sampled and scored through the library (mutor2d.training, sample_files, metrics, records).

    python eval/compare.py --out runs/study_digits [--methods next-token,mutor-2d-D4,...]
        [--seeds 0,1,2] [--steps 600] [--eval-steps 300,600] [--num 1000] [--cfg 1.0,2.0]
        [--jobs 2] [--compute-matched mutor-2d-D4] [--plot docs/digits_fid_vs_step.png]
    python eval/compare.py --quick --out /tmp/q      # CI: the whole pipeline, tiny sizes

For each method and seed: train ``configs/study_digits.yaml`` with the method's objective
(RUN = OUT/METHOD/seedS), then at each eval step: class-balanced samples at each CFG scale
(RUN/samples/eval_stepXXXXXXXX_cfgS.npz), the embedded FID/IS/precision/recall and class accuracy
against digits:train, and the teacher-forced next-token NLL of the digits test split (NTP head, nats
per token); one record per (step, cfg) in RUN/eval/ (eval/leaderboard.py reads them).
Compute-matched point: next-token trained for ``steps x t(method)/t(next-token)`` steps, t = median
measured training seconds per step (from RUN/log.jsonl) of the runs above, or ``--cm-ratio`` (to add
seeds later at the step an earlier invocation measured: the measured ratio depends on machine load).
Floor: real held-out images (digits:test) against the same reference, as is and resampled to ``--num``.
Outputs: OUT/table.md (mean ± sd over seeds), OUT/summary.json, the plot. Rerunning resumes:
finished trainings, sample files and records are kept.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

from mutor2d import checkpoint as ckpt_lib
from mutor2d import config as config_lib
from mutor2d import metrics, records
from mutor2d.config import ConfigError
from mutor2d.data import build_dataset, build_tokenizer, collate
from mutor2d.objectives import Batch, build_objective
from mutor2d.sample_files import NpzJob, balanced_labels, make_sampler
from mutor2d.training import read_log, train

BASE = "study_digits.yaml"
# method -> objective overrides on the base config (DESIGN.md 1.2-1.6)
METHODS = {
    "next-token": ["objective.name=ntp"],
    "mutor-1d": ["objective.name=mutor-1d", "objective.d_min=2", "objective.d_max=4"],
    "mutor-2d-D3": ["objective.name=mutor-2d", "objective.d_max_2d=3"],
    "mutor-2d-D4": ["objective.name=mutor-2d", "objective.d_max_2d=4"],
    "mutor-2d-sparse": ["objective.name=mutor-2d", "objective.d_max_2d=4", "objective.placement=sparse",
                        "objective.num_registers=19"],  # 19 of 64 anchors ~ 30% (paper: 80 of 256)
    "multihead": ["objective.name=multihead", "objective.multihead_layout=2d", "objective.d_max_2d=4"],
}
CM = "next-token-cm"   # the compute-matched next-token runs
QUICK = dict(methods="next-token,mutor-2d-sparse", seeds="0", steps=4, eval_steps="2,4", num=20, cfg="1.0,2.0",
             jobs=1, floor_draws=1, compute_matched="mutor-2d-sparse",
             overrides=["model.dim=32", "train.batch_size=8", "optim.warmup_steps=1", "train.log_every=1"])


class StudyError(ValueError):
    """Bad study settings; one-line message."""


# ----------------------------------------------------------------------------- one run

def run_config(method: str, seed: int, steps: int, ckpt_every: int, overrides: list[str]):
    if method not in METHODS and method != CM:
        raise StudyError(f"method {method!r}: expected one of {sorted(METHODS)}")
    obj = METHODS["next-token" if method == CM else method]
    return config_lib.load(BASE, obj + list(overrides) + [
        f"train.seed={seed}", f"train.max_steps={steps}", f"train.ckpt_every={ckpt_every}", "train.keep_ckpts=0"])


def train_seconds(run_dir: Path) -> tuple[float, int]:
    """(seconds, steps) of pure training from RUN/log.jsonl (each record covers the steps since the
    previous one at its images_per_s; checkpoint and sampling time are left out)."""
    secs, prev, B = 0.0, 0, None
    cfg = config_lib.load(run_dir / "config.yaml")
    B = cfg.train.batch_size
    for rec in read_log(run_dir):
        if "images_per_s" in rec:
            secs += (rec["step"] - prev) * B / rec["images_per_s"]
            prev = rec["step"]
    return secs, prev


@torch.no_grad()
def test_nll(model, data_cfg) -> float:
    """Teacher-forced next-token cross-entropy (nats per token) of the test split, NTP head only."""
    ds = build_dataset(data_cfg, "test")
    obj = build_objective(config_lib.ObjectiveConfig(name="ntp"), model)
    total, count = 0.0, 0
    for i in range(0, len(ds), 256):
        b = collate([ds[j] for j in range(i, min(i + 256, len(ds)))])
        out = obj(model, Batch(b["body"], b["prefix"], tuple(ds.grid)))
        total += float(out["loss_ntp"]) * int(out["n_ntp"])
        count += int(out["n_ntp"])
    return total / count


def evaluate(run_dir: Path, step: int, cfg_scales: list[float], num: int, label: str, study: dict,
             cache: Path, batch_size: int = 250, seed: int = 0, tag: str = "") -> list[Path]:
    """Sample, score and record checkpoint ``step`` of ``run_dir`` at each CFG scale. ``tag`` goes into
    the sample file name (and so the record's), keeping records of another label apart."""
    names = [f"eval_{tag}step{step:08d}_cfg{s:g}" for s in cfg_scales]
    found = [sorted((run_dir / "eval").glob(f"{n}__*.json")) for n in names]
    if all(found):                                       # scored before: keep those records
        return [f[0] for f in found]
    path = ckpt_lib.checkpoint_path(run_dir, step)
    model, cfg, got = ckpt_lib.load_model(path)
    tokenizer = build_tokenizer(cfg.data)
    grid = tuple(int(v) for v in build_dataset(cfg.data, "train").grid)
    nll = test_nll(model, cfg.data)
    classes = list(range(cfg.model.num_classes))
    labels = balanced_labels(num, classes)
    ref = metrics.open_images("digits:train", cfg.data.data_seed)
    weights = metrics.digits_classifier_path(metrics.DigitsClassifierSettings(data_seed=cfg.data.data_seed), cache)
    out = []
    for s in cfg_scales:
        npz = run_dir / "samples" / f"eval_{tag}step{step:08d}_cfg{s:g}.npz"
        meta = dict(checkpoint=str(path), step=got, config=cfg.to_dict(), cfg_scale=s, temperature=1.0, top_k=0,
                    top_p=1.0, seed=seed, per_class=num // len(classes), num=num, classes=classes,
                    batch_size=batch_size, ema=False, grid=list(grid))
        job = NpzJob(npz, labels, batch_size, seed, meta)
        if not job.is_complete():
            job.run(make_sampler(model, tokenizer, grid, cfg_scale=s), job.missing())
            job.assemble()
        samples = metrics.open_images(npz)
        res = metrics.compute_metrics(samples, ref, features="digits", weights_path=weights,
                                      metrics=("fid", "is", "prc"), cache_root=cache / "fidelity_cache")
        res.metrics["nll_test"] = nll
        rec = records.make_record(res, samples=samples, reference=ref, method=label, samples_path=str(npz))
        rec["study"] = {**study, "cfg_scale": s}
        out.append(records.write_record(rec, run_dir / "eval"))
    return out


def run_unit(unit: dict) -> dict:
    """Train one (method, seed) run (resuming if needed) and evaluate its eval steps."""
    torch.set_num_threads(1)
    run_dir = Path(unit["run_dir"])
    cfg = run_config(unit["method"], unit["seed"], unit["steps"], unit["ckpt_every"], unit["overrides"])
    if not ckpt_lib.checkpoint_path(run_dir, unit["steps"]).is_file():   # else finished earlier
        train(cfg, run_dir, resume="auto")
    secs, steps = train_seconds(run_dir)
    study = {"method": unit["label"], "seed": unit["seed"], "train_seconds": secs, "train_steps": steps,
             "max_steps": unit["steps"]}
    for step in unit["eval_steps"]:
        evaluate(run_dir, step, unit["cfg"], unit["num"], unit["label"], study, Path(unit["cache"]),
                 tag="" if unit["label"] == unit["method"] else "cm_")
    return {**study, "run_dir": str(run_dir)}


def run_all(units: list[dict], jobs: int) -> list[dict]:
    """Units in order, ``jobs`` processes at a time (in this process when jobs == 1)."""
    if jobs == 1:
        return [run_unit(u) for u in units]
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        return list(pool.map(run_unit, units))


# ----------------------------------------------------------------------------- floor

def floor_records(out: Path, num: int, draws: int, cache: Path, data_seed: int = metrics.DIGITS_DATA_SEED) -> list[dict]:
    """Real held-out images (digits:test) against digits:train: as is, and ``draws`` resamples (with
    replacement) of ``num`` images."""
    old = sorted((out / "floor" / "eval").glob("*.json"))
    if len(old) == draws + 1:                            # made before with these settings
        recs = [json.loads(p.read_text()) for p in old]
        if all(r["n"] == num for r in recs if r["study"]["seed"] is not None):
            return sorted(recs, key=lambda r: r["study"]["seed"] is not None)
    test = metrics.open_images("digits:test", data_seed)
    ref = metrics.open_images("digits:train", data_seed)
    weights = metrics.digits_classifier_path(metrics.DigitsClassifierSettings(data_seed=data_seed), cache)
    sources = [("real held-out", test, None)]
    for d in range(draws):
        idx = np.random.default_rng(d).integers(0, test.n, num)
        src = metrics.ImageSource(f"digits:test resampled {num} #{d}",
                                  metrics.ArrayImages(test.dataset.images[idx]), test.labels[idx])
        sources.append((f"real held-out x{num} (resampled)", src, d))
    recs = []
    for label, src, d in sources:
        res = metrics.compute_metrics(src, ref, features="digits", weights_path=weights, metrics=("fid", "is", "prc"),
                                      cache_root=cache / "fidelity_cache")
        rec = records.make_record(res, samples=src, reference=ref, method=label,
                                  samples_path=f"digits-test{'' if d is None else f'-resampled{num}-{d}'}")
        rec["study"] = {"method": label, "seed": d, "cfg_scale": None}
        records.write_record(rec, out / "floor" / "eval")
        recs.append(rec)
    return recs


# ----------------------------------------------------------------------------- summary

def collect(out: Path) -> list[dict]:
    recs, _ = records.read_records(sorted(p for p in out.glob("*/*") if (p / "eval").is_dir())
                                   + ([out / "floor"] if (out / "floor" / "eval").is_dir() else []))
    return [r for r in recs if "study" in r]


def mean_sd(values: list[float]) -> tuple[float, float | None, int]:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return float("nan"), None, 0
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None), len(vals)


def fmt(values: list[float], digits: int = 2) -> str:
    m, sd, n = mean_sd(values)
    if n == 0:
        return "–"
    return f"{m:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None else "")


def summarise(recs: list[dict], cfg_scales: list[float]) -> dict:
    """{(method, step): {"seeds": [...], "cfgS": {metric: [values over seeds]}, "nll": [...], "s_per_step": [...]}}"""
    groups: dict = {}
    for r in recs:
        st = r["study"]
        if r.get("step") is None:
            key = (st["method"], None)
        else:
            key = (st["method"], int(r["step"]))
        g = groups.setdefault(key, {"seeds": set(), "nll": {}, "s_per_step": {}, "cfg": {}})
        g["seeds"].add(st.get("seed"))
        if st.get("train_steps"):
            g["s_per_step"][st["seed"]] = st["train_seconds"] / st["train_steps"]
        if "nll_test" in r["metrics"]:
            g["nll"][st["seed"]] = r["metrics"]["nll_test"]
        c = g["cfg"].setdefault(st.get("cfg_scale"), {})
        for k, v in r["metrics"].items():
            c.setdefault(k, []).append(v)
    return groups


def method_order(name: str) -> int:
    names = list(METHODS) + [CM]
    return names.index(name) if name in names else len(names)


def table(groups: dict, cfg_scales: list[float]) -> str:
    g_hi = [s for s in cfg_scales if s != 1.0]
    head = ["method", "step", "seeds"] + [f"FID cfg {s:g}" for s in cfg_scales] + \
        [f"accuracy cfg {s:g}" for s in cfg_scales] + ["IS cfg 1", "test NLL (nats/token)", "train s/step"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    model_keys = sorted((k for k in groups if k[1] is not None), key=lambda k: (method_order(k[0]), k[1]))
    for key in model_keys:
        g = groups[key]
        row = [key[0], str(key[1]), str(len(g["seeds"]))]
        row += [fmt(g["cfg"].get(s, {}).get("fid", [])) for s in cfg_scales]
        row += [fmt(g["cfg"].get(s, {}).get("accuracy", []), 3) for s in cfg_scales]
        row += [fmt(g["cfg"].get(1.0, {}).get("is", []))]
        row += [fmt(list(g["nll"].values()), 4), fmt(list(g["s_per_step"].values()), 3)]
        lines.append("| " + " | ".join(row) + " |")
    for key in sorted(k for k in groups if k[1] is None):
        g = groups[key]
        c = g["cfg"].get(None, {})
        row = [key[0], "–", str(len(g["seeds"]))] + [fmt(c.get("fid", []))] + ["″"] * len(g_hi) + \
            [fmt(c.get("accuracy", []), 3)] + ["″"] * len(g_hi) + [fmt(c.get("is", [])), "–", "–"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(groups: dict, cfg_scales: list[float], out: Path) -> Path:
    """FID (mean ± sd over seeds) against step, one panel per CFG scale; floor as a dashed line."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(5 * len(cfg_scales), 4))
    axes = fig.subplots(1, len(cfg_scales), squeeze=False)[0]
    floor = groups.get(("real held-out", None), {}).get("cfg", {}).get(None, {}).get("fid")
    for ax, s in zip(axes, cfg_scales):
        for method in sorted({k[0] for k in groups if k[1] is not None}, key=method_order):
            pts = sorted((k[1], groups[k]["cfg"].get(s, {}).get("fid", [])) for k in groups
                         if k[0] == method and k[1] is not None)
            pts = [(st, *mean_sd(v)[:2]) for st, v in pts if v]
            if not pts:
                continue
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] or 0 for p in pts], marker="o",
                        capsize=3, label=method, linestyle="none" if method == CM else "-")
        if floor:
            ax.axhline(statistics.fmean(floor), color="grey", linestyle="--", label="real held-out (floor)")
        ax.set_title(f"cfg {s:g}")
        ax.set_xlabel("training step")
        ax.set_ylabel("embedded FID (digits classifier)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


# ----------------------------------------------------------------------------- driver

def parse_list(text: str, kind, name: str) -> list:
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise StudyError(f"--{name} {text!r}: expected comma-separated {kind.__name__} values") from None


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="study folder (runs go to OUT/METHOD/seedS)")
    ap.add_argument("--methods", default="next-token,mutor-2d-D4,mutor-2d-sparse",
                    help=f"comma-separated, of {','.join(METHODS)}")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=500, help="training steps of every run")
    ap.add_argument("--eval-steps", default="250,500", help="checkpoints to evaluate (each divides --steps)")
    ap.add_argument("--num", type=int, default=1000, help="class-balanced samples per evaluation")
    ap.add_argument("--cfg", default="1.0,2.0", help="CFG scales to sample at")
    ap.add_argument("--jobs", type=int, default=2, help="processes at a time (one CPU thread each)")
    ap.add_argument("--compute-matched", default="mutor-2d-D4",
                    help="train next-token for this method's measured wall time ('' = skip)")
    ap.add_argument("--cm-max", type=float, default=2.0,
                    help="next-token runs train to this multiple of --steps (the compute-matched point's limit)")
    ap.add_argument("--cm-ratio", type=float, default=None,
                    help="use this cost ratio (method step / next-token step) instead of the one measured in "
                         "this invocation: to add seeds to an earlier study at its compute-matched step")
    ap.add_argument("--floor-draws", type=int, default=5, help="resamples of the held-out floor")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override the base config for every run (e.g. model.dim=32)")
    ap.add_argument("--plot", default=None, help="PNG path (default OUT/fid_vs_step.png)")
    ap.add_argument("--cache-dir", default=str(metrics.DEFAULT_CACHE), help="digits classifier / feature cache")
    ap.add_argument("--report-only", action="store_true",
                    help="only rebuild the table and plot from the records already in OUT")
    ap.add_argument("--quick", action="store_true", help="CI: 2 methods, 1 seed, 4 steps, 20 samples")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v if k != "overrides" else v + args.overrides)
    methods = parse_list(args.methods, str, "methods")
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise StudyError(f"--methods: {bad[0]!r} is not a method (expected some of {', '.join(METHODS)})")
    seeds = parse_list(args.seeds, int, "seeds")
    eval_steps = parse_list(args.eval_steps, int, "eval-steps")
    cfg_scales = parse_list(args.cfg, float, "cfg")
    if not eval_steps or any(s < 1 or args.steps % s for s in eval_steps):
        raise StudyError(f"--eval-steps {args.eval_steps}: each must divide --steps {args.steps}")
    if args.num < 10 or args.num % 10:
        raise StudyError(f"--num {args.num}: expected a positive multiple of the 10 classes")
    if args.jobs < 1:
        raise StudyError(f"--jobs {args.jobs}: expected >= 1")
    cm = args.compute_matched
    if cm and cm not in methods:
        raise StudyError(f"--compute-matched {cm!r}: not among --methods")
    every = math.gcd(*eval_steps)
    out, cache = Path(args.out), Path(args.cache_dir).expanduser()
    for m in methods:                                   # fail on bad settings before any training
        sched = run_config(m, 0, args.steps, every, args.overrides).optim.schedule
        if cm and sched != "constant":
            raise StudyError(f"--compute-matched needs optim.schedule=constant (got {sched!r}): the next-token "
                             "runs' early checkpoints stand for the equal-step points")
    metrics.digits_classifier_path(metrics.DigitsClassifierSettings(), cache)   # train it once, up front

    if cm and "next-token" not in methods:
        raise StudyError("--compute-matched needs next-token among --methods (its speed is the unit)")
    if args.cm_max < 1:
        raise StudyError(f"--cm-max {args.cm_max}: expected >= 1")
    if args.cm_ratio is not None and not args.cm_ratio >= 1:
        raise StudyError(f"--cm-ratio {args.cm_ratio}: expected >= 1 (a method step costs at least a next-token step)")

    def unit(method, seed, steps, ev, ckpt_every):
        return dict(method=method, label=method, seed=seed, steps=steps, ckpt_every=ckpt_every, eval_steps=ev,
                    run_dir=str(out / method / f"seed{seed}"), cfg=cfg_scales, num=args.num,
                    overrides=args.overrides, cache=str(cache))

    t0 = time.time()
    if not args.report_only:
        floor = floor_records(out, args.num, args.floor_draws, cache)
        print(f"floor: held-out FID {floor[0]['metrics']['fid']:.2f}", flush=True)
    # next-token runs go on to cm_max x steps (constant lr: their early checkpoints are the equal-step
    # points), with checkpoints every `grain` steps to pick the compute-matched one from
    grain = math.gcd(every, max(1, args.steps // 10))
    ntp_steps = round(args.steps * args.cm_max / grain) * grain if cm else args.steps
    units = [unit(m, s, ntp_steps if m == "next-token" else args.steps, eval_steps,
                  grain if m == "next-token" else every) for m in methods for s in seeds]
    done = [] if args.report_only else run_all(units, args.jobs)
    summary = {"runs": done}
    if cm and not args.report_only:
        per_step = {m: statistics.median(d["train_seconds"] / d["train_steps"] for d in done if d["method"] == m)
                    for m in ("next-token", cm)}
        measured = per_step[cm] / per_step["next-token"]
        ratio = measured if args.cm_ratio is None else args.cm_ratio
        cm_step = min(ntp_steps, max(args.steps, round(args.steps * ratio / grain) * grain))
        note = " (capped by --cm-max)" if cm_step < args.steps * ratio - grain else ""
        given = "" if args.cm_ratio is None else f" (--cm-ratio; measured here {measured:.2f}x)"
        print(f"compute-matched: {cm} costs {ratio:.2f}x a next-token step{given} -> next-token at step "
              f"{cm_step}{note}", flush=True)
        summary["compute_matched"] = {"method": cm, "ratio": ratio, "measured_ratio": measured, "step": cm_step,
                                      "s_per_step": per_step, "capped": bool(note)}
        cm_units = [{**unit("next-token", s, ntp_steps, [cm_step], grain), "label": CM} for s in seeds]
        summary["runs"] += run_all(cm_units, args.jobs)
    groups = summarise(collect(out), cfg_scales)
    md = table(groups, cfg_scales)
    (out / "table.md").write_text(md + "\n")
    png = plot(groups, cfg_scales, Path(args.plot) if args.plot else out / "fid_vs_step.png")
    summary.update(wall_seconds=time.time() - t0, table=md, plot=str(png),
                   settings={k: v for k, v in vars(args).items()})
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(md)
    print(f"table: {out / 'table.md'}\nplot: {png}", flush=True)
    return summary


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError) as e:   # StudyError, ConfigError, MetricsError, RecordError, ...
        raise SystemExit(f"error: {e}")
