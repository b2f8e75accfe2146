"""The digits study (mutor2d.evaluation.study, command line experiments/compare.py): --quick runs the whole
pipeline (train, sample, score, validation NLL and selection, a data fraction, compute-matched point,
floor, table, plots) and leaves records the leaderboard reads; the held-out NLL is the next-token
cross-entropy; selection picks the lowest validation NLL; runs train in the stated order; bad
settings are one-line errors."""
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mutor2d import checkpoint as ckpt_lib
from mutor2d.checkpoint import inference
from mutor2d.data.tokens import build_dataset, collate
from mutor2d import config as config_lib
from mutor2d.evaluation import plan, records, study_plots, study_runs, study_tables
from mutor2d.objectives.layout import regular_position_ids
from timeouts import limit

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


compare = _load("compare_driver", ROOT / "experiments" / "compare.py")   # the command line: --quick sizes, main


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path_factory.mktemp("study")
        summary = compare.main(["--quick", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    return out, summary


def selected(run: Path) -> dict:
    return json.loads((run / study_runs.VAL_CURVE_FILE).read_text())["selected"]


def test_quick_writes_a_record_per_run_step_and_cfg(quick):
    out, summary = quick
    q = compare.QUICK
    labels = q["methods"].split(",") + [plan.fraction_label(m, float(f)) for m in q["fraction_methods"].split(",")
                                        for f in q["fractions"].split(",")]
    steps = [int(s) for s in q["eval_steps"].split(",")]
    scales = [float(s) for s in q["cfg"].split(",")]
    for m in labels:
        run = out / m / "seed0"
        recs = [json.loads(p.read_text()) for p in (run / "eval").glob("*.json")]
        mine = [r for r in recs if r["study"]["method"] == m]
        want = set(steps) | {selected(run)[m]}                      # fixed steps and the val-selected one
        assert sorted((r["step"], r["sampling"]["cfg_scale"]) for r in mine) == \
            sorted((s, c) for s in want for c in scales)
        for r in mine:
            assert r["method"] == m and r["n"] == q["num"] and r["reference"] == "digits:train"
            assert r["evaluator"]["feature_extractor"] == "mutor2d-digits" and r["sampling"]["ema"] is True
            assert {"fid", "accuracy", "nll_test", "nll_val", "precision"} <= set(r["metrics"])
            assert all(math.isfinite(v) for v in r["metrics"].values())
            labels_ = np.load(r["samples"])["labels"]
            assert np.bincount(labels_, minlength=10).tolist() == [q["num"] // 10] * 10   # class-balanced
    # the two objectives really differ, the cfg scales really differ
    ntp = json.loads(next((out / "next-token" / "seed0" / "eval").glob("eval_step00000004_cfg1*")).read_text())
    assert ntp["objective"]["name"] == "ntp"
    reg = json.loads(next((out / "mutor-2d-sparse" / "seed0" / "eval").glob("*step00000004_cfg1*")).read_text())
    assert reg["objective"]["name"] == "mutor-2d" and reg["objective"]["placement"] == "sparse"


def test_quick_fraction_run_trains_on_the_nested_share(quick):
    out, summary = quick
    run = out / "next-token@0.5" / "seed0"
    _, cfg, _ = inference.load_model(run)
    full = inference.load_model(out / "next-token" / "seed0")[1]
    assert cfg.data.train_fraction == 0.5 and full.data.train_fraction == 1.0
    assert cfg.data.val_fraction == full.data.val_fraction == 0.2
    part, whole = build_dataset(cfg.data, "train"), build_dataset(full.data, "train")
    assert len(part) == math.ceil(0.5 * len(whole))
    rows = {tuple(c.flatten().tolist()) + (int(y),) for c, y in zip(whole.codes, whole.labels)}
    assert all(tuple(c.flatten().tolist()) + (int(y),) in rows for c, y in zip(part.codes, part.labels))
    png = Path(summary["fraction_plot"])
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    groups = study_tables.summarise(study_tables.collect(out), [1.0, 2.0])
    pts = study_plots.fraction_points(groups, "next-token", "nll_val")
    assert [p[0] for p in pts] == [0.5, 1.0]                         # the curve has both shares
    last = study_plots.last_step(groups, "next-token")
    assert last == max(k[1] for k in groups if k[0] == "next-token@0.5" and isinstance(k[1], int))
    ends = study_plots.fraction_points(groups, "next-token", "nll_val", last)
    assert [p[0] for p in ends] == [0.5, 1.0]
    assert ends[0][1] == pytest.approx(groups[("next-token@0.5", last)]["nll_val"][0])


def test_selection_is_the_lowest_validation_nll(quick):
    """Each run's curve holds the validation NLL of its checkpoints (recomputed here from the EMA
    weights); the selected step is the lowest up to the label's horizon; its records are the table's
    val-best row."""
    out, summary = quick
    horizon = {plan.COMPUTE_MATCHED: summary["compute_matched"]["step"]}
    groups = study_tables.summarise(study_tables.collect(out), [1.0, 2.0])
    runs = [r for r in sorted(out.glob("*/seed0")) if r.parent.name != "floor"]
    assert len(runs) == 3
    for run in runs:
        curve = study_runs.read_curve(run)
        assert curve["weights"] == "ema" and len(curve["nll"]) >= 2
        for step in sorted(curve["nll"]) if run.parent.name == "next-token@0.5" else set(curve["selected"].values()):
            model, cfg, _ = inference.load_model(ckpt_lib.checkpoint_path(run, step))
            assert curve["nll"][step] == pytest.approx(study_runs.heldout_nll(model, cfg.data, "val"), rel=1e-6)
        for label, step in curve["selected"].items():
            pool = {s: v for s, v in curve["nll"].items() if s <= horizon.get(label, compare.QUICK["steps"])}
            assert step == min(pool, key=lambda s: (pool[s], s))
            assert groups[(label, study_tables.VAL_BEST)]["steps"] == {0: step}
            assert groups[(label, study_tables.VAL_BEST)]["nll_val"][0] == pytest.approx(curve["nll"][step], rel=1e-6)


def test_select_step_and_candidates():
    curve = {100: 1.30, 200: 1.20, 300: 1.25, 400: 1.10, 500: 1.10}
    assert study_runs.select_step(curve, 300) == 200                     # the minimum within the horizon
    assert study_runs.select_step(curve, 500) == 400                     # a tie goes to the earlier step
    with pytest.raises(plan.StudyError, match="no validation NLL at or before step 50"):
        study_runs.select_step(curve, 50)
    assert study_runs.candidates(200, 1000) == [200, 400, 600, 800, 1000]
    assert study_runs.candidates(200, 700) == [200, 400, 600, 700]


def test_quick_compute_matched_point_and_floor(quick):
    out, summary = quick
    cm = summary["compute_matched"]
    steps = compare.QUICK["steps"]
    assert cm["ratio"] > 0 and steps <= cm["step"] <= 2 * steps
    run = out / "next-token" / "seed0"
    cm_recs = [json.loads(p.read_text()) for p in (run / "eval").glob("*.json")]
    cm_recs = [r for r in cm_recs if r["study"]["method"] == plan.COMPUTE_MATCHED]
    want = {cm["step"], selected(run)[plan.COMPUTE_MATCHED]}
    assert {r["step"] for r in cm_recs} == want and len(cm_recs) == 2 * len(want)
    # the next-token run really went on past the equal-step point (constant lr): checkpoints up to 2x
    assert ckpt_lib.list_checkpoints(run)[-1].name == f"step_{2 * steps:08d}.pt"
    floor = [json.loads(p.read_text()) for p in (out / "floor" / "eval").glob("*.json")]
    held = [r for r in floor if r["method"] == "real held-out"]
    assert len(held) == 1 and held[0]["n"] == len(build_dataset(config_lib.load(plan.BASE_CONFIG).data, "test")) and 0 < held[0]["metrics"]["fid"] < 30
    assert held[0]["metrics"]["accuracy"] > 0.9        # real digits are recognised: the classifier works


def test_cm_ratio_fixes_the_step_and_a_decaying_lr_trains_its_own_run(quick, tmp_path):
    """Seeds added later reuse the first invocation's ratio: --cm-ratio replaces the measured one. Under
    a cosine schedule the compute-matched next-token run is a run of its own that ends (and decays) at
    that step; the next-token runs are not extended."""
    out = tmp_path / "study"
    shutil.copytree(quick[0], out)
    steps = compare.QUICK["steps"]
    summary = compare.main(["--quick", "--out", str(out), "--set", "optim.schedule=cosine", "--cm-ratio", "1.5"])
    cm = summary["compute_matched"]
    assert cm["ratio"] == 1.5 and cm["step"] == round(1.5 * steps) and cm["measured_ratio"] > 0
    run = out / plan.COMPUTE_MATCHED / "seed0"
    _, cfg, last = inference.load_model(run)
    assert cfg.optim.schedule == "cosine" and cfg.train.max_steps == last == round(1.5 * steps)
    recs = [json.loads(p.read_text()) for p in (run / "eval").glob("*.json")]
    assert {round(1.5 * steps), selected(run)[plan.COMPUTE_MATCHED]} == {r["step"] for r in recs}
    assert ckpt_lib.list_checkpoints(out / "next-token" / "seed0")[-1].name == f"step_{2 * steps:08d}.pt"  # as copied


def test_units_train_the_headline_runs_first(tmp_path):
    s = plan.Study(out=tmp_path, methods=["next-token", "mutor-2d-D4", "mutor-2d-sparse"], seeds=[100, 101],
                    steps=10, eval_steps=[10], num=10, cfg_scales=[1.0], fractions=[0.25, 0.5],
                    fraction_methods=["next-token", "mutor-2d-D4"], compute_matched="mutor-2d-D4", cm_ratio=1.5,
                    overrides=["optim.schedule=cosine"])
    got = [(u["label"], u["seed"]) for u in s.units()]
    first = [(m, seed) for seed in (100, 101) for m in ("next-token", "mutor-2d-D4")]
    fracs = [(f"{m}@{f}", seed) for seed in (100, 101) for f in ("0.5", "0.25") for m in ("next-token", "mutor-2d-D4")]
    assert got == first + fracs + [("mutor-2d-sparse", 100), ("mutor-2d-sparse", 101),
                                   (plan.COMPUTE_MATCHED, 100), (plan.COMPUTE_MATCHED, 101)]
    assert {u["steps"] for u in s.units() if u["label"] == plan.COMPUTE_MATCHED} == {15}
    frac = next(u for u in s.units() if u["label"] == "mutor-2d-D4@0.25")
    assert frac["method"] == "mutor-2d-D4" and frac["overrides"][-1] == "data.train_fraction=0.25"
    assert frac["run_dir"] == str(tmp_path / "mutor-2d-D4@0.25" / "seed100")


def test_quick_table_plot_and_leaderboard(quick, capsys):
    out, summary = quick
    md = (out / "table.md").read_text()
    for name in ("next-token", "mutor-2d-sparse", plan.COMPUTE_MATCHED, "real held-out"):
        assert f"| {name} |" in md
    from mutor2d import provenance
    head, _, first = md.splitlines()[:3]
    assert head.endswith("| commit |")                                     # every run's code, this checkout's
    assert first.split(" | ")[-1].rstrip(" |") == provenance.code_text(provenance.code_identity())
    runs = summary["provenance"]["runs"]
    assert str(out / "next-token" / "seed0") in runs and summary["provenance"]["study"]["versions"]
    assert {p["data"]["name"] for p in runs.values()} == {"digits"}
    png = Path(summary["plot"])
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = sorted(out.glob("*/seed0"))
    table = records.markdown_table(records.read_records(runs)[0])
    assert "mutor-2d-sparse" in table and "next-token" in table
    # rerun: everything is found finished, only the report is rebuilt
    again = compare.main(["--quick", "--out", str(out), "--report-only"])
    assert again["table"] == summary["table"]


@pytest.mark.parametrize("split", ["test", "val"])
def test_heldout_nll_is_the_next_token_cross_entropy(quick, split):
    out, _ = quick
    model, cfg, _ = inference.load_model(out / "mutor-2d-sparse" / "seed0")
    ds = build_dataset(cfg.data, split)
    b = collate([ds[i] for i in range(len(ds))])
    H, W = ds.grid
    pos = regular_position_ids((H, W), 1).expand(len(ds), -1, -1)
    with torch.no_grad():
        logits = model(b["body"][:, :-1], pos, b["prefix"])          # (B, 1 + N - 1, V)
    want = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["body"].reshape(-1)).item()
    assert study_runs.heldout_nll(model, cfg.data, split) == pytest.approx(want, rel=1e-5)
    assert len(ds) == {"test": 359, "val": 288}[split]              # ceil(0.2 * 1438) validation images


def test_study2_config_is_the_second_protocol(tmp_path):
    """configs/study2_digits.yaml: EMA, cosine to the end, a validation split; its documented
    settings pass the checks, and its compute-matched point needs --cm-ratio."""
    cfg = config_lib.load("study2_digits.yaml")
    assert cfg.train.ema and cfg.optim.schedule == "cosine" and cfg.optim.min_lr == 0
    assert cfg.data.val_fraction > 0 and cfg.data.train_fraction == 1
    kw = dict(out=tmp_path, methods=list(plan.METHODS), seeds=[100], steps=1500, eval_steps=[750, 1500],
              num=5000, cfg_scales=[1.0, 2.0], base="study2_digits.yaml", val_every=150, fractions=[0.25, 0.5],
              fraction_methods=["next-token", "mutor-2d-D4"], compute_matched="mutor-2d-D4")
    plan.Study(**kw, cm_ratio=2.0).check()
    with pytest.raises(plan.StudyError, match="needs --cm-ratio"):
        plan.Study(**kw).check()


def test_mean_sd_and_fmt():
    m, sd, n = study_tables.mean_sd([1.0, 2.0, 3.0])
    assert (m, n) == (2.0, 3) and sd == pytest.approx(1.0)
    assert study_tables.fmt([1.0, 2.0, 3.0]) == "2.00 ± 1.00"
    assert study_tables.fmt([5.0]) == "5.00" and study_tables.fmt([]) == "–"


def test_eval_steps_need_not_divide_the_run_only_lie_on_its_checkpoint_grid(tmp_path):
    """50,100,...,250 of a 250-step run: checkpoints every 50 steps (100 does not divide 250)."""
    s = plan.Study(out=tmp_path, methods=["next-token"], seeds=[0], steps=250,
                   eval_steps=[50, 100, 150, 200, 250], num=10, cfg_scales=[1.0])
    s.check_flags()
    assert s.every == 50 and s.units()[0]["ckpt_every"] == 25    # next-token's grain: gcd(50, 250 // 10)


@pytest.mark.parametrize("argv, needle", [
    (["--methods", "next-token,foo"], "'foo' is not a method"),
    (["--steps", "10", "--eval-steps", "3"], "--eval-steps 3"),
    (["--steps", "10", "--eval-steps", "5,12"], "--eval-steps 5,12"),
    (["--steps", "10", "--eval-steps", "0,10"], "--eval-steps 0,10"),
    (["--num", "15"], "--num 15"),
    (["--methods", "mutor-2d-D4", "--compute-matched", "mutor-2d-D4"], "needs next-token"),
    (["--set", "optim.schedule=cosine"], "needs --cm-ratio"),
    (["--cm-ratio", "0.5"], "--cm-ratio 0.5"),
    (["--val-every", "250"], "--val-every 250: needs a validation split"),
    (["--steps", "10", "--eval-steps", "10", "--val-every", "3"], "--val-every 3: expected 0 (off) or a divisor"),
    (["--fractions", "0.5,1"], "--fractions 1: expected shares in (0, 1)"),
    (["--steps", str(10 ** 12)], "--steps 1000000000000: expected 1..10000000"),
    (["--seeds", ""], "--seeds '': expected comma-separated training seeds"),
    (["--jobs", str(10 ** 12)], "--jobs 1000000000000: expected 1..256"),
    (["--cfg", "nan"], "--cfg nan: expected comma-separated finite scales >= 0"),
    (["--cfg", "1,inf"], "--cfg inf: expected comma-separated finite scales >= 0"),
    (["--cm-max", "nan"], "--cm-max nan: expected a finite number"),
    (["--cm-ratio", "inf"], "--cm-ratio inf: expected a finite number"),
    (["--fractions", "0.5", "--fraction-methods", "mutor-1d"], "--fraction-methods 'mutor-1d'"),
    (["--set", "data.val_fraction=1"], "data.val_fraction: expected a number in [0, 1)"),
])
def test_bad_settings_are_one_line_errors(tmp_path, argv, needle):
    with pytest.raises(ValueError, match=None) as e:
        compare.main(["--out", str(tmp_path / "x")] + argv)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "x").exists() or not list((tmp_path / "x").glob("*/seed*"))


def test_script_error_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "experiments/compare.py", "--out", str(tmp_path), "--methods", "bogus"],
                       cwd=ROOT, capture_output=True, text=True, timeout=limit(120))
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [r.stderr.strip().splitlines()[-1]]
    assert r.stderr.startswith("error: --methods: 'bogus'")


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return [k for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] in "ZX"
    except FileNotFoundError:
        return True


