"""The image study's records grouped per (label, step): mean ± sd tables, paired-by-seed differences."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from . import records
from .plan import COMPUTE_MATCHED, METHODS, label_parts

VAL_BEST = "val-best"       # the step of a run picked by validation NLL (a table row, not a number)


def collect(out: Path) -> list[dict]:
    """The study's records; those at a label's validation-selected step get ``study["val_best"]``."""
    from .study_runs import read_curve            # torch: the tables and the speedup test need none
    recs = []
    for run in sorted(p for p in out.glob("*/*") if (p / "eval").is_dir()):
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
    """{(label, step): {"seeds", "cfg": {cfg: {metric: [values]}}, "by_seed": {cfg: {metric: {seed: value}}},
    "nll", "nll_val", "s_per_step", "steps", "skips", "commits"}}; step None: floor, VAL_BEST: selected."""
    groups: dict = {}
    for r in recs:
        run = r["study"]          # the run's study settings: label, seed, cfg scale, timing
        keys = [(run["method"], None if r.get("step") is None else int(r["step"]))]
        if run.get("val_best"):
            keys.append((run["method"], VAL_BEST))
        for key in keys:
            group = groups.setdefault(key, {"seeds": set(), "nll": {}, "nll_val": {}, "s_per_step": {},
                                            "cfg": {}, "by_seed": {}, "steps": {}, "skips": {}, "commits": set()})
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
            by_metric = group["cfg"].setdefault(run.get("cfg_scale"), {})
            by_seed = group["by_seed"].setdefault(run.get("cfg_scale"), {})
            for k, v in r["metrics"].items():
                by_metric.setdefault(k, []).append(v)
                by_seed.setdefault(k, {})[run.get("seed")] = v
    return groups


def method_order(name: str) -> tuple:
    """Full-data labels by METHODS (compute-matched last), then fraction labels by falling fraction."""
    method, frac = label_parts(name)
    names = list(METHODS) + [COMPUTE_MATCHED]
    return (frac < 1, names.index(method) if method in names else len(names), -frac, name)


def row_order(key: tuple) -> tuple:
    """(label order, fixed steps before the validation-selected row, step)."""
    return (method_order(key[0]), key[1] == VAL_BEST, 0 if key[1] == VAL_BEST else key[1])


def table(groups: dict, cfg_scales: list[float]) -> str:
    """Mean ± sd over seeds per (label, step), a "val-best" row per label, the floor rows last."""
    guided_scales = [s for s in cfg_scales if s != 1.0]
    val = any(g["nll_val"] for g in groups.values())
    head = ["method", "step", "seeds"] + [f"FID cfg {s:g}" for s in cfg_scales] + \
        [f"accuracy cfg {s:g}" for s in cfg_scales] + ["IS cfg 1"] + (["val NLL"] if val else []) + \
        ["test NLL (nats/token)", "train s/step", "skipped updates per seed", "commit"]
    rows = []
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
        rows.append(row)
    for key in sorted(k for k in groups if k[1] is None):
        g = groups[key]
        c = g["cfg"].get(None, {})
        same = ["″"] * len(guided_scales)
        rows.append([key[0], "–", str(len(g["seeds"])), fmt(c.get("fid", [])), *same,
                     fmt(c.get("accuracy", []), 3), *same, fmt(c.get("is", [])), *(["–"] if val else []),
                     "–", "–", "–", "–"])
    return records.markdown(head, rows)


def t95(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% Student-t interval) of per-seed values (nan half-width for one)."""
    from scipy.stats import t
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, float("nan")
    return m, float(t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))


PAIRED = {"fid": ("FID", 2, -1), "kid": ("KID", 3, -1), "accuracy": ("class accuracy", 3, 1),
          "nll_test": ("test NLL", 4, -1)}  # name, digits, better sign


def paired_cells(label: str, steps: str, diffs: list[float], metric: str) -> list[str]:
    """The cells of a row of per-seed differences: their mean, 95% t-interval and wins / losses."""
    _, digits, better = PAIRED[metric]
    m, h = t95(diffs)
    return [label, steps, str(len(diffs)), f"{m:+.{digits}f} [{m - h:+.{digits}f}, {m + h:+.{digits}f}]",
            f"{sum(d * better > 0 for d in diffs)} / {sum(d * better < 0 for d in diffs)}"]


def step_values(groups: dict, label: str, cfg: float, metric: str) -> dict[int, dict]:
    """{fixed step: {seed: ``metric`` at ``cfg``}} of one label."""
    return {k[1]: g["by_seed"].get(cfg, {}).get(metric, {}) for k, g in groups.items()
            if k[0] == label and isinstance(k[1], int)}


def paired_rows(groups: dict, cfg: float, reference: str, metric: str, windows) -> list[list[str]]:
    """Per label and window (``windows``: the shared steps -> lists of steps), the row of cells of each seed's
    ``metric`` averaged over the window minus ``reference``'s (seeds scored at every step of the window)."""
    ref, rows = step_values(groups, reference, cfg, metric), []
    for label in sorted({k[0] for k in groups if isinstance(k[1], int)} - {reference}, key=method_order):
        mine = step_values(groups, label, cfg, metric)
        for steps in windows(sorted(set(mine) & set(ref))):
            seeds = sorted(set.intersection(*[set(mine[s]) & set(ref[s]) for s in steps]), key=str)
            if diffs := [statistics.fmean(mine[s][seed] - ref[s][seed] for s in steps) for seed in seeds]:
                rows.append(paired_cells(label, ", ".join(map(str, steps)), diffs, metric))
    return rows


def paired_table(groups: dict, cfg: float, reference: str = "next-token", metric: str = "fid") -> str:
    """Markdown: per label and step, ``metric`` at ``cfg`` minus ``reference``'s, paired by seed ("": none pairs)."""
    rows = paired_rows(groups, cfg, reference, metric, lambda steps: [[s] for s in steps])
    head = ["method", "step", "seeds", f"{PAIRED[metric][0]} minus {reference} [95% CI]", "wins / losses"]
    return records.markdown(head, rows) if rows else ""


def late_table(groups: dict, cfg: float, last: int = 3, reference: str = "next-token", metric: str = "fid") -> str:
    """Markdown: per seed, ``metric`` averaged over the last ``last`` shared steps minus ``reference``'s."""
    rows = paired_rows(groups, cfg, reference, metric, lambda steps: [steps[-last:]] if steps else [])
    name = PAIRED[metric][0]
    head = ["method", "steps", "seeds", f"mean {name} minus {reference} [95% CI]", "wins / losses"]
    return records.markdown(head, rows)


def convergence(groups: dict, cfg: float, method: str, reference: str = "next-token") -> dict | None:
    """The first step ``method``'s mean FID is at most ``reference``'s final one, and its ratio to that step."""

    def curve(label):
        return sorted((step, statistics.fmean(fids.values()))
                      for step, fids in step_values(groups, label, cfg, "fid").items() if fids)
    ref, mine = curve(reference), curve(method)
    if not ref or not mine:
        return None
    final_step, final_fid = ref[-1]
    first = next((step for step, fid in mine if fid <= final_fid), None)
    return {"method": method, "reference": reference, "cfg": cfg, "reference_final_step": final_step,
            "reference_final_fid": final_fid, "first_step": first,
            "ratio": None if first is None else first / final_step}
