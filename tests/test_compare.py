"""The digits study (mutor2d.evaluation.study, command line eval/compare.py): --quick runs the whole
pipeline (train, sample, score, compute-matched point, floor, table, plot) and leaves records the
leaderboard reads; the test NLL is the next-token cross-entropy; bad settings are one-line errors."""
import importlib.util
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mutor2d import checkpoint as ckpt_lib
from mutor2d.data import build_dataset, collate
from mutor2d.evaluation import records, study
from mutor2d.registers import regular_position_ids

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


compare = _load("compare_driver", ROOT / "eval" / "compare.py")   # the command line: --quick sizes, main


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


def test_quick_writes_a_record_per_run_step_and_cfg(quick):
    out, summary = quick
    q = compare.QUICK
    methods, steps = q["methods"].split(","), [int(s) for s in q["eval_steps"].split(",")]
    scales = [float(s) for s in q["cfg"].split(",")]
    for m in methods:
        recs = [json.loads(p.read_text()) for p in (out / m / "seed0" / "eval").glob("*.json")]
        mine = [r for r in recs if r["study"]["method"] == m]
        assert sorted((r["step"], r["sampling"]["cfg_scale"]) for r in mine) == \
            sorted((s, c) for s in steps for c in scales)
        for r in mine:
            assert r["method"] == m and r["n"] == q["num"] and r["reference"] == "digits:train"
            assert r["evaluator"]["feature_extractor"] == "mutor2d-digits"
            assert {"fid", "accuracy", "nll_test", "precision"} <= set(r["metrics"])
            assert all(math.isfinite(v) for v in r["metrics"].values())
            labels = np.load(r["samples"])["labels"]
            assert np.bincount(labels, minlength=10).tolist() == [q["num"] // 10] * 10   # class-balanced
    # the two objectives really differ, the cfg scales really differ
    ntp = json.loads(next((out / "next-token" / "seed0" / "eval").glob("*step00000004_cfg1*")).read_text())
    assert ntp["objective"]["name"] == "ntp"
    reg = json.loads(next((out / "mutor-2d-sparse" / "seed0" / "eval").glob("*step00000004_cfg1*")).read_text())
    assert reg["objective"]["name"] == "mutor-2d" and reg["objective"]["placement"] == "sparse"


def test_quick_compute_matched_point_and_floor(quick):
    out, summary = quick
    cm = summary["compute_matched"]
    steps = compare.QUICK["steps"]
    assert cm["ratio"] > 0 and steps <= cm["step"] <= 2 * steps
    cm_recs = [json.loads(p.read_text()) for p in (out / "next-token" / "seed0" / "eval").glob("*.json")]
    cm_recs = [r for r in cm_recs if r["study"]["method"] == study.CM]
    assert {r["step"] for r in cm_recs} == {cm["step"]} and len(cm_recs) == 2
    # the next-token run really went on past the equal-step point (constant lr): checkpoints up to 2x
    assert ckpt_lib.list_checkpoints(out / "next-token" / "seed0")[-1].name == f"step_{2 * steps:08d}.pt"
    floor = [json.loads(p.read_text()) for p in (out / "floor" / "eval").glob("*.json")]
    held = [r for r in floor if r["method"] == "real held-out"]
    assert len(held) == 1 and held[0]["n"] == len(build_dataset(study.config_lib.load(study.BASE).data, "test")) and 0 < held[0]["metrics"]["fid"] < 30
    assert held[0]["metrics"]["accuracy"] > 0.9        # real digits are recognised: the classifier works


def test_cm_ratio_fixes_the_compute_matched_step(quick, tmp_path):
    """Seeds added later reuse the first invocation's ratio: --cm-ratio replaces the measured one."""
    out = tmp_path / "study"
    shutil.copytree(quick[0], out)
    steps = compare.QUICK["steps"]
    summary = compare.main(["--quick", "--out", str(out), "--cm-ratio", "1.5"])
    cm = summary["compute_matched"]
    assert cm["ratio"] == 1.5 and cm["step"] == round(1.5 * steps) and cm["measured_ratio"] > 0
    recs = [json.loads(p.read_text()) for p in (out / "next-token" / "seed0" / "eval").glob("*.json")]
    assert sorted({r["step"] for r in recs if r["study"]["method"] == study.CM}) == \
        sorted({quick[1]["compute_matched"]["step"], round(1.5 * steps)})


def test_quick_table_plot_and_leaderboard(quick, capsys):
    out, summary = quick
    md = (out / "table.md").read_text()
    for name in ("next-token", "mutor-2d-sparse", study.CM, "real held-out"):
        assert f"| {name} |" in md
    png = Path(summary["plot"])
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = sorted(out.glob("*/seed0"))
    table = records.markdown_table(records.read_records(runs)[0])
    assert "mutor-2d-sparse" in table and "next-token" in table
    # rerun: everything is found finished, only the report is rebuilt
    again = compare.main(["--quick", "--out", str(out), "--report-only"])
    assert again["table"] == summary["table"]


def test_test_nll_is_the_next_token_cross_entropy(quick):
    out, _ = quick
    model, cfg, _ = ckpt_lib.load_model(out / "mutor-2d-sparse" / "seed0")
    ds = build_dataset(cfg.data, "test")
    b = collate([ds[i] for i in range(len(ds))])
    H, W = ds.grid
    pos = regular_position_ids((H, W), 1).expand(len(ds), -1, -1)
    with torch.no_grad():
        logits = model(b["body"][:, :-1], pos, b["prefix"])          # (B, 1 + N - 1, V)
    want = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["body"].reshape(-1)).item()
    assert study.test_nll(model, cfg.data) == pytest.approx(want, rel=1e-5)


def test_mean_sd_and_fmt():
    m, sd, n = study.mean_sd([1.0, 2.0, 3.0])
    assert (m, n) == (2.0, 3) and sd == pytest.approx(1.0)
    assert study.fmt([1.0, 2.0, 3.0]) == "2.00 ± 1.00"
    assert study.fmt([5.0]) == "5.00" and study.fmt([]) == "–"


@pytest.mark.parametrize("argv, needle", [
    (["--methods", "next-token,foo"], "'foo' is not a method"),
    (["--steps", "10", "--eval-steps", "3"], "--eval-steps 3"),
    (["--num", "15"], "--num 15"),
    (["--methods", "mutor-2d-D4", "--compute-matched", "mutor-2d-D4"], "needs next-token"),
    (["--set", "optim.schedule=cosine"], "optim.schedule=constant"),
    (["--cm-ratio", "0.5"], "--cm-ratio 0.5"),
])
def test_bad_settings_are_one_line_errors(tmp_path, argv, needle):
    with pytest.raises(ValueError, match=None) as e:
        compare.main(["--out", str(tmp_path / "x")] + argv)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "x").exists() or not list((tmp_path / "x").glob("*/seed*"))


def test_script_error_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "eval/compare.py", "--out", str(tmp_path), "--methods", "bogus"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [r.stderr.strip().splitlines()[-1]]
    assert r.stderr.startswith("error: --methods: 'bogus'")
