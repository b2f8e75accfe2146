"""The language study's report (experiments/lm_study.py): tables, pairing checks, summary, bootstrap, plots."""
from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from mutor2d import provenance
from mutor2d.engine.runlog import read_log, skip_counts
from mutor2d.evaluation.plan import StudyError
from mutor2d.evaluation.records import markdown
from mutor2d.evaluation.study_tables import t95
from mutor2d.io import write_json_atomic

from .runs import load_jsonl, records_of
from .tasks import Size


def final_loss(run: Path) -> float | None:
    return next((r["loss_ntp"] for r in reversed(read_log(run)) if "loss_ntp" in r), None)


def table_rows(runs: dict[str, dict[int, Path]], max_steps: int) -> list[dict]:
    """Per arm: seeds, final test accuracy per seed, its mean and std, final next-token loss (mean, or None)."""
    rows = []
    for method, by_seed in runs.items():
        acc = [records_of(r)[max_steps]["metrics"]["accuracy"] for r in by_seed.values()]
        loss = [v for v in (final_loss(r) for r in by_seed.values()) if v is not None]
        rows.append({"arm": method, "seeds": len(acc), "accuracy_mean": statistics.mean(acc),
                     "accuracy_sd": statistics.stdev(acc) if len(acc) > 1 else 0.0, "accuracy_per_seed": acc,
                     "final_ce_ntp": statistics.mean(loss) if loss else None})
    return rows


def table(runs: dict[str, dict[int, Path]], max_steps: int) -> str:
    """Markdown: final test accuracy (mean ± std over seeds, each seed) and final next-token loss."""
    head = ["method", "seeds", "test accuracy (mean ± std)", "per seed", "final train CE_ntp"]
    return markdown(head, [[r["arm"], str(r["seeds"]), f"{r['accuracy_mean']:.3f} ± {r['accuracy_sd']:.3f}",
                            ", ".join(f"{a:.3f}" for a in r["accuracy_per_seed"]),
                            "-" if r["final_ce_ntp"] is None else f"{r['final_ce_ntp']:.3f}"]
                           for r in table_rows(runs, max_steps)])


def init_of(run: Path) -> str | None:
    """The sha256 of the initial weights a run's first session started from (RUN/provenance.json)."""
    sessions = provenance.read_sessions(run)
    return ((sessions[0].get("init") or {}).get("sha256")) if sessions else None


def check_bases(runs: dict[str, dict[int, Path]], allow_mixed: bool) -> dict[int, str | None]:
    """Seed -> the sha256 of its arms' initial weights; differing arms: StudyError unless ``allow_mixed``."""
    by_seed: dict[int, set] = {}
    for by in runs.values():
        for seed, run in by.items():
            by_seed.setdefault(seed, set()).add(init_of(run))
    mixed = {s: found for s, found in by_seed.items() if len(found - {None}) > 1}
    if mixed and not allow_mixed:
        seed, found = next(iter(sorted(mixed.items())))
        raise StudyError(f"the arms of seed {seed} fine-tuned different initial weights "
                         f"({', '.join(sorted(provenance.short(h) for h in found - {None}))}): their pairing would "
                         f"compare bases, not methods; pass --allow-mixed-bases to pair them anyway")
    return {s: None if s in mixed else next(iter(found - {None}), None) for s, found in sorted(by_seed.items())}


def write_summary(out: Path, task_name: str, runs: dict, size: Size, bases: dict, shared: Path | None,
                  boot: dict | None = None) -> Path:
    """OUT/summary.json: the table's rows, each seed's initial weights and the study's and runs' provenance."""
    from mutor2d.lm.hf import base_fingerprint
    summary = {"task": task_name, "rows": table_rows(runs, size.max_steps),
               "base": {"folder": str(shared), "key12": shared.name,
                        "sha256": base_fingerprint(str(shared))["sha256"]} if shared else None,
               "init_sha256_by_seed": {str(s): h for s, h in bases.items()},
               "bootstrap": {str(k): v for k, v in boot.items()} if boot else None,
               "provenance": {"study": provenance.provenance(),
                              "runs": {r.name: (provenance.read_sessions(r) or [None])[0]
                                       for by in runs.values() for r in by.values()}}}
    return write_json_atomic(out / "summary.json", summary)


def reference_arm(arm: str, reference: str = "next-token") -> str:
    """The arm an arm is paired with: ``reference`` under the same prompt attention ("METHOD, MODE")."""
    return ", ".join([reference, *arm.split(", ")[1:]])