def _events(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if "event" in r]


@pytest.mark.skipif(not Path("/proc/self/task/").is_dir(), reason="finds the worker processes in /proc (Linux)")
def test_killing_the_driver_stops_its_workers_after_a_checkpoint(tmp_path):
    """With --jobs 2 the pool workers must not train on once the driver is gone: each stops at its next
    step with a checkpoint (a 'preempted' event) and starts none of the queued runs."""
    out = tmp_path / "s"
    argv = [sys.executable, "experiments/compare.py", "--out", str(out), "--methods", "next-token,mutor-2d-sparse",
            "--seeds", "0,1", "--steps", "5000", "--eval-steps", "5000", "--num", "20", "--jobs", "2",
            "--compute-matched", "", "--floor-draws", "1"]
    for kv in ("model.dim=32", "train.batch_size=8", "optim.warmup_steps=1", "train.log_every=1"):
        argv += ["--set", kv]
    driver = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    running, workers = [out / m / "seed0" for m in ("next-token", "mutor-2d-sparse")], []
    try:
        deadline = time.time() + limit(240)
        while not all((r / "log.jsonl").is_file() and '"step"' in (r / "log.jsonl").read_text() for r in running):
            assert driver.poll() is None and time.time() < deadline, "the study did not start training"
            time.sleep(0.5)
        workers += _children(driver.pid)
        assert len(workers) == 2
        driver.kill()                                            # the harshest end: no chance to clean up
        driver.wait()
        deadline = time.time() + limit(60)
        while not all(map(_gone, workers)):
            assert time.time() < deadline, "a worker kept running after its driver was killed"
            time.sleep(0.5)
    finally:
        for pid in [driver.pid] + [w for w in workers if not _gone(w)]:   # never leave a process behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for run in running:
        stop = [e for e in _events(run) if e["event"] == "preempted"]
        assert len(stop) == 1 and ckpt_lib.checkpoint_path(run, stop[0]["step"]).is_file()
        assert stop[0]["step"] < 5000
    assert not any((out / m / "seed1").exists() for m in ("next-token", "mutor-2d-sparse"))


