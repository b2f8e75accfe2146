"""Faults of the second sweep: two runs on one folder, bit rot in checkpoints, finite blow-ups, optimizer
overrides on resume, disk full, oversized flags, file modes. Each test is one row of docs/RELIABILITY.md."""
import errno
import importlib.util
import json
import os
import signal
import socket
import subprocess
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mutor2d import checkpoint as ckpt_lib
from mutor2d.checkpoint.__main__ import main as checkpoint_main
from mutor2d import io
from mutor2d.sampling import images as generation
from mutor2d.config import ConfigError
from mutor2d.engine.entry import Diverged
from mutor2d.engine.runlog import read_log
from mutor2d.engine.loop import train
from mutor2d.image.run import TrainModule
from mutor2d.engine.lock import LOCK_NAME, RunLocked, acquire, run_lock

from test_training import PY, ROOT, env, losses_so_far, tiny, write_yaml
from timeouts import limit

pytestmark = pytest.mark.usefixtures("one_thread")

QUIET = ["train.sample_every=100", "train.log_every=1"]


def script(name: str):
    """The ``main`` of a command-line script of the repository, imported in this process."""
    path = ROOT / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"cli_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def exit_line(main, argv) -> tuple[object, str]:
    """(exit code, its one-line message on stderr) of a script's ``main(argv)``."""
    import contextlib
    import io as text_io
    err = text_io.StringIO()
    with pytest.raises(SystemExit) as e, contextlib.redirect_stderr(err):
        main(argv)
    lines = err.getvalue().strip().splitlines()
    return e.value.code, lines[-1] if lines else str(e.value.code)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny digits run with checkpoints at steps 1 and 2."""
    run = tmp_path_factory.mktemp("trained") / "r"
    train(tiny("train.max_steps=2", "train.ckpt_every=1", *QUIET), run)
    return run


# ----------------------------------------------------------------------------- 1. run lock

def test_a_second_run_on_a_held_folder_exits_2_and_the_first_finishes_unharmed(tmp_path):
    cfg = write_yaml(tmp_path / "t.yaml", "optim.schedule=constant", "train.max_steps=100000",
                     "train.ckpt_every=2", "train.sample_every=0")
    run = tmp_path / "run"
    cmd = [PY, "train.py", "--config", str(cfg), "--out", str(run), "--resume", "auto"]
    log = open(tmp_path / "first.err", "w+")
    first = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=log)
    try:
        end = time.time() + limit(120)
        while time.time() < end and not losses_so_far(run) and first.poll() is None:
            time.sleep(0.05)
        config_before = (run / "config.yaml").read_text()
        t0 = time.time()
        second = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=limit(60))
        took = time.time() - t0
        print(f"second run refused after {took:.1f} s")
        assert first.poll() is None, "the first run ended before the second one was refused"
        first.send_signal(signal.SIGTERM)
        rc = first.wait(timeout=limit(60))
    finally:
        first.kill()
        log.close()
    err = (tmp_path / "first.err").read_text()
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-2000:]
    assert second.stderr.strip().splitlines()[-1].startswith(
        f"error: run folder {str(run)!r} is in use by pid {first.pid} on host {socket.gethostname()}")
    assert took < 30, took
    assert rc == 75 and "took over" not in err and "removed" not in err, err[-2000:]
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "event" not in r]
    assert steps == list(range(1, len(steps) + 1))                       # logged once, by one run
    assert (run / "config.yaml").read_text() == config_before and not (run / LOCK_NAME).exists()
    assert ckpt_lib.load(ckpt_lib.latest_valid(run))["step"] == steps[-1]


def test_a_lock_left_by_a_dead_process_is_taken_over_with_a_notice(tmp_path, capsys):
    dead = subprocess.Popen([PY, "-c", "pass"])
    dead.wait()
    run = tmp_path / "r"
    run.mkdir()
    (run / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                             "started": "2026-01-01T00:00:00", "ticks": 1}))
    with run_lock(run) as me:                            # what train() holds while it runs
        assert json.loads((run / LOCK_NAME).read_text())["pid"] == me.pid == os.getpid()
    err = capsys.readouterr().err
    assert f"took over {run / LOCK_NAME}: its owner, pid {dead.pid} on host" in err
    assert not (run / LOCK_NAME).exists()


def test_a_second_study_driver_waits_for_the_process_scoring_a_run_then_takes_its_turn(tmp_path, capsys):
    """Two compare.py drivers over one seed: the second waits (one line) while a live process holds the
    run's samples lock, instead of making the same sample shards beside it; it takes the lock once freed."""
    from mutor2d.evaluation.study_runs import hold_samples
    from mutor2d.engine.lock import release
    folder = tmp_path / "r" / "samples"
    holder = subprocess.Popen([PY, "-c", "import sys, time; from mutor2d.engine.lock import acquire, release; "
                               f"me = acquire({str(folder)!r}); print('held', flush=True); time.sleep(1.5); "
                               f"release({str(folder)!r}, me)"], cwd=ROOT, env=env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        me = hold_samples(folder, poll_s=0.1)
        assert time.monotonic() - t0 > 0.5 and holder.wait(timeout=limit(30)) == 0
    finally:
        holder.kill()
    assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"{folder.parent}: scored by pid {holder.pid} on host "
                                               f"{socket.gethostname()} (started ") and out[0].endswith("now; waiting for it")
    release(folder, me)
    assert hold_samples(folder, poll_s=0.1) and capsys.readouterr().out == ""      # free: taken at once, nothing said


