"""The digits study: next-token vs MuToR (1D, 2D dense/sparse) vs the multi-head baseline, trained,
sampled and scored through the library (mutor2d.engine, generation, evaluation). eval/compare.py is
its command line; its docstring describes the study.

For each method and seed: train ``configs/study_digits.yaml`` with the method's objective
(RUN = OUT/METHOD/seedS); at each eval step, class-balanced samples at each CFG scale
(RUN/samples/eval_stepXXXXXXXX_cfgS.npz), the embedded FID/IS/precision/recall and class accuracy
against digits:train, and the teacher-forced next-token NLL of the digits test split; one record per
(step, cfg) in RUN/eval/. Reruns resume: finished trainings, sample files and records are kept.
"""
from __future__ import annotations

import json
import math
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .. import checkpoint as ckpt_lib
from .. import config as config_lib
from .. import generation
from . import records
from .digits import DigitsClassifierSettings, digits_classifier_path
from .metrics import compute_metrics
from .sources import DIGITS_DATA_SEED, ArrayImages, ImageSource, open_images

BASE = "study_digits.yaml"
# method -> objective overrides on the base config
METHODS = {
    "next-token": ["objective.name=ntp"],
    "mutor-1d": ["objective.name=mutor-1d", "objective.d_min=2", "objective.d_max=4"],
    "mutor-2d-D3": ["objective.name=mutor-2d", "objective.d_max=3"],
    "mutor-2d-D4": ["objective.name=mutor-2d", "objective.d_max=4"],
    "mutor-2d-sparse": ["objective.name=mutor-2d", "objective.d_max=4", "objective.placement=sparse",
                        "objective.num_registers=19"],  # 19 of 64 anchors ~ 30% (paper: 80 of 256)
    "multihead": ["objective.name=multihead", "objective.layout=2d", "objective.d_max=4"],
}
CM = "next-token-cm"   # the compute-matched next-token runs
METRICS = ("fid", "is", "prc")


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
    from ..engine import read_log
    secs, prev = 0.0, 0
    B = config_lib.load(run_dir / "config.yaml").train.batch_size
    for rec in read_log(run_dir):
        if "images_per_s" in rec:
            secs += (rec["step"] - prev) * B / rec["images_per_s"]
            prev = rec["step"]
    return secs, prev


@torch.no_grad()
def test_nll(model, data_cfg) -> float:
    """Teacher-forced next-token cross-entropy (nats per token) of the test split: the model's NTP
    head on the regular sequence, registers absent."""
    from ..data import build_dataset, collate
    from ..registers import regular_position_ids
    ds = build_dataset(data_cfg, "test")
    total, count = 0.0, 0
    for i in range(0, len(ds), 256):
        b = collate([ds[j] for j in range(i, min(i + 256, len(ds)))])
        pos = regular_position_ids(tuple(ds.grid), 1).expand(len(b["body"]), -1, -1)
        logits = model(b["body"][:, :-1], pos, b["prefix"])          # (B, 1 + N - 1, V)
        total += F.cross_entropy(logits.flatten(0, 1).float(), b["body"].flatten(), reduction="sum").item()
        count += b["body"].numel()
    return total / count


def digits_reference(data_seed: int, cache: Path):
    """(digits:train source, the digits classifier file for that split)."""
    weights = digits_classifier_path(DigitsClassifierSettings(data_seed=data_seed), cache)
    return open_images("digits:train", data_seed), weights


def score(samples, ref, weights, cache: Path):
    return compute_metrics(samples, ref, features="digits", weights_path=weights, metrics=METRICS,
                           cache_root=cache / "fidelity_cache")


