"""The image study (digits, or the photo crops): next-token vs MuToR (1D, 2D dense/sparse) vs the multi-head baseline, trained,
sampled and scored through the library (mutor2d.engine, generation, evaluation). eval/compare.py is
its command line; its docstring describes the study.

For each method and seed: train the base config (``configs/study_digits.yaml`` unless the study
names another) with the method's objective (RUN = OUT/LABEL/seedS); at each eval step, class-balanced
samples at each CFG scale (RUN/samples/eval_stepXXXXXXXX_cfgS.npz), the embedded FID/IS/precision/
recall and class accuracy against the data's train split (digits:train with the digits classifier,
photos:train with the photos classifier: :func:`data_reference`), and the teacher-forced next-token
NLL of its test split (and of the validation split when the data config holds one out); one record per (step,
cfg) in RUN/eval/. With ``val_every``, the validation NLL of every ``val_every``-th checkpoint goes to
RUN/val_nll.json and the step with the lowest one ("val-best") is sampled and scored too: steps are
selected on validation, never on test. Data-fraction runs (LABEL = METHOD@F) train on a nested share
F of the training images. Reruns resume: finished trainings, curves, sample files and records are kept.
"""
from __future__ import annotations

import json
import math
import os
import signal
import statistics
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

from .. import checkpoint as ckpt_lib
from ..checkpoint import inference
from .. import config as config_lib
from .. import provenance
from ..io import warn
from ..sampling import images as generation
from ..preempt import PREEMPTED_EXIT, Preempted
from ..plugins import load_plugins
from . import records
from .extrapolation import grid_token_nll
from .metrics import compute_metrics, embedded_weights
from .options import EMBEDDED
from .plan import (BASE_CONFIG, COMPUTE_MATCHED, METHODS, Study, StudyError,  # noqa: F401 (BASE_CONFIG: re-exported)
                   fraction_label, label_parts, run_config)
from .sources import DIGITS_DATA_SEED, ArrayImages, ImageSource, open_images

VAL_BEST = "val-best"       # the step of a run picked by validation NLL (a table row, not a number)
VAL_CURVE_FILE = "val_nll.json"
SAMPLE_METRICS = ("fid", "is", "prc")


# ----------------------------------------------------------------------------- one run

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


def heldout_nll(model, data_cfg, split: str = "test") -> float:
    """Teacher-forced next-token cross-entropy (nats per token) of a held-out split ("test", or "val"
    when data.val_fraction > 0): the model's NTP head on the regular sequence, registers absent
    (extrapolation.grid_token_nll, averaged over every body token), in batches of 256 images."""
    from ..data.tokens import build_dataset, collate
    ds = build_dataset(data_cfg, split)
    total = 0.0
    for start in range(0, len(ds), 256):
        b = collate([ds[j] for j in range(start, min(start + 256, len(ds)))])
        codes = b["body"].view(len(b["body"]), *ds.grid)
        total += grid_token_nll(model, codes, b["prefix"]).double().mean().item() * len(codes)
    return total / len(ds)


def data_reference(data_name: str, data_seed: int, cache: Path, split: str = "train"):
    """(the data's ``split`` as a source, its features name, the classifier file for that data seed)."""
    if data_name not in EMBEDDED:
        raise StudyError(f"data.name={data_name!r}: the study scores {list(EMBEDDED)} (a classifier trained here)")
    return open_images(f"{data_name}:{split}", data_seed), data_name, embedded_weights(data_name, data_seed, cache)


