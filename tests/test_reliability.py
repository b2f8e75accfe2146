"""Faults a cluster run meets: foreign checkpoint files, stop signals, non-finite updates, unreadable
checkpoints on resume. Each test is one row of docs/RELIABILITY.md."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from mutor2d import checkpoint as ckpt_lib
from mutor2d.checkpoint import export, inference
from mutor2d.config import ConfigError
from mutor2d.engine.entry import Diverged
from mutor2d.engine.runlog import read_log
from mutor2d.engine.loop import train
from mutor2d.image.run import TrainModule
from mutor2d.checkpoint.resume import rotate

from test_training import PY, ROOT, env, losses, losses_so_far, tiny, write_yaml
from timeouts import limit

pytestmark = pytest.mark.usefixtures("one_thread")


class Payload:
    """Unpickling this runs code: it creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def payload_file(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {}, "config": {}, "step": 1, "x": Payload(marker)}, path)
    return path


def one_line_error(cmd: list[str]) -> str:
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=limit(120))
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    return r.stderr.strip().splitlines()[-1]


def test_a_pickle_payload_never_runs_through_any_checkpoint_loader(tmp_path):
    marker = tmp_path / "PWNED"
    bad = payload_file(tmp_path / "run" / "checkpoints" / "step_00000001.pt", marker)
    with pytest.raises(ckpt_lib.CheckpointError, match="refused: it is not a plain weights file") as e:
        ckpt_lib.load(bad)
    assert "\n" not in str(e.value) and str(bad) in str(e.value)
    for call in (lambda: inference.load_model(bad), lambda: inference.read_meta(tmp_path / "run"),
                 lambda: train(tiny(), tmp_path / "r1", resume=str(bad)),
                 lambda: train(tiny(), tmp_path / "run", resume="auto"),
                 lambda: train(tiny(f"train.init_from={bad}"), tmp_path / "r2")):
        with pytest.raises((ValueError, FileNotFoundError)):
            call()
    bad = payload_file(tmp_path / "evil.pt", marker)
    assert "refused: it is not a plain weights file" in one_line_error([PY, "train.py", "--resume", str(bad)])
    assert "error:" in one_line_error([PY, "sample.py", "--ckpt", str(bad)])
    assert not marker.exists()


def test_legacy_numpy_rng_state_loads_but_object_arrays_do_not(tmp_path):
    ok = {"model": {}, "config": {}, "rng": [{"numpy": ("MT19937", np.arange(624, dtype=np.uint32), 1, 0, 0.0)}]}
    torch.save(ok, tmp_path / "old.pt")
    assert ckpt_lib.load(tmp_path / "old.pt")["rng"][0]["numpy"][1].dtype == np.uint32
    torch.save({"model": {}, "config": {}, "x": np.array([object()], dtype=object)}, tmp_path / "obj.pt")
    with pytest.raises(ckpt_lib.CheckpointError, match="refused"):
        ckpt_lib.load(tmp_path / "obj.pt")


def test_safetensors_export_samples_like_the_checkpoint(tmp_path):
    train(tiny("train.max_steps=1", "train.ema=true", "train.sample_every=100"), tmp_path / "r")
    out = export.export_safetensors(tmp_path / "r", tmp_path / "w.safetensors")
    a, cfg_a, step_a = inference.load_model(tmp_path / "r")
    b, cfg_b, step_b = inference.load_model(out)
    assert (cfg_a, step_a) == (cfg_b, step_b)
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    assert inference.read_meta(out)["grid"] == [8, 8]


def test_sigterm_saves_a_checkpoint_exits_75_and_the_run_resumes_exactly(tmp_path):
    """SIGTERM to the whole process group, as launchers and schedulers send it: the data-loader
    worker ignores it, the trainer finishes its step, saves, logs the event and exits 75."""
    cfg = write_yaml(tmp_path / "t.yaml", "optim.schedule=constant", "train.max_steps=100000",
                     "train.ckpt_every=0", "train.sample_every=0", "data.num_workers=1")
    run = tmp_path / "run"
    err = open(tmp_path / "stderr.txt", "w+")
    proc = subprocess.Popen([PY, "train.py", "--config", str(cfg), "--out", str(run)], cwd=ROOT,
                            env=env(torch.get_num_threads()), stdout=subprocess.DEVNULL, stderr=err,
                            start_new_session=True)
    try:
        end = time.time() + limit(120)
        while time.time() < end and len(losses_so_far(run)) < 3 and proc.poll() is None:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=limit(60))
    finally:
        proc.kill()
        err.close()
    assert rc == 75, (tmp_path / "stderr.txt").read_text()[-2000:]
    k = ckpt_lib.load(ckpt_lib.latest_valid(run))["step"]
    assert k >= 3 and max(losses_so_far(run)) == k            # nothing trained is lost
    last = json.loads((run / "log.jsonl").read_text().splitlines()[-1])
    assert last == {"event": "preempted", "step": k, "signal": int(signal.SIGTERM)}
    train(tiny("optim.schedule=constant", f"train.max_steps={k + 2}", "train.ckpt_every=0",
               "train.sample_every=0"), run, resume="auto")
    train(tiny("optim.schedule=constant", f"train.max_steps={k + 2}", "train.ckpt_every=0",
               "train.sample_every=0"), tmp_path / "straight")
    assert losses(run) == losses(tmp_path / "straight")