def evaluate(run_dir: Path, step: int, cfg_scales: list[float], num: int, label: str, study: dict,
             cache: Path, batch_size: int = 250, seed: int = 0, tag: str = "") -> list[Path]:
    """Sample, score and record checkpoint ``step`` of ``run_dir`` at each CFG scale. ``tag`` goes into
    the sample file name (and so the record's), keeping records of another label apart."""
    names = [f"eval_{tag}step{step:08d}_cfg{s:g}" for s in cfg_scales]
    found = [sorted((run_dir / "eval").glob(f"{n}__*.json")) for n in names]
    if all(found):                                       # scored before: keep those records
        return [f[0] for f in found]
    path = ckpt_lib.checkpoint_path(run_dir, step)
    src = generation.open_checkpoint(path)
    nll = test_nll(src.model, src.cfg.data)
    classes = list(range(src.cfg.model.num_classes))
    labels = generation.balanced_labels(num, classes)
    ref, weights = digits_reference(src.cfg.data.data_seed, cache)
    out = []
    for s, name in zip(cfg_scales, names):
        npz = run_dir / "samples" / f"{name}.npz"
        settings = dict(cfg_scale=s, temperature=1.0, top_k=0, top_p=1.0)
        meta = generation.sample_meta(checkpoint=str(path), step=src.step, config=src.cfg.to_dict(),
                                      settings=settings, seed=seed, classes=classes, num=num,
                                      batch_size=batch_size, ema=src.ema, grid=src.grid)
        generation.NpzJob(npz, labels, batch_size, seed, meta).complete(
            generation.make_sampler(src.model, src.tokenizer, src.grid, **settings))
        samples = open_images(npz)
        res = score(samples, ref, weights, cache)
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
        from ..engine import train
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

def floor_records(out: Path, num: int, draws: int, cache: Path, data_seed: int = DIGITS_DATA_SEED) -> list[dict]:
    """Real held-out images (digits:test) against digits:train: as is, and ``draws`` resamples (with
    replacement) of ``num`` images."""
    old = sorted((out / "floor" / "eval").glob("*.json"))
    if len(old) == draws + 1:                            # made before with these settings
        recs = [json.loads(p.read_text()) for p in old]
        if all(r["n"] == num for r in recs if r["study"]["seed"] is not None):
            return sorted(recs, key=lambda r: r["study"]["seed"] is not None)
    test = open_images("digits:test", data_seed)
    ref, weights = digits_reference(data_seed, cache)
    sources = [("real held-out", test, None)]
    for d in range(draws):
        idx = np.random.default_rng(d).integers(0, test.n, num)
        src = ImageSource(f"digits:test resampled {num} #{d}", ArrayImages(test.dataset.images[idx]),
                          test.labels[idx])
        sources.append((f"real held-out x{num} (resampled)", src, d))
    recs = []
    for label, src, d in sources:
        res = score(src, ref, weights, cache)
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