def test_a_lock_of_another_host_or_a_live_process_is_never_taken(tmp_path, monkeypatch):
    run = tmp_path / "r"
    run.mkdir()
    other = {"pid": os.getpid(), "host": "elsewhere.example", "started": "x", "ticks": None}
    (run / LOCK_NAME).write_text(json.dumps(other))
    with pytest.raises(RunLocked, match=r"in use by pid \d+ on host elsewhere.example .*if that run is dead, "
                                        r"delete .*run.lock\)$"):
        acquire(run)
    (run / LOCK_NAME).write_text(json.dumps({**other, "host": socket.gethostname()}))
    with pytest.raises(RunLocked):
        train(tiny("train.max_steps=1", *QUIET), run, resume="auto")
    assert not (run / "checkpoints").exists()
    monkeypatch.setenv("RANK", "1")                      # a launcher's other processes take no lock
    with run_lock(tmp_path / "worker") as me:
        assert me is None and not (tmp_path / "worker").exists()


# ----------------------------------------------------------------------------- 2. verified checkpoints

def flip_a_tensor_byte(path: Path) -> None:
    """Flip one byte in the middle of the largest tensor record of a torch zip file."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_len, extra_len = (int.from_bytes(data[info.header_offset + k: info.header_offset + k + 2], "little")
                           for k in (26, 28))
    at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_flipped_byte_in_tensor_data_is_caught_wherever_a_checkpoint_is_read(tmp_path, trained, capsys):
    import shutil
    run = tmp_path / "r"
    shutil.copytree(trained, run)
    bad = ckpt_lib.checkpoint_path(run, 2)
    flip_a_tensor_byte(bad)
    torch.load(bad, weights_only=True)                                 # torch itself does not notice
    with pytest.raises(ckpt_lib.CheckpointError, match="does not match the checksum"):
        ckpt_lib.load(bad)
    code, line = exit_line(script("sample"), ["--ckpt", str(bad), "--device", "cpu", "--out", str(tmp_path / "g.png")])
    assert line.startswith("error: ") and str(bad) in line and "checksum" in line
    code, line = exit_line(checkpoint_main, ["export", str(bad), str(tmp_path / "w.safetensors")])
    assert line.startswith("error: ") and "checksum" in line and not (tmp_path / "w.safetensors").exists()
    with pytest.raises(ConfigError, match="train.init_from=.*checksum"):
        train(tiny(f"train.init_from={bad}", "train.max_steps=1", *QUIET), tmp_path / "fresh")
    capsys.readouterr()
    train(tiny("train.max_steps=3", "train.ckpt_every=1", *QUIET), run, resume="auto")
    out, err = capsys.readouterr()
    assert "resuming from step 1" in out and f"skipped {bad}" in err and "checksum" in err
    assert (run / "checkpoints" / "step_00000002.pt.unreadable").exists()


def test_train_py_resumes_and_takes_its_config_from_one_checkpoint_chosen_once(tmp_path, capsys, monkeypatch):
    """One resume decision: train.py's config and the engine's weights come from the same checkpoint, the
    newest whose full read passes its checksum; a damaged newest is set aside in one line. Here the damaged
    step 3 was written with train.max_steps 3, the step 2 before it with 2: the note names 2 -> 4."""
    from mutor2d.checkpoint import resume as resume_lib
    cli = script("train")
    cfg, run = write_yaml(tmp_path / "t.yaml", "train.ckpt_every=1", *QUIET), tmp_path / "run"
    cli(["--config", str(cfg), "--out", str(run), "--max-steps", "2"])
    cli(["--config", str(cfg), "--out", str(run), "--resume", "auto", "--max-steps", "3"])
    flip_a_tensor_byte(ckpt_lib.checkpoint_path(run, 3))
    from mutor2d.engine import setup
    calls = []
    monkeypatch.setattr(setup, "find_resume", lambda *a: calls.append(a) or resume_lib.find_resume(*a))
    monkeypatch.setattr(ckpt_lib, "latest_valid", lambda *a: pytest.fail("a second resume rule ran"))
    capsys.readouterr()
    cli(["--config", str(cfg), "--out", str(run), "--resume", "auto", "--max-steps", "4"])
    out, err = capsys.readouterr()
    assert len(calls) == 1
    assert "note: train.max_steps changed on resume: 2 -> 4" in out and "resuming from step 2" in out
    skipped = [line for line in err.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and "step_00000003.pt" in skipped[0] and "checksum" in skipped[0]
    assert (run / "checkpoints" / "step_00000003.pt.unreadable").exists()
    assert sorted(losses_so_far(run)) == [1, 2, 3, 4]
    assert ckpt_lib.load(ckpt_lib.checkpoint_path(run, 4))["config"]["train"]["max_steps"] == 4


def test_vq_checkpoints_of_train_vq_are_verified(tmp_path):
    from mutor2d.tokenizer.config import VQError
    from mutor2d.tokenizer.vq import load_vq
    from mutor2d.vq.config import load_config
    from mutor2d.vq.run import train as train_vq
    train_vq(load_config("vq_digits", ["model.preset=tiny", "data.eval_images=4", "train.batch_size=4",
                                       "train.max_steps=1", "train.eval_every=0", f"train.out_dir={tmp_path / 'vq'}"]))
    path = ckpt_lib.checkpoint_path(tmp_path / "vq", 1)
    load_vq(path)
    flip_a_tensor_byte(path)
    with pytest.raises(VQError, match="checksum"):
        load_vq(path)


def test_checkpoints_without_a_checksum_still_load_with_one_notice(tmp_path, trained, capsys):
    old = ckpt_lib.load(ckpt_lib.checkpoint_path(trained, 1))
    del old[io.CHECKSUM_KEY]
    torch.save(old, tmp_path / "old.pt")
    capsys.readouterr()
    ckpt_lib.load(tmp_path / "old.pt")
    ckpt_lib.load(tmp_path / "old.pt")
    assert capsys.readouterr().err.count("has no checksum (written before checksums): loaded unverified") == 1


# ----------------------------------------------------------------------------- 3. divergence-aware retention

def _scale_loss_at(monkeypatch, calls: set[int], factor: float):
    """Multiply the loss (and so the gradients) by ``factor`` on the given 1-based forward calls."""
    seen = {"n": 0}
    forward = TrainModule.forward

    def scaled(self, *a, **kw):
        res = forward(self, *a, **kw)
        seen["n"] += 1
        if seen["n"] in calls:
            res.loss = res.loss * factor
        return res
    monkeypatch.setattr(TrainModule, "forward", scaled)


def test_a_finite_blowup_is_skipped_counted_and_never_checkpointed(tmp_path, monkeypatch):
    _scale_loss_at(monkeypatch, {7, 8}, 1e4)
    run = tmp_path / "r"
    train(tiny("train.max_steps=9", "train.ckpt_every=1", *QUIET), run)
    log = read_log(run)
    assert [r.get("skipped_blowup", 0) for r in log] == [0] * 6 + [1, 1, 0]
    assert [ckpt_lib.load(p)["step"] for p in ckpt_lib.list_checkpoints(run)] == [1, 2, 3, 4, 5, 6, 9]
    state = ckpt_lib.load(ckpt_lib.checkpoint_path(run, 9))["optimizer"]["state"]
    assert int(next(iter(state.values()))["step"]) == 7                # updates 7 and 8 never applied


def test_a_finite_blowup_is_a_skip_line_with_the_values_judged(tmp_path, monkeypatch, capsys):
    """Each skipped update is a line of log.jsonl: its step, reason, the quantity over its limit, the
    values and limits judged; the end-of-run line counts them."""
    from mutor2d.engine.runlog import read_skips
    _scale_loss_at(monkeypatch, {7}, 1e4)
    run = tmp_path / "r"
    train(tiny("train.max_steps=9", "train.ckpt_every=0", *QUIET), run)
    [skip] = read_skips(run)
    assert (skip["step"], skip["reason"], skip["quantity"]) == (7, "blowup", "grad_norm")
    assert skip["values"]["grad_norm"] > skip["limits"]["grad_norm"] >= 10 * 1.0      # 10 x the clip norm at least
    assert set(skip["values"]) == {"loss", "grad_norm", "weight_norm"}
    assert "trained steps 1-9: 1 (1 blowup) updates skipped by the blow-up guard" in capsys.readouterr().out


def test_a_kind_of_batch_a_third_of_the_data_is_never_starved(tmp_path, monkeypatch):
    """Every third batch of a "harder kind" (loss and gradient x30): the old guard skipped each of them
    for good (skipped values never entered its history). Judged gradient norms, skipped or not, enter
    the history, so the kind sets the scale within a tenth of the window: a few skips, then it trains."""
    from mutor2d.engine.runlog import read_skips
    _scale_loss_at(monkeypatch, set(range(3, 200, 3)), 30.0)
    run = tmp_path / "r"
    train(tiny("train.max_steps=45", "train.blowup_window=20", "train.ckpt_every=0", *QUIET), run)
    skips = read_skips(run)
    assert len(skips) <= 3 and all(s["step"] <= 20 for s in skips)
    assert sum(1 for r in read_log(run) if "loss" in r and r["loss"] > 5) >= 10      # the hard kind trained


def test_a_blowup_on_resume_keeps_and_names_the_last_good_checkpoint(tmp_path):
    """The sweep's reproduction: ckpt_every=1, resume with optim.lr=1e6 on digits."""
    run = tmp_path / "r"
    base = ["train.ckpt_every=1", "train.keep_ckpts=1", *QUIET]
    train(tiny(*base, "train.max_steps=6"), run)
    with pytest.raises(Diverged) as e:
        train(tiny(*base, "train.max_steps=40", "optim.lr=1e6", "train.max_nonfinite=3"), run, resume="auto")
    good = ckpt_lib.checkpoint_path(run, 6)
    assert f"the last good checkpoint is {good}; continue from it with --resume auto" in str(e.value)
    assert ckpt_lib.list_checkpoints(run) == [good] and ckpt_lib.load(good)["step"] == 6
    assert (run / "checkpoints" / "step_00000007.pt.diverged").is_file()    # the 1e6 update's weights