def _nan_at(monkeypatch, steps: set[int]):
    """Make the loss NaN on the given (1-based) calls of the training module."""
    calls = {"n": 0}
    forward = TrainModule.forward

    def poisoned(self, *a, **kw):
        res = forward(self, *a, **kw)
        calls["n"] += 1
        if calls["n"] in steps:
            res.loss = res.loss * float("nan")
        return res
    monkeypatch.setattr(TrainModule, "forward", poisoned)


def test_nonfinite_updates_are_skipped_counted_and_never_checkpointed(tmp_path, monkeypatch):
    _nan_at(monkeypatch, {2, 3})
    run = tmp_path / "r"
    train(tiny("train.max_steps=5", "train.ckpt_every=1", "train.sample_every=100"), run)
    log = read_log(run)
    assert [r.get("skipped_nonfinite", 0) for r in log] == [0, 1, 1, 0, 0]
    assert log[1].get("loss") is None and "NaN" not in (run / "log.jsonl").read_text()
    assert [ckpt_lib.load(p)["step"] for p in ckpt_lib.list_checkpoints(run)] == [1, 4, 5]
    state = ckpt_lib.load(ckpt_lib.checkpoint_path(run, 4))["optimizer"]["state"]
    assert int(next(iter(state.values()))["step"]) == 2       # updates 1 and 4 were applied