def score(samples, ref, features: str, weights, cache: Path):
    return compute_metrics(samples, ref, features=features, weights_path=weights, metrics=SAMPLE_METRICS,
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
    src = generation.open_checkpoint(path)               # EMA weights when the run kept them
    nll = {"nll_test": heldout_nll(src.model, src.cfg.data, "test")}
    if getattr(src.cfg.data, "val_fraction", 0) > 0:
        nll["nll_val"] = heldout_nll(src.model, src.cfg.data, "val")
    classes = list(range(src.cfg.model.num_classes))
    labels = generation.balanced_labels(num, classes)
    ref, features, weights = data_reference(src.cfg.data.name, src.cfg.data.data_seed, cache)
    out = []
    for s, name in zip(cfg_scales, names):
        npz = run_dir / "samples" / f"{name}.npz"
        sample_cfg = config_lib.make("sample", cfg_scale=s)                   # plain decoding, temperature 1, no top-k/p
        settings = generation.sampling_settings(sample_cfg)
        meta = generation.sample_meta(checkpoint=str(path), step=src.step, config=src.cfg.to_dict(),
                                      settings=settings, seed=seed, classes=classes, num=num,
                                      batch_size=batch_size, ema=src.ema, grid=src.grid)
        generation.NpzJob(npz, labels, batch_size, seed, meta).complete(
            generation.make_sampler(src.model, src.tokenizer, src.grid, sample_cfg))
        samples = open_images(npz)
        res = score(samples, ref, features, weights, cache)
        res.metrics.update(nll)
        rec = records.make_record(res, samples=samples, reference=ref, method=label, samples_path=str(npz))
        rec["study"] = {**study, "cfg_scale": s}
        out.append(records.write_record(rec, run_dir / "eval"))
    return out


def candidates(every: int, upto: int) -> list[int]:
    """The checkpoints a run's step is selected among: every ``every``-th step up to ``upto``, and ``upto``."""
    return sorted(set(range(every, upto + 1, every)) | {upto})


def select_step(curve: dict[int, float], upto: int) -> int:
    """The step with the lowest validation NLL among the curve's steps <= ``upto`` (the earliest on a tie)."""
    steps = [s for s in sorted(curve) if s <= upto]
    if not steps:
        raise StudyError(f"no validation NLL at or before step {upto}")
    return min(steps, key=lambda s: (curve[s], s))


def read_curve(run_dir: Path) -> dict:
    """RUN/val_nll.json: {"nll": {step: validation NLL}, "selected": {label: step}, "weights": "ema"|"raw"}."""
    path = run_dir / VAL_CURVE_FILE
    if not path.is_file():
        return {"nll": {}, "selected": {}}
    raw = json.loads(path.read_text())
    return {**raw, "nll": {int(k): v for k, v in raw["nll"].items()}}


def val_curve(run_dir: Path, steps: list[int]) -> dict:
    """The validation NLL of the run's checkpoints at ``steps`` (weights as sampled: EMA when kept),
    computed once each and kept in RUN/val_nll.json."""
    curve = read_curve(run_dir)
    for step in steps:
        if step not in curve["nll"]:
            model, cfg, meta = inference.open_model(ckpt_lib.checkpoint_path(run_dir, step))
            curve["nll"][step] = heldout_nll(model, cfg.data, "val")
            curve["weights"] = "ema" if meta["has_ema"] else "raw"
            write_curve(run_dir, curve)
    return curve


def write_curve(run_dir: Path, curve: dict) -> None:
    """RUN/val_nll.json, written whole (atomically): a rerun finds every value computed before."""
    from ..io import write_text_atomic
    nll = {str(k): v for k, v in sorted(curve["nll"].items())}
    write_text_atomic(run_dir / VAL_CURVE_FILE, json.dumps({**curve, "nll": nll}, indent=1) + "\n")


def run_unit(unit: dict) -> dict:
    """Train one (label, seed) run (resuming if needed); with val_every, score the validation NLL of its
    checkpoints up to its horizon and add the lowest one's step to the eval steps; evaluate them."""
    torch.set_num_threads(1)
    run_dir = Path(unit["run_dir"])
    cfg = run_config(unit["method"], unit["seed"], unit["steps"], unit["ckpt_every"], unit["overrides"], unit["base"])
    if not ckpt_lib.checkpoint_path(run_dir, unit["steps"]).is_file():   # else finished earlier
        from ..engine import train
        train(cfg, run_dir, resume="auto")
    secs, steps = train_seconds(run_dir)
    study = {"method": unit["label"], "seed": unit["seed"], "train_seconds": secs, "train_steps": steps,
             "max_steps": unit["steps"], "data_fraction": getattr(cfg.data, "train_fraction", 1.0)}
    eval_steps = list(unit["eval_steps"])
    if unit["val_every"]:
        curve = val_curve(run_dir, candidates(unit["val_every"], unit["horizon"]))
        study["selected_step"] = select_step(curve["nll"], unit["horizon"])
        curve["selected"][unit["label"]] = study["selected_step"]
        write_curve(run_dir, curve)
        eval_steps = sorted(set(eval_steps) | {study["selected_step"]})
    for step in eval_steps:
        evaluate(run_dir, step, unit["cfg"], unit["num"], unit["label"], study, Path(unit["cache"]),
                 tag="cm_" if unit["label"] == COMPUTE_MATCHED else "")
    return {**study, "run_dir": str(run_dir)}


def follow_driver(driver_pid: int) -> None:
    """Pool-worker initializer: once the driver process is gone (killed, or stopped by a signal of its
    own), give this worker a stop signal, so that it checkpoints and ends instead of training on alone."""
    def watch():
        while os.getppid() == driver_pid:
            time.sleep(1)
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=watch, daemon=True).start()