# ----------------------------------------------------------------------------- 4. optimizer overrides

def test_optimizer_overrides_on_resume_are_the_values_used(tmp_path, trained):
    import shutil
    run = tmp_path / "r"
    shutil.copytree(trained, run)
    over = ["optim.schedule=constant", "optim.warmup_steps=0", "train.ckpt_every=1", *QUIET]
    train(tiny(*over, "train.max_steps=3", "optim.lr=1e-4", "optim.betas=[0.5,0.6]", "optim.weight_decay=0.3"),
          run, resume="auto")
    groups = ckpt_lib.load(ckpt_lib.checkpoint_path(run, 3))["optimizer"]["param_groups"]
    assert [tuple(g["betas"]) for g in groups] == [(0.5, 0.6)] * 2
    assert [g["weight_decay"] for g in groups] == [0.3, 0.0]
    assert [g["lr"] for g in groups] == [1e-4] * 2 and read_log(run)[-1]["lr"] == 1e-4


# ----------------------------------------------------------------------------- 5. one-line errors

def test_disk_full_while_saving_exits_74_naming_the_folder_and_keeps_earlier_checkpoints(tmp_path, monkeypatch,
                                                                                        capsys):
    real_fdopen = os.fdopen

    class FullDisk:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def fdopen(fd, *a, **kw):
        f = real_fdopen(fd, *a, **kw)
        return FullDisk(f) if "step_00000003.pt" in os.readlink(f"/proc/self/fd/{fd}") else f
    monkeypatch.setattr(io.os, "fdopen", fdopen)
    run = tmp_path / "r"
    cfg = write_yaml(tmp_path / "t.yaml", "train.max_steps=4", "train.ckpt_every=1", *QUIET)
    code, line = exit_line(script("train"), ["--config", str(cfg), "--out", str(run)])
    assert code == ckpt_lib.WRITE_FAILED_EXIT == 74
    assert line == (f"error: could not write checkpoint step_00000003.pt into {str(run / 'checkpoints')!r} (no space "
                    f"left on the device); the earlier checkpoints are kept: free space, then continue with "
                    f"--resume auto")
    assert [ckpt_lib.load(p)["step"] for p in ckpt_lib.list_checkpoints(run)] == [1, 2]
    assert not list((run / "checkpoints").glob(".*")) and not (run / LOCK_NAME).exists()


