"""The rehearsal at CI size: experiments/rehearse.py --quick --sharding fsdp runs the user's commands
(extract_codes.py, train.py with the shipped GPT-B MuToR-2D config at reduced width sharded with FSDP2,
a SIGTERM and --resume auto, sample.py --npz, eval/fid.py, eval/leaderboard.py) over 2 CPU processes;
each stage's output is checked here again, from the files it left. (The DDP path over 2 processes is
tested in test_training.py and test_fsdp.py.)"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mutor2d.engine.runlog import read_log
from mutor2d.tokenizer.codes import open_store
from timeouts import limit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))
import rehearse  # noqa: E402

QUICK = rehearse.SIZES["quick"]


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """(summary dict, workdir) of one quick rehearsal."""
    work = tmp_path_factory.mktemp("rehearsal") / "w"
    out = work.parent / "summary.json"
    r = subprocess.run([sys.executable, str(ROOT / "experiments/rehearse.py"), "--quick", "--sharding", "fsdp",
                        "--workdir", str(work), "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=limit(900))
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    timings = [line for line in r.stdout.splitlines() if line.startswith("[rehearse] ") and " s  " in line]
    assert len(timings) == len(rehearse.STAGES), r.stdout            # one timing line per stage
    summary = json.loads(r.stdout.splitlines()[-1])
    assert summary == json.loads(out.read_text())
    return summary, work


def test_codes_store_is_complete_with_16x16_grids(rehearsal):
    _, work = rehearsal
    store = open_store(work / "codes")
    assert store.header["complete"] and store.header["grid"] == [16, 16]
    assert store.header["num_shards"] == 2                          # one per process
    assert store.codes.shape == (2 * QUICK.per_class, 2 * QUICK.crops, 16, 16)
    assert sorted(np.bincount(store.labels).tolist()) == [QUICK.per_class] * 2


def test_sigterm_checkpoints_and_exits_75(rehearsal):
    summary, work = rehearsal
    stop = summary["stages"]["train+stop"]
    codes = stop["process_rc"]                                       # both training processes
    assert sorted(codes) == ["0", "1"] and 75 in codes.values()
    assert set(codes.values()) <= {75, *rehearse.LAUNCHER_KILLED}   # see experiments/rehearse.py LAUNCHER_KILLED
    assert QUICK.stop_at <= stop["step"] < QUICK.max_steps
    assert "stopped by signal" in (work / "logs/train.log").read_text()
    assert rehearse.checkpoint_of(work / "run", stop["step"], "fsdp").is_dir()       # sharded


def test_resumed_log_continues(rehearsal):
    summary, work = rehearsal
    stopped = summary["stages"]["train+stop"]["step"]
    raw = [json.loads(line) for line in (work / "run/log.jsonl").read_text().splitlines()]
    marks = [r for r in raw if r.get("event") == "resume"]
    assert marks == [{"event": "resume", "step": stopped}]
    assert [r["step"] for r in read_log(work / "run")] == list(range(1, QUICK.max_steps + 1))
    assert all(np.isfinite(r["loss"]) for r in read_log(work / "run"))
    assert rehearse.checkpoint_of(work / "run", QUICK.max_steps, "fsdp").is_dir()
    assert f"resuming from step {stopped}" in (work / "logs/resume.log").read_text()


def test_npz_is_class_balanced(rehearsal):
    _, work = rehearsal
    with np.load(work / "run/samples.npz", allow_pickle=False) as z:
        images, labels = z["images"], z["labels"]
    assert images.shape == (QUICK.num_samples, 256, 256, 3) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [QUICK.num_samples // 2] * 2


def test_fid_record_and_leaderboard(rehearsal):
    summary, work = rehearsal
    records = list((work / "run/eval").glob("*.json"))
    assert len(records) == 1
    rec = json.loads(records[0].read_text())
    assert np.isfinite(rec["metrics"]["fid"]) and rec["n"] == QUICK.num_samples
    assert rec["evaluator"]["feature_extractor"] == "inception-v3-compat" and rec["evaluator"]["weights_sha256"]
    assert "ref_imagefolder256" in json.dumps(rec["reference"])
    table = (work / "logs/board.log").read_text()
    assert "mutor-2d" in table and "ref_imagefolder256" in table
    assert summary["stages"]["board"]["rows"] == 1


@pytest.mark.parametrize("flags, needle", [
    (["--workdir", "FILE"], "--workdir 'FILE': expected a folder"),             # was: NotADirectoryError
    (["--max-steps", "0"], "--max-steps 0: expected 1..10000000"),              # was: taken as not given
    (["--max-steps", str(10 ** 12)], "--max-steps 1000000000000: expected 1..10000000"),
    (["--stop-at", "-1"], "--stop-at -1: expected a step in 1.."),              # was: a launch never stopped
    (["--reuse", ""], "--reuse '': expected a folder"),                         # was: taken as not given
    (["--json", "."], "--json '.': expected the path of a .json file"),          # was: IsADirectoryError at the end
    (["--set", "foo"], "--set 'foo': expected section.key=value"),              # was: train.py's error, minutes in
])
def test_rehearsal_flags_are_checked_before_anything_is_made(tmp_path, monkeypatch, capsys, flags, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("x")
    with pytest.raises(SystemExit) as e:
        rehearse.parse_args(["--quick", "--workdir", "w", *flags])
    assert e.value.code == 2 and needle in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]