def forwards_per_token(record: dict) -> float | None:
    """Forwards per generated token of an evaluation record's decoding (1.0 plain; < 1 with drafts)."""
    return record.get("sampling", {}).get("decode_stats", {}).get("forwards_per_token")


def cpu_seconds(out: Path) -> dict[str, float]:
    """Run folder name -> CPU seconds over all its sessions (OUT/costs.jsonl)."""
    total = {}
    path = out / "costs.jsonl"
    for row in (load_jsonl(path) if path.is_file() else []):
        total[row["run"]] = total.get(row["run"], 0.0) + row["cpu_s"]
    return total


SKIP_TOLERANCE = 0.01       # paired arms may differ by this share of their updates in skipped ones


def skipped(run: Path) -> int:
    """Updates the run's blow-up guard skipped (mutor2d/engine/health.py)."""
    return sum(skip_counts(run).values())


def check_skips(runs: dict[str, dict[int, Path]], max_steps: int, reference: str, tolerance: float) -> None:
    """One-line refusal when an arm's and its reference's skipped updates differ by > ``tolerance`` x ``max_steps``."""
    for arm, by_seed in runs.items():
        ref = runs.get(reference_arm(arm, reference), {})
        for seed, run in by_seed.items():
            if seed in ref and ref[seed] != run and abs(skipped(run) - skipped(ref[seed])) > tolerance * max_steps:
                raise StudyError(f"{arm} and {reference_arm(arm, reference)} (seed {seed}) skipped "
                                 f"{skipped(run)} and {skipped(ref[seed])} of {max_steps} updates, more apart than "
                                 f"--skip-tolerance {tolerance:g}: their paired difference is not reported "
                                 f"(--allow-skip-mismatch reports it anyway)")


def interval_table(runs: dict[str, dict[int, Path]], max_steps: int, out: Path, reference: str = "next-token") -> str:
    """Markdown: per arm, final accuracy (95% CI over seeds), the paired difference to ``reference`` with CI and
    wins / ties / losses, CPU seconds per run, forwards per token, and skipped updates per seed."""
    final = {arm: {s: records_of(r)[max_steps] for s, r in by.items()} for arm, by in runs.items()}
    acc = {arm: {s: rec["metrics"]["accuracy"] for s, rec in by.items()} for arm, by in final.items()}
    cpu = cpu_seconds(out)
    head = ["arm", "seeds", "accuracy [95% CI]", f"minus {reference} [95% CI]", "wins / ties / losses",
            "CPU s per run", "forwards per token", "skipped updates per seed"]
    rows = []
    for arm, by_seed in acc.items():
        mean, half = t95(list(by_seed.values()))
        ref = acc.get(reference_arm(arm, reference), {})
        paired = [by_seed[s] - ref[s] for s in by_seed if s in ref]
        if arm == reference_arm(arm, reference) or not paired:
            diff, record = "—", "—"
        else:
            d, h = t95(paired)
            diff = f"{d:+.3f} [{d - h:+.3f}, {d + h:+.3f}]"
            record = f"{sum(x > 0 for x in paired)} / {sum(x == 0 for x in paired)} / {sum(x < 0 for x in paired)}"
        costs = [cpu[r.name] for r in runs[arm].values() if r.name in cpu]
        cost = f"{statistics.mean(costs):.0f}" if costs else "-"
        fpt = [f for f in map(forwards_per_token, final[arm].values()) if f is not None]
        fpt_text = f"{statistics.mean(fpt):.3f}" if fpt else "-"
        skips = ", ".join(str(skipped(runs[arm][s])) for s in sorted(by_seed))
        rows.append([arm, str(len(by_seed)), f"{mean:.3f} [{mean - half:.3f}, {mean + half:.3f}]", diff,
                     record, cost, fpt_text, skips])
    return markdown(head, rows)


def accuracy_curves(by_seed: dict[int, Path]) -> list[dict[int, float]]:
    """Per seed's run: its online test accuracy by step."""
    return [{s: r["metrics"]["accuracy"] for s, r in records_of(run).items()} for run in by_seed.values()]