def test_a_batch_larger_than_the_dataset_is_refused_before_the_model_is_built(tmp_path, monkeypatch):
    monkeypatch.setattr("mutor2d.image.run.build_networks", lambda *a, **k: pytest.fail("the model was built"))
    with pytest.raises(ConfigError, match=r"^train.batch_size=100000 is larger than the dataset \(\d+ examples\)"):
        train(tiny("train.batch_size=100000"), tmp_path / "r")
    assert not (tmp_path / "r").exists()


@pytest.fixture
def no_sampling(monkeypatch):
    monkeypatch.setattr(generation, "make_sampler", lambda *a, **k: pytest.fail("sampling started"))


@pytest.mark.parametrize("flags,msg", [
    (["--decode", "registers", "--draft", "100000"], "error: --draft 100000: this checkpoint's registers draft "
                                                     "at most 1 token (objective mutor-2d, d_max=3)"),
    (["--decode", "jacobi", "--window", "100000"], "error: --window 100000: a 8x8 grid has 64 tokens, so a window "
                                                   "guesses at most 63 (the first comes from the prefix)"),
])
def test_sample_py_oversized_draft_or_window_is_one_line_before_sampling(tmp_path, trained, no_sampling, flags, msg):
    code, line = exit_line(script("sample"), ["--ckpt", str(trained), "--device", "cpu", *flags])
    assert line == msg