@dataclass
class Study:
    """The settings of a study (eval/compare.py's flags; see its --help)."""
    out: Path
    methods: list[str]
    seeds: list[int]
    steps: int
    eval_steps: list[int]
    num: int
    cfg_scales: list[float]
    jobs: int = 1
    compute_matched: str = ""
    cm_max: float = 2.0
    cm_ratio: float | None = None
    floor_draws: int = 5
    overrides: list[str] = field(default_factory=list)
    plot: Path | None = None
    cache: Path = Path("~/.cache/mutor2d")
    report_only: bool = False

    def check(self) -> None:
        """One-line errors for bad settings, before any training."""
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise StudyError(f"--methods: {bad[0]!r} is not a method (expected some of {', '.join(METHODS)})")
        if not self.eval_steps or any(s < 1 or self.steps % s for s in self.eval_steps):
            raise StudyError(f"--eval-steps {','.join(map(str, self.eval_steps))}: each must divide --steps {self.steps}")
        from ..data import build_dataset
        classes = build_dataset(config_lib.load(BASE, self.overrides).data, "train").num_classes
        if self.num < classes or self.num % classes:
            raise StudyError(f"--num {self.num}: expected a positive multiple of the {classes} classes")
        if self.jobs < 1:
            raise StudyError(f"--jobs {self.jobs}: expected >= 1")
        cm = self.compute_matched
        if cm and cm not in self.methods:
            raise StudyError(f"--compute-matched {cm!r}: not among --methods")
        for m in self.methods:
            sched = run_config(m, 0, self.steps, self.every, self.overrides).optim.schedule
            if cm and sched != "constant":
                raise StudyError(f"--compute-matched needs optim.schedule=constant (got {sched!r}): the next-token "
                                 "runs' early checkpoints stand for the equal-step points")
        if cm and "next-token" not in self.methods:
            raise StudyError("--compute-matched needs next-token among --methods (its speed is the unit)")
        if self.cm_max < 1:
            raise StudyError(f"--cm-max {self.cm_max}: expected >= 1")
        if self.cm_ratio is not None and not self.cm_ratio >= 1:
            raise StudyError(f"--cm-ratio {self.cm_ratio}: expected >= 1 (a method step costs at least a "
                             "next-token step)")

    @property
    def every(self) -> int:
        """Checkpoint spacing of the method runs."""
        return math.gcd(*self.eval_steps)

    @property
    def grain(self) -> int:
        """Checkpoint spacing of the next-token runs (the compute-matched step is picked among them)."""
        return math.gcd(self.every, max(1, self.steps // 10))

    @property
    def ntp_steps(self) -> int:
        """Next-token runs go on to cm_max x steps (constant lr: their early checkpoints are the
        equal-step points)."""
        return round(self.steps * self.cm_max / self.grain) * self.grain if self.compute_matched else self.steps

    def unit(self, method: str, seed: int, steps: int, eval_steps: list[int], ckpt_every: int) -> dict:
        return dict(method=method, label=method, seed=seed, steps=steps, ckpt_every=ckpt_every,
                    eval_steps=eval_steps, run_dir=str(self.out / method / f"seed{seed}"), cfg=self.cfg_scales,
                    num=self.num, overrides=self.overrides, cache=str(self.cache))


def compute_matched(study: Study, done: list[dict]) -> tuple[dict, list[dict]]:
    """(summary of the compute-matched point, the next-token runs evaluated at it)."""
    cm, grain = study.compute_matched, study.grain
    per_step = {m: statistics.median(d["train_seconds"] / d["train_steps"] for d in done if d["method"] == m)
                for m in ("next-token", cm)}
    measured = per_step[cm] / per_step["next-token"]
    ratio = measured if study.cm_ratio is None else study.cm_ratio
    cm_step = min(study.ntp_steps, max(study.steps, round(study.steps * ratio / grain) * grain))
    note = " (capped by --cm-max)" if cm_step < study.steps * ratio - grain else ""
    given = "" if study.cm_ratio is None else f" (--cm-ratio; measured here {measured:.2f}x)"
    print(f"compute-matched: {cm} costs {ratio:.2f}x a next-token step{given} -> next-token at step "
          f"{cm_step}{note}", flush=True)
    units = [{**study.unit("next-token", s, study.ntp_steps, [cm_step], grain), "label": CM} for s in study.seeds]
    return ({"method": cm, "ratio": ratio, "measured_ratio": measured, "step": cm_step, "s_per_step": per_step,
             "capped": bool(note)}, run_all(units, study.jobs))


def run_study(study: Study) -> dict:
    """Train, sample, score (unless report_only), then write OUT/table.md, OUT/summary.json, the plot."""
    study.check()
    t0 = time.time()
    summary: dict = {"runs": []}
    if not study.report_only:
        digits_classifier_path(DigitsClassifierSettings(), study.cache)   # train it once, up front
        floor = floor_records(study.out, study.num, study.floor_draws, study.cache)
        print(f"floor: held-out FID {floor[0]['metrics']['fid']:.2f}", flush=True)
        units = [study.unit(m, s, study.ntp_steps if m == "next-token" else study.steps, study.eval_steps,
                            study.grain if m == "next-token" else study.every)
                 for m in study.methods for s in study.seeds]
        summary["runs"] = run_all(units, study.jobs)
        if study.compute_matched:
            summary["compute_matched"], more = compute_matched(study, summary["runs"])
            summary["runs"] += more
    groups = summarise(collect(study.out), study.cfg_scales)
    md = table(groups, study.cfg_scales)
    (study.out / "table.md").write_text(md + "\n")
    png = plot(groups, study.cfg_scales, study.plot or study.out / "fid_vs_step.png")
    summary.update(wall_seconds=time.time() - t0, table=md, plot=str(png))
    return summary
