"""The image study's figures (mutor2d.evaluation.study): FID against step per CFG scale with the
held-out floor, and validation NLL, test NLL and FID against the share of training images."""
from __future__ import annotations

import statistics
from pathlib import Path

from .plan import COMPUTE_MATCHED, label_parts
from .records import save_figure
from .study_tables import VAL_BEST, mean_sd, method_order


def plot(groups: dict, cfg_scales: list[float], out: Path) -> Path:
    """FID against step, one panel per CFG scale: each label's mean over seeds with a ± sd band (the
    compute-matched points as error bars); the floor as a dashed line."""
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
            x, m, sd = [p[0] for p in pts], [p[1] for p in pts], [p[2] or 0 for p in pts]
            if method == COMPUTE_MATCHED:
                ax.errorbar(x, m, yerr=sd, marker="o", capsize=3, label=method, linestyle="none")
                continue
            line, = ax.plot(x, m, marker="o", label=method)
            ax.fill_between(x, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)],
                            color=line.get_color(), alpha=0.2, linewidth=0)
        if floor:
            ax.axhline(statistics.fmean(floor), color="grey", linestyle="--", label="real held-out (floor)")
        ax.set(title=f"cfg {s:g}", xlabel="training step", ylabel="FID (the data's classifier)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, out, dpi=110)


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
    return max(set.intersection(*steps.values()), default=None) if steps else None


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
        ax.set(xlabel="share of the training images", title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, out, dpi=110)
