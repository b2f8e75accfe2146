"""Hardening: nothing a command writes destroys what it did not create (hub save, the LM data
converters), hub folders verified like checkpoints (a checksum of their weights, a config that does not
match them named in one line), app.py's clean exits and one-line errors, sample outputs that never
collide and never land inside a hub folder."""
import errno
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from mutor2d import config, io
from mutor2d import checkpoint
from mutor2d.checkpoint import locate
from mutor2d.lm import data as lm_data
from conftest import TINY_DIGITS, demo_extra

demo_extra("huggingface_hub")
from mutor2d import hub  # noqa: E402
from timeouts import limit  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = limit(120)
pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

TINY = TINY_DIGITS


@pytest.fixture(scope="module")
def run(tiny_digits_run):
    return tiny_digits_run


@pytest.fixture(scope="module")
def saved(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("hardening") / "digits_hub"
    hub.main(["save", str(run), str(out)])
    return out


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def copy_folder(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def sample_main():
    spec = importlib.util.spec_from_file_location("sample_cli_hardening", ROOT / "sample.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- hub save: nothing overwritten

@pytest.mark.parametrize("theirs", [{"README.md": "my notes", "config.json": '{"user": 1}'},
                                    {"config.json": '{"model_type": "gpt2"}', "model.safetensors": "LM weights",
                                     "log.jsonl": "{}\n"}], ids=["user-folder", "lm-run-folder"])
def test_hub_save_refuses_a_folder_holding_other_files(run, tmp_path, capsys, theirs):
    out = tmp_path / "out"
    out.mkdir()
    for name, text in theirs.items():
        (out / name).write_text(text)
    with pytest.raises(SystemExit) as e:
        hub.main(["save", str(run), str(out)])
    line = one_error_line(capsys)
    assert e.value.code == 2 and str(out) in line and "config.json" in line and "--force" in line
    assert {p.name: p.read_text() for p in out.iterdir()} == theirs


def test_hub_save_force_replaces_only_its_own_files_and_leaves_no_temp(run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    hub.main(["save", str(run), str(out), "--force"])
    assert (out / "notes.txt").read_text() == "mine" and locate.is_hub_folder(out)
    assert sorted(p.name for p in out.iterdir()) == sorted([*hub.OWN_FILES, "notes.txt"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_hub_save_over_its_own_folder_and_onto_a_file(run, saved, tmp_path, capsys):
    again = copy_folder(saved, tmp_path / "again")
    hub.main(["save", str(run), str(again)])                    # its own files only: no --force needed
    assert sorted(p.name for p in again.iterdir()) == sorted(hub.OWN_FILES)
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit):
        hub.main(["save", str(run), str(tmp_path / "file")])
    assert "is a file" in one_error_line(capsys) and (tmp_path / "file").read_text() == "x"
    with pytest.raises(SystemExit) as e:                        # a folder that cannot be made
        hub.main(["save", str(run), str(tmp_path / "file" / "sub")])
    assert e.value.code == 2 and "could not write hub folder" in one_error_line(capsys)


def test_hub_save_on_a_full_disk_leaves_the_folder_as_it_was(run, saved, tmp_path, capsys, monkeypatch):
    out = copy_folder(saved, tmp_path / "out")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(hub.export, "save_safetensors", full)
    with pytest.raises(SystemExit) as e:
        hub.main(["save", str(run), str(out)])
    assert e.value.code == checkpoint.WRITE_FAILED_EXIT and "no space left" in one_error_line(capsys)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and sorted(tmp_path.iterdir()) == [out]


# ----------------------------------------------------------------------------- lm.data: DST is not SRC

def test_lm_data_converter_refuses_its_input_as_output(tmp_path, capsys):
    raw = tmp_path / "gsm8k.jsonl"
    raw.write_text(json.dumps({"question": "1+1?", "answer": "2\n#### 2"}) + "\n")
    (tmp_path / "link.jsonl").symlink_to(raw)
    os.link(raw, tmp_path / "hard.jsonl")
    before = raw.read_text()
    for dst in (raw, tmp_path / "link.jsonl", tmp_path / "hard.jsonl", tmp_path / "sub" / ".." / "gsm8k.jsonl"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        with pytest.raises(SystemExit) as e:
            lm_data.main(["gsm8k", str(raw), str(dst)])
        assert e.value.code == 2 and "is the input file" in one_error_line(capsys) and raw.read_text() == before
    with pytest.raises(SystemExit):
        lm_data.main(["arith", str(tmp_path)])
    assert "is a folder" in one_error_line(capsys)
    with pytest.raises(SystemExit) as e:                        # a file where its folder should be
        lm_data.main(["arith", str(raw / "out.jsonl")])
    assert e.value.code == 2 and "could not write" in one_error_line(capsys)
    lm_data.main(["gsm8k", str(raw), str(tmp_path / "out.jsonl")])
    assert json.loads((tmp_path / "out.jsonl").read_text())["gold"] == "2"


def test_lm_data_on_a_full_disk_is_one_line_exit_74_and_no_file(tmp_path, capsys, monkeypatch):
    def full(f):
        raise OSError(errno.ENOSPC, "No space left on device")
    real = io.write_atomic
    monkeypatch.setattr(io, "write_atomic", lambda path, write_fn: real(path, full))    # the disk refuses the data
    with pytest.raises(SystemExit) as e:
        lm_data.main(["arith", str(tmp_path / "a.jsonl"), "--count", "3"])
    assert e.value.code == 74 and "no space left" in one_error_line(capsys) and list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- hub folders verified

def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF                        # tensor data: safetensors puts its header first
    path.write_bytes(bytes(data))


def test_hub_config_records_the_weights_checksum(saved):
    recorded = json.loads((saved / "config.json").read_text())[io.WEIGHTS_SHA256_KEY]
    assert recorded == io.file_sha256(saved / "model.safetensors")


def test_a_flipped_byte_in_hub_weights_is_one_line_everywhere(saved, tmp_path, capsys):
    bad = copy_folder(saved, tmp_path / "bad_hub")
    flip_last_byte(bad / "model.safetensors")
    with pytest.raises(SystemExit) as e:
        sample_main().main(["--ckpt", str(bad), "--device", "cpu"])
    line = one_error_line(capsys)
    assert e.value.code == 2 and "model.safetensors" in line and "corrupt" in line
    with pytest.raises(checkpoint.CheckpointError, match="corrupt"):
        hub.MutorModel.from_pretrained(str(bad))
    from mutor2d.image.run import init_weights
    from mutor2d.model.gpt import GPT
    with pytest.raises(ValueError, match="corrupt"):                       # train.init_from
        init_weights(GPT(config.load("digits_mutor2d.yaml", TINY).model, register_token=True), str(bad))
    demo_extra("gradio")
    from mutor2d.demo import cli as demo_cli
    with pytest.raises(SystemExit) as e:
        demo_cli.main(["--ckpt", str(bad), "--device", "cpu", "--port", str(free_port())])
    assert e.value.code == 2 and "corrupt" in one_error_line(capsys)


def test_a_hub_folder_without_checksum_loads_with_one_warning(saved, tmp_path, capsys):
    old = copy_folder(saved, tmp_path / "old_hub")
    cfg = json.loads((old / "config.json").read_text())
    del cfg[io.WEIGHTS_SHA256_KEY]
    (old / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    assert locate.resolve(old) == locate.resolve(old) == old / "model.safetensors"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and "no checksum" in err[0]


def test_a_hub_config_that_does_not_match_its_weights_names_the_first_tensor(saved, tmp_path, capsys):
    wrong = copy_folder(saved, tmp_path / "wrong_hub")
    state, meta = io.read_safetensors(wrong / "model.safetensors")
    name = next(iter(state))
    state[name] = state[name][:1].clone()
    from safetensors.torch import save_file
    save_file(state, str(wrong / "model.safetensors"), metadata=meta)
    cfg = json.loads((wrong / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps({**cfg, io.WEIGHTS_SHA256_KEY: io.file_sha256(
        wrong / "model.safetensors")}))
    with pytest.raises(SystemExit) as e:
        sample_main().main(["--ckpt", str(wrong), "--device", "cpu"])
    line = one_error_line(capsys)
    right = io.read_safetensors(saved / "model.safetensors")[0][name]
    shapes = f"{tuple(state[name].shape)} in the file, {tuple(right.shape)} in the model"
    assert e.value.code == 2 and name in line and shapes in line and "size mismatch" not in line


# ----------------------------------------------------------------------------- sample outputs

def test_tutorial_grids_of_steps_3_and_5_have_different_names_and_the_tutorial_names_step_3s():
    sample_py = sample_main()
    src = types.SimpleNamespace(cfg=config.load("digits_mutor2d.yaml"), grid=(8, 8), step=1000, num_choices=10)

    def name(*argv):
        args = sample_py.parse_args(["--ckpt", "x", *argv])
        s = sample_py.sample_section(args, src)
        classes = sample_py.parse_classes(args.classes, 10)
        return sample_py.output_name(src, s, sample_py.pick(args.seed, s.seed), args.ema, ".png", classes,
                                     f"x{args.per_class}", args.batch_size)
    step3 = name("--classes", "1,7,9", "--per-class", "8", "--cfg", "2.0")
    names = {step3, name("--classes", "3", "--per-class", "1", "--decode", "registers"),
             name("--classes", "1,7,9", "--per-class", "8", "--decode", "registers"),
             name("--classes", "1,7,9", "--per-class", "8", "--cfg", "2.0", "--batch-size", "4"),
             name("--classes", "1,7,9", "--per-class", "4", "--cfg", "2.0")}
    assert len(names) == 5
    assert f"runs/digits_mutor2d/samples/{step3}" in (ROOT / "docs" / "TUTORIAL.md").read_text()


def test_sampling_a_hub_folder_writes_beside_it(saved, tmp_path):
    hub_copy = copy_folder(saved, tmp_path / "shared_hub")
    sample_main().main(["--ckpt", str(hub_copy), "--classes", "1", "--per-class", "1", "--device", "cpu"])
    assert sorted(p.name for p in hub_copy.iterdir()) == sorted(hub.OWN_FILES)
    [grid] = (tmp_path / "shared_hub_samples").glob("step_*_cls1_x1_*.png")
    assert grid.is_file()


# ----------------------------------------------------------------------------- app.py

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def app_py(*args, block_gradio: bool = False, **popen) -> subprocess.Popen:
    """app.py in a subprocess (gradio made unimportable with ``block_gradio``, as without the demo extra)."""
    code = ("import runpy, sys; " + ("sys.modules['gradio'] = None; " if block_gradio else "")
            + f"sys.argv = ['app.py', *{list(map(str, args))!r}]; runpy.run_path('app.py', run_name='__main__')")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, text=True, **popen)


@pytest.mark.parametrize("argv", [["--help"], []], ids=["help", "bare"])
def test_app_without_the_demo_extra_names_it_in_one_line(argv):
    proc = app_py(*argv, block_gradio=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=TIMEOUT)
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and out == "" and len(lines) == 1 and 'pip install -e ".[demo]"' in lines[0], err


def test_app_port_out_of_range_or_busy_is_one_line(saved, capsys):
    from mutor2d.demo import cli as demo_cli
    demo_extra("gradio")
    with pytest.raises(SystemExit) as e:
        demo_cli.main(["--ckpt", str(saved), "--port", "99999"])
    assert e.value.code == 2 and "--port 99999: expected a port in 1..65535" in one_error_line(capsys)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(SystemExit) as e:
            demo_cli.main(["--ckpt", str(saved), "--port", str(port), "--device", "cpu"])
    line = one_error_line(capsys)
    assert e.value.code == 2 and f"127.0.0.1:{port}" in line and "in use" in line


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_app_exits_within_seconds_of_ctrl_c_or_sigterm_with_queued_requests(saved, tmp_path, sig):
    demo_extra("gradio_client")
    port, log = free_port(), tmp_path / "app.log"
    with log.open("w") as f:
        proc = app_py("--ckpt", saved, "--port", port, "--device", "cpu", stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + TIMEOUT
        while "Running on" not in log.read_text():
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-2000:]
            time.sleep(0.3)
        from gradio_client import Client
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        jobs = [client.submit([0, 1, 2, 3], 16, 2.0, 1.0, 0, 1.0, seed, "plain", 0, 4, api_name="/on_generate")
                for seed in range(6)]                  # 64 images each: one decoding, five queued
        time.sleep(1)
        proc.send_signal(sig)
        start = time.time()
        assert proc.wait(15) == 128 + sig and time.time() - start < 10, log.read_text()[-2000:]
    finally:
        proc.kill()
        proc.wait()


# ----------------------------------------------------------------------------- a model that cannot fit

def test_a_model_larger_than_this_machine_is_one_line_before_anything_is_built(tmp_path, monkeypatch):
    """model.n_layer=100000 allocated until the kernel's OOM killer ended the run: the size fields' model
    must fit this machine's memory (16 bytes a parameter on the CPU), image and VQ runs alike; the shipped
    configs (digits, LlamaGen-B, the VQ) pass the check on this machine."""
    from mutor2d import checks
    from mutor2d.engine.loop import train
    from mutor2d.vq.config import load_config
    from mutor2d.vq.run import train as train_vq
    from test_training import tiny
    monkeypatch.setattr(checks, "physical_memory", lambda: 2 ** 16)            # a machine of 64 KiB
    with pytest.raises(config.ConfigError, match=r"^model.n_layer=\d+, model.dim=\d+, model.vocab_size=17: about "
                       r".* parameters at 16 bytes each, .* GiB; this machine has 6.1e-05 GiB of memory$"):
        train(tiny("data.levels=17"), tmp_path / "image")
    assert not (tmp_path / "image" / "checkpoints").exists()
    vq = ["model.preset=tiny", "data.eval_images=16", "train.batch_size=4", "train.max_steps=1", "train.eval_every=0"]
    with pytest.raises(config.ConfigError, match=r"^model.ch=\d+, model.ch_mult=\[.*\], model.num_res_blocks=\d+: about"):
        train_vq(load_config("vq_digits", vq + [f"train.out_dir={tmp_path / 'vq'}"]))
    monkeypatch.undo()                  # on this machine the shipped configs fit (and every training test
    from mutor2d.run_configs import run_kind                            # passes the same check)
    for name in ("digits_mutor2d.yaml", "llamagen_b_mutor2d.yaml", "vq_digits.yaml"):
        cfg = config.load(name)
        checks.check_model_fits(*run_kind(cfg.task)().size(cfg), checks.TRAIN_BYTES_PER_PARAM)


def test_a_language_model_larger_than_this_machine_is_one_line_before_it_is_loaded(tmp_path, monkeypatch):
    """A language-model run takes its size from the model folder: its weights alone, at model.dtype, must
    fit this machine's memory (parameters counted from the config on the meta device), a run refused before
    it writes a checkpoint;
    the same model on a machine it fits loads, in fp32 and bf16, and a LoRA adapter folder is left to the load."""
    import torch
    from mutor2d import checks
    from mutor2d.lm import hf
    from mutor2d.lm.tiny import write_tiny_llama
    folder = write_tiny_llama(tmp_path / "base", hidden=16, layers=1, heads=2)
    params = sum(p.numel() for p in hf.load_causal_lm(folder).parameters())       # fits: loads
    assert hf.load_causal_lm(folder, "bfloat16").dtype == torch.bfloat16
    monkeypatch.setattr(checks, "physical_memory", lambda: params * 4 - 1)          # one byte short in fp32
    head = re.escape(f"model.hf={folder}: about {params:.3g} parameters at 4 bytes each, ")
    with pytest.raises(config.ConfigError, match=rf"^{head}.* GiB; this machine has .* GiB of memory$"):
        hf.load_causal_lm(folder)
    assert hf.load_causal_lm(folder, "bfloat16").dtype == torch.bfloat16          # 2 bytes each: fits
    hf.check_weights_fit(tmp_path, "float32")                      # no config.json (an adapter's folder): the load decides
    from mutor2d.lm import train as train_lm
    from test_resume_and_startup import arith_data, lm_config
    cfg = lm_config(folder, arith_data(tmp_path / "arith.jsonl"), max_steps=1)
    with pytest.raises(config.ConfigError, match=rf"^{head}"):
        train_lm(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_tokenizer_runs_checkpoint_given_where_an_image_model_is_expected_is_one_line(tmp_path, capsys):
    """hub save (and sample.py) of a VQ run ended in AttributeError: 'VQConfig' object has no attribute 'build'."""
    from mutor2d.vq.config import load_config
    from mutor2d.vq.run import train as train_vq
    run = tmp_path / "vq"
    train_vq(load_config("vq_digits", ["model.preset=tiny", "data.eval_images=16", "train.batch_size=4",
                                       "train.max_steps=1", "train.eval_every=0", f"train.out_dir={run}"]))
    capsys.readouterr()
    expected = f"error: checkpoint '{run / 'checkpoints' / 'step_00000001.pt'}' is a vq run's (task: vq); " \
               "expected an image model's (train.py with an image config)"
    with pytest.raises(SystemExit) as e:
        hub.main(["save", str(run), str(tmp_path / "hub")])
    assert e.value.code == 2 and one_error_line(capsys) == expected and not (tmp_path / "hub").exists()
    with pytest.raises(SystemExit) as e:
        sample_main().main(["--ckpt", str(run), "--out", str(tmp_path / "grid.png"), "--device", "cpu"])
    assert e.value.code == 2 and one_error_line(capsys) == expected


# ----------------------------------------------------------------------------- sample.py replaces nothing silently

def test_sample_py_replaces_no_other_output_without_force(run, tmp_path, capsys):
    """An existing --out (the leaderboard's plot) and an npz of other settings are refused in one line and
    left as they were; the same npz settings say 'already complete'; --force replaces."""
    sample = sample_main()
    plot = tmp_path / "fid.png"
    plot.write_bytes(b"the leaderboard's plot")
    with pytest.raises(SystemExit) as e:
        sample.main(["--ckpt", str(run), "--out", str(plot), "--device", "cpu", "--per-class", "1"])
    assert e.value.code == 2 and one_error_line(capsys) == \
        f"error: --out {plot}: exists; pass --force to replace it, or another --out"
    assert plot.read_bytes() == b"the leaderboard's plot"
    sample.main(["--ckpt", str(run), "--out", str(plot), "--device", "cpu", "--per-class", "1", "--force"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    npz = tmp_path / "samples_cfg2.npz"
    common = ["--ckpt", str(run), "--npz", str(npz), "--num", "10", "--device", "cpu"]
    sample.main(common + ["--cfg", "2.0"])
    made = npz.read_bytes()
    capsys.readouterr()
    sample.main(common + ["--cfg", "2.0"])
    assert capsys.readouterr().out.strip() == f"{npz} is already complete"
    with pytest.raises(SystemExit) as e:
        sample.main(common + ["--cfg", "3.0"])
    assert e.value.code == 2 and one_error_line(capsys) == (
        f"error: {npz} holds other samples (made with other settings: cfg_scale); pass --force to replace it, "
        "or write to another --npz")
    assert npz.read_bytes() == made
    sample.main(common + ["--cfg", "3.0", "--force"])
    assert npz.read_bytes() != made


# ----------------------------------------------------------------------------- a run folder that refuses writes

def test_a_read_only_or_full_run_folder_is_one_line_exit_74_and_keeps_the_last_checkpoint(tmp_path, monkeypatch, capsys):
    """OSError 30 from the run lock and 28 from log.jsonl were tracebacks: now one line naming the run
    folder and what it keeps, exit 74 through train.py's entry; a healthy run is untouched by the rule."""
    import errno as errno_lib
    from mutor2d.engine import entry, runlog
    from mutor2d.engine.runlog import read_log
    from mutor2d.engine.loop import train
    from mutor2d.engine.runlog import JsonLog
    from test_training import tiny
    real_mkdir = Path.mkdir

    def read_only(self, *a, **k):
        if str(self).startswith(str(tmp_path / "ro")):
            raise OSError(errno_lib.EROFS, "Read-only file system", str(self))
        return real_mkdir(self, *a, **k)
    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(SystemExit) as e:
        entry.run_entry(lambda: train(tiny(), tmp_path / "ro" / "run"))
    assert e.value.code == 74 and one_error_line(capsys) == (
        f"error: could not write into run folder '{tmp_path / 'ro' / 'run'}' (Read-only file system: "
        f"{tmp_path / 'ro' / 'run'}); no checkpoint had been written")
    monkeypatch.undo()
    real_write = JsonLog.write

    def full_at_step_3(self, record):
        if record.get("step") == 3 and "loss" in record:
            raise OSError(errno_lib.ENOSPC, "No space left on device")
        real_write(self, record)
    monkeypatch.setattr(runlog.JsonLog, "write", full_at_step_3)
    run = tmp_path / "full"
    with pytest.raises(SystemExit) as e:
        entry.run_entry(lambda: train(tiny("train.max_steps=4", "train.ckpt_every=2"), run))
    assert e.value.code == 74 and capsys.readouterr().err.strip().splitlines()[-1] == (        # after the bar
        f"error: could not write into run folder '{run}' (No space left on device); its checkpoints are kept "
        "(newest: step_00000002.pt)")
    monkeypatch.undo()
    train(tiny("train.max_steps=4", "train.ckpt_every=2"), run, resume="auto")      # space again: it continues
    assert [r["step"] for r in read_log(run) if "loss" in r] == [1, 2, 3, 4]


def test_a_language_model_runs_checkpoint_where_an_image_model_is_expected_names_its_model_folder(tmp_path):
    """Export and inference share one task check: a language-model run's checkpoint points to its HF files."""
    import torch

    from mutor2d import checkpoint
    from mutor2d.checkpoint.inference import open_model
    run = tmp_path / "lm_run"
    checkpoint.save_atomic({"model": {"w": torch.zeros(1)}, "config": {"task": "lm"}, "step": 1, "grid": None},
                           checkpoint.checkpoint_path(run, 1))
    with pytest.raises(checkpoint.CheckpointError, match=rf"is a language-model run; its model is saved as {run}/model"):
        open_model(run)