def test_paired_differences_and_the_convergence_ratio_by_hand():
    """FID minus next-token's at the same step, paired by seed, with a t-interval; the convergence
    ratio: the first step a method's mean FID reaches next-token's final mean FID, over that step."""
    from mutor2d.evaluation.study_tables import convergence, late_table, paired_table

    def group(fids):
        acc = [1 / f for f in fids]                                    # higher accuracy where FID is lower
        return {"by_seed": {1.0: {"fid": dict(enumerate(fids)), "accuracy": dict(enumerate(acc))}}}
    groups = {("next-token", 100): group([10.0, 12.0, 11.0]), ("next-token", 200): group([8.0, 9.0, 7.0]),
              ("mutor-2d-D4", 100): group([8.5, 7.5, 8.0]), ("mutor-2d-D4", 200): group([6.0, 7.0, 6.5]),
              ("mutor-1d", 100): group([11.0, 13.0, 12.0]), ("mutor-1d", 200): group([9.0, 10.0, 8.0])}
    rows = paired_table(groups, 1.0).splitlines()[2:]
    assert rows[0].startswith("| mutor-1d | 100 | 3 | +1.00 [+1.00, +1.00] | 0 / 3 |")
    d = [8.5 - 10, 7.5 - 12, 8.0 - 11]                                 # mean -3.0, sd 1.5
    half = 4.302653 * statistics.stdev(d) / 3 ** 0.5
    assert f"| mutor-2d-D4 | 100 | 3 | -3.00 [{-3 - half:+.2f}, {-3 + half:+.2f}] | 3 / 0 |" in rows
    acc = paired_table(groups, 1.0, metric="accuracy").splitlines()           # a win: higher accuracy
    assert "class accuracy minus next-token" in acc[0]
    da = statistics.fmean([1 / 8.5 - 1 / 10, 1 / 7.5 - 1 / 12, 1 / 8.0 - 1 / 11])
    assert next(r for r in acc if r.startswith("| mutor-2d-D4 | 100 |")).startswith(f"| mutor-2d-D4 | 100 | 3 | {da:+.3f} [")
    assert next(r for r in acc if r.startswith("| mutor-2d-D4 | 100 |")).endswith("| 3 / 0 |")
    assert paired_table(groups, 1.0, metric="nll_test") == ""    # no NLL recorded: no table
    late = late_table(groups, 1.0, last=2).splitlines()                   # per seed: the mean over steps 100 and 200
    d2 = [(8.5 - 10 + 6.0 - 8.0) / 2, (7.5 - 12 + 7.0 - 9.0) / 2, (8.0 - 11 + 6.5 - 7.0) / 2]
    half2 = 4.302653 * statistics.stdev(d2) / 3 ** 0.5
    assert f"| mutor-2d-D4 | 100, 200 | 3 | -2.25 [{-2.25 - half2:+.2f}, {-2.25 + half2:+.2f}] | 3 / 0 |" in late
    last = [r.split(" | ")[3] for r in late_table(groups, 1.0, last=1).splitlines()[2:]]
    at_200 = [r.split(" | ")[3] for r in paired_table(groups, 1.0).splitlines()[2:] if " | 200 | " in r]
    assert sorted(last) == sorted(at_200)                                   # the last step alone: the paired table's
    found = convergence(groups, 1.0, "mutor-2d-D4")
    assert found["reference_final_fid"] == 8.0 and found["first_step"] == 100 and found["ratio"] == 0.5
    assert convergence(groups, 1.0, "mutor-1d")["first_step"] is None          # 9.0 at the end: never


def test_an_out_that_is_empty_or_a_file_is_one_line(tmp_path):
    (tmp_path / "f").write_text("x")
    for out, needle in (("", "--out '': expected a study folder"), (str(tmp_path / "f"), f"--out '{tmp_path / 'f'}'")):
        with pytest.raises(ValueError) as e:                 # was: a study in the current folder; Errno 20
            compare.main(["--out", out])
        assert needle in str(e.value) and "\n" not in str(e.value)
    assert (tmp_path / "f").read_text() == "x"
