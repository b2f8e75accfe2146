"""The image study (digits, or the photo crops): next-token vs MuToR (1D, 2D dense/sparse) vs the
multi-head baseline, trained, sampled and scored through the library (mutor2d.engine, generation,
evaluation). experiments/compare.py is its command line; its docstring describes the study (the data's
train split is the reference, scored with that data's classifier: :func:`data_reference`). Modules:
plan (the settings, no torch), study_runs (one run, the floor, the pool), study_tables (summary and
tables), study_plots (figures); this one runs a whole study and writes its outputs.
"""
from __future__ import annotations

import statistics
import time

from .. import provenance
from ..io import warn
from . import records, speedup
from .plan import Study
from .study_plots import fraction_plot, plot
from .study_runs import data_reference, floor_records, run_all
from .study_tables import PAIRED, collect, convergence, late_table, paired_table, summarise, table

LATE_STEPS = 3      # the report's late average: each run's last three scored steps


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
    return point, run_all(study.cm_units(cm_step), study.jobs) if study.constant else []


def run_study(study: Study) -> dict:
    """Train, sample, score (unless report_only), then write OUT/table.md, OUT/summary.json, the plots;
    the summary's ``provenance``: the study process's and each run's (its records'), one warning line
    when the runs differ in code, versions or data."""
    study.check_flags() if study.report_only else study.check()      # a report reads records, not data
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
        for metric, (name, _, _) in PAIRED.items():
            if rows := paired_table(groups, cfg, metric=metric):   # else no run scored it (digits: no KID)
                md += f"\n\nPaired by seed, {name}, cfg {cfg:g}:\n\n" + rows
                md += (f"\n\nPaired by seed, {name} averaged over the last {LATE_STEPS} steps scored, "
                       f"cfg {cfg:g}:\n\n" + late_table(groups, cfg, LATE_STEPS, metric=metric))
    summary["convergence"] = [c for cfg in study.cfg_scales for m in study.methods if m != "next-token"
                              for c in [convergence(groups, cfg, m)] if c]
    for c in summary["convergence"]:
        first = "never" if c["first_step"] is None else f"step {c['first_step']} (ratio {c['ratio']:.2f})"
        md += (f"\n\n{c['method']} first reaches next-token's final FID {c['reference_final_fid']:.2f} "
               f"(step {c['reference_final_step']}, cfg {c['cfg']:g}): {first}")
    if study.speedup:
        for cfg in study.cfg_scales:
            test = speedup.speedup_test(groups, cfg, study.speedup, study.steps)
            ratio = speedup.convergence_ratio(groups, cfg, study.speedup, study.steps)
            summary.setdefault("speedup", []).append({**test, "convergence_ratio": ratio})
            md += f"\n\nThe pre-registered test, cfg {cfg:g}:\n\n" + speedup.report(test, ratio)
    if differ := records.provenance_warning(recs):
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