def pool_unit(unit: dict) -> dict:
    """run_unit in a pool worker. A stop signal ends the worker after its checkpoint (exit PREEMPTED_EXIT)
    rather than letting it start the next queued unit; the pool then stops the study."""
    try:
        load_plugins()                    # a spawned worker: the objectives of MUTOR2D_PLUGINS again
        return run_unit(unit)
    except Preempted:
        os._exit(PREEMPTED_EXIT)


def run_all(units: list[dict], jobs: int) -> list[dict]:
    """Units in order, ``jobs`` processes at a time (in this process when jobs == 1). A stop signal to
    the driver or a worker (or the driver's death) stops every worker at its next step boundary, after
    a checkpoint; rerunning the same command resumes."""
    if jobs == 1:
        return [run_unit(u) for u in units]
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=follow_driver,
                             initargs=(os.getpid(),)) as pool:
        try:
            return list(pool.map(pool_unit, units))
        except BrokenProcessPool:
            raise Preempted("a study worker stopped (stop signal or killed); every run keeps its last "
                            "checkpoint: rerun the same command to resume") from None


# ----------------------------------------------------------------------------- floor

def floor_records(out: Path, num: int, draws: int, cache: Path, data_seed: int = DIGITS_DATA_SEED,
                  data_name: str = "digits") -> list[dict]:
    """Real held-out images (DATA:test) against DATA:train: as is, and ``draws`` resamples (with
    replacement) of ``num`` images."""
    old = sorted((out / "floor" / "eval").glob("*.json"))
    if len(old) == draws + 1:                            # made before with these settings
        recs = [json.loads(p.read_text()) for p in old]
        if all(r["n"] == num for r in recs if r["study"]["seed"] is not None):
            return sorted(recs, key=lambda r: r["study"]["seed"] is not None)
    test, _, _ = data_reference(data_name, data_seed, cache, "test")
    ref, features, weights = data_reference(data_name, data_seed, cache)
    sources = [("real held-out", test, None)]
    for d in range(draws):
        idx = np.random.default_rng(d).integers(0, test.n, num)
        src = ImageSource(f"{data_name}:test resampled {num} #{d}", ArrayImages(test.dataset.images[idx]),
                          test.labels[idx])
        sources.append((f"real held-out x{num} (resampled)", src, d))
    recs = []
    for label, src, d in sources:
        res = score(src, ref, features, weights, cache)
        rec = records.make_record(res, samples=src, reference=ref, method=label,
                                  samples_path=f"{data_name}-test{'' if d is None else f'-resampled{num}-{d}'}")
        rec["study"] = {"method": label, "seed": d, "cfg_scale": None}
        records.write_record(rec, out / "floor" / "eval")
        recs.append(rec)
    return recs


# ----------------------------------------------------------------------------- summary

def collect(out: Path) -> list[dict]:
    """The study's records; each run's record at a label's validation-selected step (RUN/val_nll.json)
    also carries ``study["val_best"] = True``."""
    runs = sorted(p for p in out.glob("*/*") if (p / "eval").is_dir())
    recs = []
    for run in runs:
        selected = read_curve(run)["selected"]
        for r in records.read_records([run])[0]:
            if "study" in r:
                r["study"]["val_best"] = selected.get(r["study"]["method"]) == r["step"]
                recs.append(r)
    if (out / "floor" / "eval").is_dir():
        recs += [r for r in records.read_records([out / "floor"])[0] if "study" in r]
    return recs


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
    """{(label, step): {"seeds", "cfg": {cfg: {metric: [values over seeds]}}, "fid": {cfg: {seed: FID}}, "nll", "nll_val",
    "s_per_step", "steps": {seed: step}, "skips": {seed: updates skipped up to the step}, "commits": {its
    runs' commit cells}}}; step None for the floor, VAL_BEST for the validation-selected
    step of each seed (its records also count at their own step)."""
    groups: dict = {}
    for r in recs:
        run = r["study"]          # the run's study settings: label, seed, cfg scale, timing
        keys = [(run["method"], None if r.get("step") is None else int(r["step"]))]
        if run.get("val_best"):
            keys.append((run["method"], VAL_BEST))
        for key in keys:
            group = groups.setdefault(key, {"seeds": set(), "nll": {}, "nll_val": {}, "s_per_step": {},
                                            "cfg": {}, "fid": {}, "steps": {}, "skips": {}, "commits": set()})
            group["seeds"].add(run.get("seed"))
            group["commits"].add(records.commit_text(r))
            if r.get("step") is not None:
                group["skips"][run.get("seed")] = records.skips_text(records.run_folder(r), r["step"])
            group["steps"][run.get("seed")] = r.get("step")
            if run.get("train_steps"):
                group["s_per_step"][run["seed"]] = run["train_seconds"] / run["train_steps"]
            for name in ("nll_test", "nll_val"):
                if name in r["metrics"]:
                    group["nll" if name == "nll_test" else name][run["seed"]] = r["metrics"][name]
            if "fid" in r["metrics"]:
                group["fid"].setdefault(run.get("cfg_scale"), {})[run.get("seed")] = r["metrics"]["fid"]
            by_metric = group["cfg"].setdefault(run.get("cfg_scale"), {})
            for k, v in r["metrics"].items():
                by_metric.setdefault(k, []).append(v)
    return groups