def test_sample_py_npz_naming_a_directory_is_one_line_before_sampling(tmp_path, trained, no_sampling):
    code, line = exit_line(script("sample"), ["--ckpt", str(trained), "--device", "cpu", "--num", "10",
                                              "--npz", str(tmp_path)])
    assert line == f"error: --npz {tmp_path}: is a directory; expected the path of a .npz file"


def test_a_malformed_safetensors_file_is_one_line_everywhere(tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((8).to_bytes(8, "little") + b'{"a": 1}' + b"x")
    expected = f"{str(bad)!r} is not a readable safetensors file"
    for main, argv in ((script("sample"), ["--ckpt", str(bad), "--device", "cpu"]),
                       (checkpoint_main, ["export", str(bad), str(tmp_path / "o.safetensors")])):
        code, line = exit_line(main, argv)
        assert line.startswith("error: ") and expected in line and "\n" not in line
    with pytest.raises(ConfigError, match=f"train.init_from=.*{expected}"):
        train(tiny(f"train.init_from={bad}", "train.max_steps=1"), tmp_path / "r")
    with pytest.raises(ValueError, match=f"^--inception-weights {expected}"):
        script("eval/fid")([str(tmp_path), "--ref", str(tmp_path), "--inception-weights", str(bad)])


# ----------------------------------------------------------------------------- 6. file modes

@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640)])
def test_checkpoint_files_follow_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        path = ckpt_lib.save_atomic({"model": {}, "config": {}, "step": 1}, tmp_path / "c.pt")
        js = io.write_json_atomic(tmp_path / "x.json", {"a": 1})
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == mode and js.stat().st_mode & 0o777 == mode