def test_a_diverged_run_stops_and_keeps_its_last_good_checkpoint(tmp_path, monkeypatch):
    _nan_at(monkeypatch, set(range(3, 100)))
    run = tmp_path / "r"
    with pytest.raises(Diverged, match="3 updates in a row had a non-finite") as e:
        train(tiny("train.max_steps=50", "train.ckpt_every=1", "train.max_nonfinite=2"), run)
    assert "\n" not in str(e.value) and f"the last good checkpoint is {ckpt_lib.checkpoint_path(run, 1)}" in str(e.value)
    # step 2's weights never made a healthy update: set aside, so that --resume auto takes step 1
    assert [ckpt_lib.load(p)["step"] for p in ckpt_lib.list_checkpoints(run)] == [1]
    assert (run / "checkpoints" / "step_00000002.pt.diverged").is_file()
    for line in (run / "log.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"log.jsonl holds {c}"))


def test_resume_auto_names_what_it_skips_and_never_starts_over(tmp_path, capsys):
    run = tmp_path / "r"
    base = ["train.ckpt_every=1", "train.sample_every=100"]
    train(tiny(*base, "train.max_steps=2"), run)
    lines_before = len((run / "log.jsonl").read_text().splitlines())
    newest = ckpt_lib.checkpoint_path(run, 2)
    newest.write_bytes(newest.read_bytes()[:500])
    (run / "checkpoints" / ".step_00000003.pt.x1.tmp").write_bytes(b"half a save")
    capsys.readouterr()
    train(tiny(*base, "train.max_steps=3"), run, resume="auto")
    out, err = capsys.readouterr()
    assert "resuming from step 1" in out and "step_00000002.pt" in err and ".tmp" in err
    assert (run / "checkpoints" / "step_00000002.pt.unreadable").exists()
    assert not list((run / "checkpoints").glob("*.tmp"))
    assert [r["step"] for r in read_log(run)] == [1, 2, 3]
    assert len((run / "log.jsonl").read_text().splitlines()) > lines_before    # appended, not rewritten
    for p in ckpt_lib.list_checkpoints(run):
        p.write_bytes(b"garbage")
    with pytest.raises(ConfigError, match="none of the 3 checkpoints .* is readable"):
        train(tiny(*base, "train.max_steps=4"), run, resume="auto")


def test_a_longer_step_budget_rebuilds_the_cosine_schedule(tmp_path):
    run = tmp_path / "r"
    over = ["optim.schedule=cosine", "optim.warmup_steps=2", "train.sample_every=100", "train.ckpt_every=2"]
    train(tiny(*over, "train.max_steps=2"), run)
    train(tiny(*over, "train.max_steps=6"), run, resume="auto")
    lr = {r["step"]: r["lr"] for r in read_log(run)}
    assert lr[4] == pytest.approx(1.5e-3) and lr[6] == pytest.approx(0.0, abs=1e-12)   # t_initial = 6 - 2


def test_rotation_keeps_newest_readable_and_sets_corrupt_files_aside(tmp_path):
    run = tmp_path / "r"
    train(tiny("train.max_steps=3", "train.ckpt_every=1", "train.sample_every=100"), run)
    ckpt_lib.checkpoint_path(run, 99).write_bytes(b"not a checkpoint")
    rotate(run, keep=2)
    assert [p.name for p in ckpt_lib.list_checkpoints(run)] == ["step_00000002.pt", "step_00000003.pt"]
    assert (run / "checkpoints" / "step_00000099.pt.unreadable").exists()


def test_resume_is_exact_with_a_vq_tokenizer(tmp_path):
    """Building the VQ tokenizer (for sample grids) draws random numbers at its init: it must not
    move the training streams, or a resumed run drifts from the uninterrupted one."""
    from dataclasses import asdict

    from test_vq import small_model
    vq, model = tmp_path / "vq.pt", small_model(seed=2)          # an 8 px VQ: 4x4 codes of digits
    torch.save({"model": model.state_dict(), "config": {"task": "vq", "model": asdict(model.config)}}, vq)
    over = [f"data.tokenizer={vq}", "train.ckpt_every=2", "train.sample_every=100", "train.max_steps=4"]
    train(tiny(*over), tmp_path / "a")
    train(tiny(*over[:-1], "train.max_steps=2"), tmp_path / "b")
    train(tiny(*over), tmp_path / "b", resume="auto")
    assert losses(tmp_path / "a") == losses(tmp_path / "b")


@pytest.mark.parametrize("cuda", [False, True])
def test_fsdp_is_refused_with_one_line_on_any_device(tmp_path, monkeypatch, cuda):
    """accelerate's FSDP plugin (which would wrap the model its own way) is refused before anything
    is built, on GPUs too (CUDA faked: the check comes first); train.sharding=fsdp is the way."""
    from mutor2d.engine.setup import make_accelerator
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    with pytest.raises(ConfigError, match=r"^accelerate launch --use_fsdp: accelerate's FSDP plugin is not "
                                          r"supported.*train.sharding=fsdp") as e:
        make_accelerator(tiny(), tmp_path)
    assert "\n" not in str(e.value)


def test_layout_stream_from_another_device_kind_starts_fresh(tmp_path):
    """A CPU run's register-layout RNG state cannot seed a GPU generator (another state size): the
    stream restarts instead of crashing the resume (faked here with a state of the wrong size)."""
    from mutor2d.engine.rng import rng_state, set_rng_state
    gen = torch.Generator().manual_seed(3)
    state = rng_state(gen, torch.device("cpu"))
    state["layout"] = torch.zeros(16, dtype=torch.uint8)           # a CUDA generator's state size
    fresh = torch.Generator().manual_seed(3)
    assert set_rng_state(state, fresh, torch.device("cpu")) is False
    assert torch.equal(fresh.get_state(), torch.Generator().manual_seed(3).get_state())
    assert set_rng_state(rng_state(gen, torch.device("cpu")), fresh, torch.device("cpu")) is True


@pytest.mark.parametrize("suffix", [".pt", ".dcp"])
def test_the_checkpoint_a_run_resumed_from_is_its_last_good_one_pt_or_sharded(tmp_path, suffix):
    """The checkpoint a run resumed from, a file or a sharded folder, becomes the last good one after
    the first healthy update, so rotation never deletes it (a sharded one was looked up as step_N.pt,
    not found, and left unprotected: keep_ckpts=1 could delete the only checkpoint before a blow-up)."""
    from types import SimpleNamespace

    from mutor2d.engine.hooks import CheckpointHook
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    resumed = folder / f"step_00000004{suffix}"
    resumed.mkdir() if suffix == ".dcp" else resumed.write_bytes(b"")
    run = SimpleNamespace(run_dir=tmp_path / "run", start=4,
                          cfg=SimpleNamespace(train=SimpleNamespace(keep_ckpts=1, keep_every=0)))
    kept = CheckpointHook(run).kept
    kept.observe(healthy=True)
    assert kept.good == resumed and str(resumed) in kept.kept_message()