def method_order(name: str) -> tuple:
    """Table order: full-data labels by METHODS (the compute-matched runs last), then the data-fraction
    labels by method and falling fraction."""
    method, frac = label_parts(name)
    names = list(METHODS) + [COMPUTE_MATCHED]
    return (frac < 1, names.index(method) if method in names else len(names), -frac, name)


def row_order(key: tuple) -> tuple:
    """(label order, fixed steps before the validation-selected row, step)."""
    return (method_order(key[0]), key[1] == VAL_BEST, 0 if key[1] == VAL_BEST else key[1])


def table(groups: dict, cfg_scales: list[float]) -> str:
    """Mean ± sd over seeds per (label, step); a "val-best" row per label when steps were selected on
    validation (its step column: the selected steps' mean ± sd); a "val NLL" column when any record has one;
    the updates each seed's run skipped up to the step (the blow-up guard: mutor2d/engine/health.py); the
    runs' commits (records.commit_text) last."""
    guided_scales = [s for s in cfg_scales if s != 1.0]
    val = any(g["nll_val"] for g in groups.values())
    head = ["method", "step", "seeds"] + [f"FID cfg {s:g}" for s in cfg_scales] + \
        [f"accuracy cfg {s:g}" for s in cfg_scales] + ["IS cfg 1"] + (["val NLL"] if val else []) + \
        ["test NLL (nats/token)", "train s/step", "skipped updates per seed", "commit"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for key in sorted((k for k in groups if k[1] is not None), key=row_order):
        g = groups[key]
        step = f"{VAL_BEST} ({fmt(list(g['steps'].values()), 0)})" if key[1] == VAL_BEST else str(key[1])
        row = [key[0], step, str(len(g["seeds"]))]
        row += [fmt(g["cfg"].get(s, {}).get("fid", [])) for s in cfg_scales]
        row += [fmt(g["cfg"].get(s, {}).get("accuracy", []), 3) for s in cfg_scales]
        row += [fmt(g["cfg"].get(1.0, {}).get("is", []))]
        row += [fmt(list(g["nll_val"].values()), 4)] if val else []
        row += [fmt(list(g["nll"].values()), 4), fmt(list(g["s_per_step"].values()), 3)]
        row += [", ".join(g["skips"][seed] for seed in sorted(g["skips"], key=str)) or "–", ", ".join(sorted(g["commits"]))]
        lines.append("| " + " | ".join(row) + " |")
    for key in sorted(k for k in groups if k[1] is None):
        g = groups[key]
        c = g["cfg"].get(None, {})
        row = [key[0], "–", str(len(g["seeds"]))] + [fmt(c.get("fid", []))] + ["″"] * len(guided_scales) + \
            [fmt(c.get("accuracy", []), 3)] + ["″"] * len(guided_scales) + [fmt(c.get("is", []))] + \
            (["–"] if val else []) + ["–", "–", "–", "–"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def t95(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% Student-t interval) of per-seed values (nan half-width for one)."""
    from scipy.stats import t
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, float("nan")
    return m, float(t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))


def paired_table(groups: dict, cfg: float, reference: str = "next-token") -> str:
    """Markdown: per label and step, FID at ``cfg`` minus ``reference``'s at the same step, paired by
    seed (the same data order), with its 95% t-interval and wins (lower FID) / losses over seeds."""
    lines = [f"| method | step | seeds | FID minus {reference} [95% CI] | wins / losses |", "|---|---|---|---|---|"]
    for key in sorted((k for k in groups if isinstance(k[1], int) and k[0] != reference), key=row_order):
        ref = groups.get((reference, key[1]), {}).get("fid", {}).get(cfg, {})
        mine = groups[key]["fid"].get(cfg, {})
        diffs = [mine[seed] - ref[seed] for seed in sorted(mine, key=str) if seed in ref]
        if not diffs:
            continue
        m, h = t95(diffs)
        lines.append(f"| {key[0]} | {key[1]} | {len(diffs)} | {m:+.2f} [{m - h:+.2f}, {m + h:+.2f}] | "
                     f"{sum(d < 0 for d in diffs)} / {sum(d > 0 for d in diffs)} |")
    return "\n".join(lines)


def convergence(groups: dict, cfg: float, method: str, reference: str = "next-token") -> dict | None:
    """The first scored step at which ``method``'s mean FID (at ``cfg``) is at most ``reference``'s
    final one (its mean at its last scored step), and that step over the reference's final step
    (the paper's "MuToR-2D at 100K beats next-token at 200K" is a ratio of 0.5); None without both."""
    def curve(label):
        return sorted((k[1], statistics.fmean(g["fid"][cfg].values())) for k, g in groups.items()
                      if k[0] == label and isinstance(k[1], int) and g["fid"].get(cfg))
    ref, mine = curve(reference), curve(method)
    if not ref or not mine:
        return None
    final_step, final_fid = ref[-1]
    first = next((step for step, fid in mine if fid <= final_fid), None)
    return {"method": method, "reference": reference, "cfg": cfg, "reference_final_step": final_step,
            "reference_final_fid": final_fid, "first_step": first,
            "ratio": None if first is None else first / final_step}


def plot(groups: dict, cfg_scales: list[float], out: Path) -> Path:
    """FID (mean ± sd over seeds) against step, one panel per CFG scale; floor as a dashed line."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(5 * len(cfg_scales), 4))
    axes = fig.subplots(1, len(cfg_scales), squeeze=False)[0]
    floor = groups.get(("real held-out", None), {}).get("cfg", {}).get(None, {}).get("fid")
    for ax, s in zip(axes, cfg_scales):
        for method in sorted({k[0] for k in groups if isinstance(k[1], int)}, key=method_order):
            pts = sorted((k[1], groups[k]["cfg"].get(s, {}).get("fid", [])) for k in groups
                         if k[0] == method and isinstance(k[1], int))
            pts = [(st, *mean_sd(v)[:2]) for st, v in pts if v]
            if not pts:
                continue
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] or 0 for p in pts], marker="o",
                        capsize=3, label=method, linestyle="none" if method == COMPUTE_MATCHED else "-")
        if floor:
            ax.axhline(statistics.fmean(floor), color="grey", linestyle="--", label="real held-out (floor)")
        ax.set_title(f"cfg {s:g}")
        ax.set_xlabel("training step")
        ax.set_ylabel("FID (the data's classifier)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save_figure(fig, out)


def _save_figure(fig, out: Path) -> Path:
    """Lay out ``fig`` and write it to ``out`` (folders made); returns ``out``."""
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


def fraction_points(groups: dict, method: str, name: str, step=VAL_BEST) -> list[tuple]:
    """[(fraction, mean, sd)] of a metric of ``method``'s labels (METHOD and METHOD@F) at ``step`` (VAL_BEST:
    each run's validation-selected step): ``name`` "nll_val"/"nll" (per seed) or a sample metric at cfg 1."""
    pts = []
    for (label, at), g in groups.items():
        m, frac = label_parts(label)
        if at != step or m != method:
            continue
        vals = list(g[name].values()) if name in ("nll", "nll_val") else g["cfg"].get(1.0, {}).get(name, [])
        mean, sd, n = mean_sd(vals)
        if n:
            pts.append((frac, mean, sd or 0.0))
    return sorted(pts)


def last_step(groups: dict, method: str) -> int | None:
    """The largest fixed step scored for ``method`` at every one of its data fractions (None if none)."""
    steps: dict[float, set] = {}
    for label, at in groups:
        m, frac = label_parts(label)
        if m == method and isinstance(at, int):
            steps.setdefault(frac, set()).add(at)
    common = set.intersection(*steps.values()) if steps else set()
    return max(common) if common else None


def fraction_plot(groups: dict, methods: list[str], out: Path) -> Path:
    """Validation NLL, test NLL and FID (cfg 1) against the data fraction (mean ± sd over seeds), one
    colour per method: solid at each run's validation-selected step, dashed at the last scored step
    (how far training on past the selected step drifts)."""
    from matplotlib.figure import Figure
    panels = [("nll_val", "validation NLL (nats/token)"), ("nll", "test NLL"), ("fid", "embedded FID cfg 1")]
    fig = Figure(figsize=(5 * len(panels), 4))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, title) in zip(axes, panels):
        for i, method in enumerate(methods):
            last = last_step(groups, method)
            for step, style, tag in ((VAL_BEST, "-", "selected step"), (last, "--", f"step {last}")):
                pts = fraction_points(groups, method, name, step) if step is not None else []
                if pts:
                    ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                                capsize=3, linestyle=style, color=f"C{i}", label=f"{method}, {tag}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("share of the training images")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save_figure(fig, out)


# ----------------------------------------------------------------------------- driver

def compute_matched(study: Study, done: list[dict]) -> tuple[dict, list[dict]]:
    """(summary of the compute-matched point, the runs evaluated at it: under a constant lr the next-token
    runs' checkpoint, trained here; with a decaying lr the runs of their own, trained in ``done`` already)."""
    cm = study.compute_matched
    per_step = {m: statistics.median(d["train_seconds"] / d["train_steps"] for d in done if d["method"] == m)
                for m in ("next-token", cm)}
    measured = per_step[cm] / per_step["next-token"]
    ratio = measured if study.cm_ratio is None else study.cm_ratio
    cm_step = study.cm_step(ratio)
    note = " (capped by --cm-max)" if cm_step < study.steps * ratio - study.grain else ""
    given = "" if study.cm_ratio is None else f" (--cm-ratio; measured here {measured:.2f}x)"
    print(f"compute-matched: {cm} costs {ratio:.2f}x a next-token step{given} -> next-token at step "
          f"{cm_step}{note}", flush=True)
    point = {"method": cm, "ratio": ratio, "measured_ratio": measured, "step": cm_step, "s_per_step": per_step,
             "capped": bool(note)}
    if not study.constant:
        return point, []
    return point, run_all(study.cm_units(cm_step), study.jobs)


def run_study(study: Study) -> dict:
    """Train, sample, score (unless report_only), then write OUT/table.md, OUT/summary.json, the plots;
    the summary's ``provenance``: the study process's and each run's (its records'), one warning line
    when the runs differ in code, versions or data."""
    study.check()
    t0 = time.time()
    summary: dict = {"runs": []}
    if not study.report_only:
        data = study.config().data
        data_reference(data.name, data.data_seed, study.cache)              # train the classifier once, up front
        floor = floor_records(study.out, study.num, study.floor_draws, study.cache, data.data_seed, data.name)
        print(f"floor: held-out FID {floor[0]['metrics']['fid']:.2f}", flush=True)
        summary["runs"] = run_all(study.units(), study.jobs)
        if study.compute_matched:
            summary["compute_matched"], more = compute_matched(study, summary["runs"])
            summary["runs"] += more
    recs = collect(study.out)
    groups = summarise(recs, study.cfg_scales)
    md = table(groups, study.cfg_scales)
    for cfg in study.cfg_scales:
        md += f"\n\nPaired by seed, cfg {cfg:g}:\n\n" + paired_table(groups, cfg)
    summary["convergence"] = [c for cfg in study.cfg_scales for m in study.methods if m != "next-token"
                              for c in [convergence(groups, cfg, m)] if c]
    for c in summary["convergence"]:
        first = "never" if c["first_step"] is None else f"step {c['first_step']} (ratio {c['ratio']:.2f})"
        md += (f"\n\n{c['method']} first reaches next-token's final FID {c['reference_final_fid']:.2f} "
               f"(step {c['reference_final_step']}, cfg {c['cfg']:g}): {first}")
    differ = records.provenance_warning(recs)
    if differ:
        warn(differ)
    summary["provenance"] = {"study": provenance.provenance(), "runs": {
        str(records.run_folder(r)): records.record_provenance(r) for r in recs if records.record_provenance(r)}}
    (study.out / "table.md").write_text(md + "\n")
    png = plot(groups, study.cfg_scales, study.plot or study.out / "fid_vs_step.png")
    summary.update(wall_seconds=time.time() - t0, table=md, plot=str(png))
    if study.fractions:
        summary["fraction_plot"] = str(fraction_plot(groups, study.fraction_methods,
                                                     study.fraction_plot or study.out / "fraction.png"))
    return summary