def curve_table(runs: dict[str, dict[int, Path]]) -> str:
    """Markdown: mean test accuracy over seeds at every evaluated step."""
    curves = {m: accuracy_curves(by_seed) for m, by_seed in runs.items()}
    steps = sorted(set.intersection(*(set(c) for cs in curves.values() for c in cs)))
    rows = [[method, *(f"{statistics.mean(c[s] for c in cs):.3f}" for s in steps)]
            for method, cs in curves.items()]
    return markdown(["method", *(f"step {s}" for s in steps)], rows)


def figure(path: Path, title: str, draw) -> Path:
    """``draw(ax)`` on a new figure of test accuracy against training step, saved to ``path``."""
    from matplotlib.figure import Figure     # no pyplot: no global backend or figure state
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    draw(ax)
    ax.set(xlabel="training step", ylabel="test accuracy (exact match)", title=title)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def plot(runs: dict[str, dict[int, Path]], path: Path, title: str) -> Path:
    """Test accuracy against training step: each seed faint, the mean over seeds bold."""
    def draw(ax):
        for k, (method, by_seed) in enumerate(runs.items()):
            curves = accuracy_curves(by_seed)
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            for c in curves:
                ax.plot(sorted(c), [c[s] for s in sorted(c)], color=f"C{k}", alpha=0.25, lw=1)
            ax.plot(steps, [statistics.mean(c[s] for c in curves) for s in steps], color=f"C{k}", lw=2, label=method)
    return figure(path, title, draw)


BOOTSTRAP_DRAWS = 2000


def correctness(run: Path, step: int) -> np.ndarray:
    """0/1 per test item (in item order) of the run's online evaluation at ``step``."""
    path = next((run / "eval").glob(f"predictions_*_step{step}.jsonl"))
    items = sorted(load_jsonl(path), key=lambda it: it["index"])
    return np.array([bool(it["correct"]) for it in items], dtype=float)


def bootstrap(runs: dict[str, dict[int, Path]], reference: str, seed: int = 0) -> dict:
    """{step: {arm: {"acc": (mean, lo, hi), "diff": (mean, lo, hi) or None}}}: 95% percentile intervals of one
    bootstrap resampling seeds and items together, shared by every arm (paired by seed and item)."""
    steps = sorted(set.intersection(*(set(records_of(r)) for by in runs.values() for r in by.values())))
    seeds = sorted(set.intersection(*(set(by) for by in runs.values())))
    rng = np.random.default_rng(seed)
    out = {}

    def interval(mean, draws) -> tuple[float, float, float]:
        return (float(mean), *map(float, np.percentile(draws, [2.5, 97.5])))
    for step in steps:
        c = {arm: np.stack([correctness(by[s], step) for s in seeds]) for arm, by in runs.items()}  # (S, N)
        n_seeds, n_items = next(iter(c.values())).shape
        s_idx = rng.integers(0, n_seeds, (BOOTSTRAP_DRAWS, n_seeds))
        i_idx = rng.integers(0, n_items, (BOOTSTRAP_DRAWS, n_items))
        draws = {arm: np.array([m[si][:, ii].mean() for si, ii in zip(s_idx, i_idx)]) for arm, m in c.items()}
        out[step] = {arm: {"acc": interval(c[arm].mean(), d),
                           "diff": interval(c[arm].mean() - c[reference].mean(), d - draws[reference])
                           if arm != reference and reference in draws else None} for arm, d in draws.items()}
    return out


def bootstrap_table(boot: dict, reference: str) -> str:
    """Markdown: per step and arm, accuracy and the paired difference to ``reference`` [95% CI]."""
    rows = [[str(step), arm, "{:.3f} [{:.3f}, {:.3f}]".format(*v["acc"]),
             "—" if v["diff"] is None else "{:+.3f} [{:+.3f}, {:+.3f}]".format(*v["diff"])]
            for step, row in boot.items() for arm, v in row.items()]
    return markdown(["step", "arm", "accuracy [95% CI]", f"minus {reference} [95% CI]"], rows)


def plot_bands(boot: dict, path: Path, title: str) -> Path:
    """Accuracy against training step per arm: the mean line and its 95% bootstrap band."""
    def draw(ax):
        steps = sorted(boot)
        for k, arm in enumerate(boot[steps[0]]):
            m, lo, hi = zip(*(boot[s][arm]["acc"] for s in steps))
            ax.plot(steps, m, color=f"C{k}", lw=2, marker="o", label=arm)
            ax.fill_between(steps, lo, hi, color=f"C{k}", alpha=0.2)
    return figure(path, title, draw)
