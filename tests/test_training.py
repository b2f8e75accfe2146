"""Training loop: every objective trains, resume is exact, a killed run resumes cleanly, config
errors are one line, and two DDP processes (gloo, CPU) match one process on the same global batch."""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from mutor2d import checkpoint as ckpt_lib
from mutor2d.checkpoint import inference
from mutor2d import config as C
from mutor2d.config import ConfigError
from mutor2d.image.config import ImageRunConfig
from mutor2d.engine.data_order import StepBatches
from mutor2d.engine.optim import param_groups
from mutor2d.engine.runlog import read_log
from mutor2d.engine.loop import train
from mutor2d.image.run import TrainModule
from mutor2d.registry import build
from timeouts import limit

ROOT = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

PY = sys.executable

TINY = {
    "model": {"preset": "tiny", "attention": "sdpa"},
    "data": {"name": "digits", "levels": 5},
    "objective": {"name": "mutor-2d", "d_max": 3},
    "optim": {"lr": 3e-3, "schedule": "cosine", "warmup_steps": 2},
    "train": {"batch_size": 8, "max_steps": 3, "log_every": 1, "ckpt_every": 0, "keep_ckpts": 0,
              "tracker": "none", "seed": 3},
    "sample": {"classes": [0, 7], "per_class": 1},
}


def tiny(*overrides: str) -> ImageRunConfig:
    return C.from_dict(C.apply_overrides(json.loads(json.dumps(TINY)), list(overrides)))


def write_yaml(path: Path, *overrides: str) -> Path:
    path.write_text(yaml.safe_dump(C.apply_overrides(json.loads(json.dumps(TINY)), list(overrides))))
    return path


def losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_log(run_dir) if "loss" in r}


def losses_so_far(run_dir) -> dict[int, float]:
    """The log of a running (or killed) process: a last line may be cut short."""
    path = Path(run_dir) / "log.jsonl"
    out = {}
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "loss" in rec:
            out[rec["step"]] = rec["loss"]
    return out


def stop_after(cmd: list[str], run_dir, steps: int, threads: int = 1) -> tuple[int, str]:
    """Start ``cmd`` (in its own session, as a scheduler's job), SIGTERM its process group once
    ``run_dir`` has logged ``steps`` losses -> (exit code, stderr)."""
    import signal
    import subprocess
    import time
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env(threads), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        end = time.time() + limit(120)
        while time.time() < end and len(losses_so_far(run_dir)) < steps and proc.poll() is None:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=limit(120)), proc.stderr.read()
    finally:
        proc.kill()


def env(threads: int | None = None):
    """Subprocess environment; ``threads`` = this process's count where results must match bit-exactly."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads or 1), "PYTHONUNBUFFERED": "1"}


# ----------------------------------------------------------------------------- data order, groups

def test_step_batches_same_global_batch_for_any_world_and_restartable():
    one = list(StepBatches(10, 8, 1, 0, 2, seed=1, start=0, end=4))        # 2 micro-batches of 4
    two = [list(StepBatches(10, 8, 2, r, 2, seed=1, start=0, end=4)) for r in (0, 1)]  # 2 x 2 of 2
    for s in range(4):
        glob_one = sorted(sum(one[2 * s: 2 * s + 2], []))
        glob_two = sorted(sum(two[0][2 * s: 2 * s + 2] + two[1][2 * s: 2 * s + 2], []))
        assert glob_one == glob_two and len(glob_one) == 8
    # each epoch is a permutation: 10 samples, positions 0..9 cover every index once
    flat = sum(one, [])
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    assert list(StepBatches(10, 8, 1, 0, 2, seed=1, start=2, end=4)) == one[4:]
    with pytest.raises(ConfigError, match="not divisible by processes x train.grad_accum = 3 x 1"):
        StepBatches(10, 8, 3, 0, 1, seed=1, start=0, end=1)


def test_weight_decay_groups_follow_llamagen():
    from mutor2d.model.gpt import GPT
    cfg = tiny("model.vocab_size=5", "model.num_classes=10")
    model = GPT(cfg.model, register_token=True)
    groups = param_groups(TrainModule(model, build(cfg.objective, model), (8, 8)), 0.05)
    decay, no_decay = ({id(p) for p in g["params"]} for g in groups)
    assert groups[0]["weight_decay"] == 0.05 and groups[1]["weight_decay"] == 0.0
    assert id(model.tok_embeddings.weight) in decay and id(model.layers[0].attention.wqkv.weight) in decay
    assert id(model.norm.weight) in no_decay and id(model.register_embedding) in no_decay
    assert len(decay) + len(no_decay) == len(list(model.parameters()))


@pytest.mark.parametrize("warmup,min_lr", [(3, 0.0), (0, 1e-3)])
def test_linear_schedule_equals_the_hugging_face_formula(warmup, min_lr):
    """optim.schedule=linear: lr*n/W during warm-up, then a straight line from lr to min_lr at max_steps
    (Hugging Face's "linear" schedule when min_lr = 0); update n is scheduled by step_update(n)."""
    from mutor2d.engine.optim import OptimConfig, build_scheduler
    lr, total = 0.1, 13
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = build_scheduler(opt, OptimConfig(lr=lr, schedule="linear", warmup_steps=warmup, min_lr=min_lr), total)
    for n in range(total + 2):
        sched.step_update(n)
        want = lr * n / warmup if n < warmup else \
            min_lr + (lr - min_lr) * max(0.0, (total - n) / (total - warmup))
        assert opt.param_groups[0]["lr"] == pytest.approx(want, abs=1e-12), n


# ----------------------------------------------------------------------------- objectives

@pytest.mark.parametrize("overrides", [
    ["objective.name=ntp"],
    ["objective.name=mutor-1d", "objective.d_max=3"],
    ["objective.name=mutor-2d"],
    ["objective.name=mutor-2d", "objective.placement=sparse", "objective.num_registers=10"],
    ["objective.name=multihead", "objective.d_max=2"],
], ids=["ntp", "mutor-1d", "mutor-2d", "mutor-2d-sparse", "multihead"])
def test_each_objective_trains_and_checkpoints(tmp_path, overrides):
    cfg = tiny(*overrides, "train.ema=true", "train.ema_decay=0.5")
    train(cfg, tmp_path)
    log = read_log(tmp_path)
    assert [r["step"] for r in log] == [1, 2, 3]
    for r in log:
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0 and r["images_per_s"] > 0
        aux = {"ntp": None, "multihead": "loss_heads"}.get(cfg.objective.name, "loss_reg")
        assert all(k in r for k in ["loss_ntp"] + ([aux] if aux else []))
    assert abs(log[0]["loss"] - math.log(5)) < 0.05          # zero-init head: uniform over 5 tokens
    assert [r["lr"] for r in log] == pytest.approx([1.5e-3, 3e-3, 0.0])  # warmup 2, cosine to 0
    # the checkpoint rebuilds the same model; data fields were resolved from the dataset
    saved = ckpt_lib.load(ckpt_lib.checkpoint_path(tmp_path, 3))
    assert saved["step"] == 3 and saved["grid"] == [8, 8] and len(saved["rng"]) == 1
    assert saved["config"]["model"]["vocab_size"] == 5 and saved["config"]["model"]["num_classes"] == 10
    assert bool(saved["objective"]) == (cfg.objective.name == "multihead")
    model, cfg2, step = inference.load_model(tmp_path, use_ema=False)
    assert step == 3 and cfg2.objective == cfg.objective
    raw = {k: v for k, v in saved["model"].items()}
    assert all(torch.equal(v, raw[k]) for k, v in model.state_dict().items())
    assert not torch.equal(saved["ema"]["output.weight"], raw["output.weight"])  # EMA lags the model
    assert (tmp_path / "samples" / "step_00000003.png").stat().st_size > 0
    assert C.load(tmp_path / "config.yaml").model.vocab_size == 5


def test_sample_grid_rows_are_classes(tmp_path):
    from PIL import Image
    train(tiny("train.max_steps=1", "sample.per_class=3"), tmp_path / "a")
    train(tiny("train.max_steps=1", "sample.per_class=3", "sample.labels=false"), tmp_path / "b")
    img, bare = (Image.open(tmp_path / run / "samples" / "step_00000001.png") for run in "ab")
    # 2 classes x 3 per class, 8 px images enlarged to 64 px, padding 2, then x2 to 256+ px a side; the rows
    # named in a left margin
    assert bare.size == (2 * (3 * 66 + 2), 2 * (2 * 66 + 2)) and img.height == bare.height and img.width > bare.width
    assert np.array_equal(np.asarray(img)[:, img.width - bare.width:], np.asarray(bare))
    assert json.loads(img.text["rows"]) == json.loads(bare.text["rows"]) == ["0", "7"]


# ----------------------------------------------------------------------------- resume

RESUMED = ["objective.placement=sparse", "objective.num_registers=12", "train.max_steps=6",
           "train.ckpt_every=3", "train.grad_accum=2", "train.ema=true", "train.ema_decay=0.9",
           "model.class_dropout=0.5", "train.sample_every=100"]


def test_resume_reproduces_the_uninterrupted_run_exactly(tmp_path):
    """Sparse registers (layout generator), dropout and label dropout (torch RNG), grad
    accumulation, warmup + cosine, EMA: steps 4..6 after resuming at 3 equal the straight run."""
    over = RESUMED
    straight, resumed = tmp_path / "a", tmp_path / "b"
    train(tiny(*over), straight)
    train(tiny(*over), resumed, resume=str(ckpt_lib.checkpoint_path(straight, 3)))
    a, b = losses(straight), losses(resumed)
    assert sorted(b) == [4, 5, 6]
    assert [a[s] for s in (4, 5, 6)] == [b[s] for s in (4, 5, 6)]
    ca, cb = (ckpt_lib.load(ckpt_lib.checkpoint_path(d, 6)) for d in (straight, resumed))
    for part in ("model", "ema"):
        assert all(torch.equal(ca[part][k], cb[part][k]) for k in ca[part])
    # "auto" continues a finished run to a larger max_steps; a fresh start refuses a used folder
    train(tiny(*over[:-1], "train.max_steps=7", "optim.schedule=constant"), straight, resume="auto")
    assert sorted(losses(straight)) == list(range(1, 8))
    with pytest.raises(ConfigError, match="already has checkpoints: pass --resume auto"):
        train(tiny(*over), straight)
    with pytest.raises(ConfigError, match=r"objective.num_registers=11 differs from the checkpoint's 12"):
        train(tiny(*over[:1], "objective.num_registers=11", *over[2:]), straight, resume="auto")


def test_init_from_starts_a_mutor_run_from_next_token_weights(tmp_path):
    """train.init_from: a fresh MuToR run starts from an NTP run's weights (the register embedding
    is new); a bad source is a one-line ConfigError."""
    ntp = tmp_path / "ntp"
    train(tiny("objective.name=ntp", "train.max_steps=2"), ntp)
    src = ckpt_lib.load(ckpt_lib.checkpoint_path(ntp, 2))["model"]
    still = ["train.max_steps=1", "optim.lr=1e-12", "optim.warmup_steps=0", "optim.schedule=constant"]
    got = {}
    for name, extra in (("warm", [f"train.init_from={ntp}"]), ("cold", [])):
        train(tiny(*still, *extra), tmp_path / name)
        got[name] = ckpt_lib.load(ckpt_lib.checkpoint_path(tmp_path / name, 1))["model"]
    assert set(got["warm"]) == set(src) | {"register_embedding"}
    assert all(torch.allclose(got["warm"][k], src[k], rtol=0, atol=1e-9) for k in src)
    assert not torch.allclose(got["cold"]["layers.0.attention.wqkv.weight"],
                              src["layers.0.attention.wqkv.weight"], rtol=0, atol=1e-3)
    # a MuToR checkpoint into a next-token model: its register embedding is dropped
    train(tiny("objective.name=ntp", f"train.init_from={tmp_path / 'warm'}", "train.max_steps=1"),
          tmp_path / "back")
    with pytest.raises(ConfigError, match=r"train.init_from='.*missing.pt'") as e:
        train(tiny(f"train.init_from={tmp_path / 'missing.pt'}"), tmp_path / "x")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"train.init_from=.*does not match the model"):
        train(tiny("model.n_layer=3", f"train.init_from={ntp}"), tmp_path / "y")


def _wait_for(predicate, proc, timeout=limit(60.0)):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def test_sigkilled_run_resumes_from_last_checkpoint(tmp_path):
    cfg = write_yaml(tmp_path / "t.yaml", "optim.schedule=constant", "train.max_steps=10000",
                     "train.ckpt_every=4", "train.keep_ckpts=2", "train.sample_every=0")
    run = tmp_path / "run"
    cmd = [PY, str(ROOT / "train.py"), "--config", str(cfg), "--out", str(run)]
    err = open(tmp_path / "stderr.txt", "w+")              # a file, not a pipe: a full pipe would block it
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env(torch.get_num_threads()), stdout=subprocess.DEVNULL, stderr=err)

    def past_checkpoint():  # a checkpoint exists and training has moved on beyond it
        steps = losses_so_far(run)
        return bool(ckpt_lib.list_checkpoints(run)) and bool(steps) and max(steps) % 4 in (1, 2)
    try:
        ok = _wait_for(past_checkpoint, proc, timeout=limit(120))
        proc.send_signal(signal.SIGSTOP)                      # freeze it where it is, then kill it
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        err.close()
    assert ok, (tmp_path / "stderr.txt").read_text()[-2000:]
    killed_log = losses_so_far(run)
    last = ckpt_lib.latest_valid(run)
    k = ckpt_lib.load(last)["step"]
    assert k % 4 == 0 and max(killed_log) >= k                 # normally > k: between two checkpoints
    # a half-written next checkpoint (what a non-atomic writer would leave) must be skipped
    ckpt_lib.checkpoint_path(run, k + 1).write_bytes(last.read_bytes()[:1000])
    # resume in-process (same code path as train.py --resume auto; saves a second interpreter start)
    train(C.load(cfg, ["train.max_steps=%d" % (k + 3)]), run, resume="auto")
    after = losses(run)
    assert sorted(after) == list(range(1, k + 4))              # no duplicate or lost log records
    for s in range(k + 1, min(max(killed_log), k + 3) + 1):     # recomputed steps match the killed run
        assert after[s] == killed_log[s]
    assert ckpt_lib.load(ckpt_lib.latest_valid(run))["step"] == k + 3
    for p in ckpt_lib.list_checkpoints(run):
        if p.name != ckpt_lib.checkpoint_path(run, k + 1).name:
            ckpt_lib.load(p)                                   # every kept checkpoint is readable
    assert not list((run / "checkpoints").glob(".*.tmp"))


# ----------------------------------------------------------------------------- errors

def test_config_errors_are_one_line(tmp_path):
    cfg = write_yaml(tmp_path / "t.yaml")
    r = subprocess.run([PY, str(ROOT / "train.py"), "--config", str(cfg), "--out", str(tmp_path / "r"),
                        "--set", "train.log_every=0"], cwd=ROOT, env=env(), capture_output=True,
                       text=True, timeout=limit(120))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["error: train.log_every: expected >= 1, got 0"]
    for overrides, msg in [
        (["model.vocab_size=100"], r"model.vocab_size=100 does not match the data \(5\); leave it out"),
        (["objective.d_max=9"], "objective.d_max=9 exceeds the grid 8x8"),
        (["sample.classes=[12]"], "sample.classes: 12 is not a class of the data"),
    ]:
        with pytest.raises(ConfigError, match=msg) as e:
            train(tiny(*overrides), tmp_path / "x")
        assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- DDP

def test_two_ddp_processes_match_one_process(tmp_path):
    """Same global batch (8 = 2 x 4), no dropout, NTP: per-step losses agree to float tolerance."""
    over = ["objective.name=ntp", "model.token_dropout=0", "model.resid_dropout=0", "model.ffn_dropout=0",
            "model.class_dropout=0", "train.max_steps=3", "train.sample_every=100"]
    cfg = write_yaml(tmp_path / "t.yaml", *over)
    ddp = tmp_path / "ddp"
    # accelerate 1.15: "--cpu --num_processes 2" starts ONE process (multi-CPU needs MPI there);
    # "--multi_gpu" starts 2 through torchrun, and training.py picks gloo/CPU when there is no CUDA
    r = subprocess.run([PY, "-m", "accelerate.commands.launch", "--main_process_port", "0", "--multi_gpu", "--num_processes", "2",
                        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                        str(ROOT / "train.py"), "--config", str(cfg), "--out", str(ddp)],
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=limit(180))
    assert r.returncode == 0, r.stderr[-3000:]
    single = tmp_path / "one"
    train(tiny(*over), single)
    a, b = losses(single), losses(ddp)
    assert sorted(a) == sorted(b) == [1, 2, 3]
    for s in a:
        assert abs(a[s] - b[s]) < 1e-5, (s, a[s], b[s])
    saved = ckpt_lib.load(ckpt_lib.checkpoint_path(ddp, 3))
    assert len(saved["rng"]) == 2                               # one RNG state per process
    ref = ckpt_lib.load(ckpt_lib.checkpoint_path(single, 3))["model"]
    assert all(torch.allclose(saved["model"][k], ref[k], atol=1e-5) for k in ref)


def test_online_eval_is_logged_and_leaves_training_unchanged(tmp_path, monkeypatch):
    """train.eval_every calls evaluation.online.online_digits_eval (stubbed here: the real one trains a
    classifier) with the EMA/raw model; records land in log.jsonl; training losses do not move."""
    import mutor2d.evaluation.online as online
    calls = []

    def fake_eval(model, data_cfg, num_per_class, sample_cfg, tokenizer, seed, grid=None):
        calls.append((type(model).__name__, num_per_class, sample_cfg.cfg_scale))
        torch.rand(100)                                        # consumes RNG: must not leak into training
        return {"fid": 1.5, "accuracy": 0.9}
    monkeypatch.setattr(online, "online_digits_eval", fake_eval)
    over = ["train.max_steps=2", "train.sample_every=100", "sample.cfg_scale=2.0"]
    train(tiny(*over, "train.eval_every=1", "train.eval_per_class=3"), tmp_path / "a")
    train(tiny(*over), tmp_path / "b")
    assert calls == [("GPT", 3, 2.0), ("GPT", 3, 2.0)]
    evals = [r for r in read_log(tmp_path / "a") if "eval_fid" in r]
    assert [(r["step"], r["eval_fid"], r["eval_accuracy"]) for r in evals] == [(1, 1.5, 0.9), (2, 1.5, 0.9)]
    from mutor2d.evaluation.records import read_records
    records, _ = read_records([tmp_path / "a"])                # the records the leaderboard reads
    assert sorted((r["step"], r["metrics"]["fid"], r["reference"]) for r in records) == \
        [(1, 1.5, "digits:train"), (2, 1.5, "digits:train")]
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    with pytest.raises(ConfigError, match="train.eval_every: the online evaluation needs data.name=digits"):
        tiny("train.eval_every=2", "model.conditioning=prompt")           # refused at load, before any training


def test_shipped_configs_hold_the_paper_recipe():
    """configs/llamagen_b_*.yaml: LlamaGen-B on ImageNet codes with the MuToR paper's recipe
    (the paper's LlamaGen-B setting); the digits defaults differ only in the objective."""
    expect = {"llamagen_b_ntp": ("ntp", "dense"), "llamagen_b_mutor1d": ("mutor-1d", "dense"),
              "llamagen_b_mutor2d": ("mutor-2d", "dense"), "llamagen_b_mutor2d_sparse": ("mutor-2d", "sparse")}
    for name, (objective, placement) in expect.items():
        cfg = C.load(f"{name}.yaml")
        m, o, op, t = cfg.model, cfg.objective, cfg.optim, cfg.train
        assert (m.preset, m.vocab_size, m.num_classes, m.class_dropout) == ("B", 16384, 1000, 0.1)
        assert (m.token_dropout, m.resid_dropout, m.ffn_dropout) == (0.1, 0.1, 0.1)
        assert (op.lr, op.betas, op.weight_decay, op.schedule, op.warmup_steps) == (4e-4, (0.9, 0.95), 0.05, "constant", 0)
        assert (t.batch_size, t.max_steps, t.mixed_precision) == (1024, 360_000, "bf16")
        assert (cfg.data.name, cfg.data.path) == ("codes", "data/imagenet256_codes")
        assert o.name == objective
        if objective != "ntp":
            assert (o.placement, o.reg_weight) == (placement, 0.5)
        if objective == "mutor-2d":
            assert o.d_max == 4 and (placement == "dense" or o.num_registers == 80)
    a, b = C.load("digits_mutor2d.yaml"), C.load("digits_ntp.yaml")
    assert (a.objective.name, b.objective.name) == ("mutor-2d", "ntp")
    assert {k: v for k, v in a.to_dict().items() if k != "objective"} == \
        {k: v for k, v in b.to_dict().items() if k != "objective"}


def test_keep_every_keeps_checkpoints_for_later_scoring(tmp_path):
    """train.keep_every=2 with keep_ckpts=1: rotation keeps the newest and every even step."""
    from mutor2d import checkpoint as ckpt_lib
    train(tiny("train.max_steps=5", "train.ckpt_every=1", "train.keep_ckpts=1", "train.keep_every=2"), tmp_path)
    assert [ckpt_lib.checkpoint_step(p) for p in ckpt_lib.list_checkpoints(tmp_path)] == [2, 4, 5]


def test_resume_keeps_the_saved_config_and_names_what_changes(tmp_path, capsys):
    """train.py --config X --resume auto: the run's saved config wins over the file; --set / --max-steps
    change it, and both are named (a run started with --max-steps 2 is not extended to the file's 3)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_cli", ROOT / "train.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    cfg, run = write_yaml(tmp_path / "t.yaml", "train.max_steps=3", "train.ckpt_every=1"), tmp_path / "run"
    cli.main(["--config", str(cfg), "--out", str(run), "--max-steps", "2"])
    capsys.readouterr()
    cli.main(["--config", str(cfg), "--out", str(run), "--resume", "auto"])
    out = capsys.readouterr().out
    assert "the config file's train.max_steps differ and are not used" in out and sorted(losses(run)) == [1, 2]
    cli.main(["--config", str(cfg), "--out", str(run), "--resume", "auto", "--max-steps", "3"])
    assert "note: train.max_steps changed on resume: 2 -> 3" in capsys.readouterr().out
    assert sorted(losses(run)) == [1, 2, 3]


def test_an_input_error_of_a_launch_is_printed_by_the_main_process_first(monkeypatch, capsys):
    """Bad config or input: the main process (RANK 0) prints its line at once; another process waits
    ECHO_DELAY_S first (a launcher stops it when the main one exits, so a shared error shows once) and
    prints it only if still running; other run-ending errors are printed at once by every process."""
    from mutor2d.config import ConfigError
    from mutor2d.engine import entry
    from mutor2d.engine.entry import run_entry

    def fail(error):
        def main():
            raise error
        return main
    for rank, error, code, waited in (("0", ConfigError("run folder 'x' already has checkpoints"), 2, []),
                                      ("1", ConfigError("run folder 'x' already has checkpoints"), 2, [entry.ECHO_DELAY_S]),
                                      ("1", entry.Diverged("too many skipped updates"), 1, [])):
        monkeypatch.setenv("RANK", rank)
        slept = []
        monkeypatch.setattr(entry.time, "sleep", lambda s: slept.append((s, capsys.readouterr().err)))
        with pytest.raises(SystemExit) as e:
            run_entry(fail(error))
        assert e.value.code == code and capsys.readouterr().err == f"error: {error}\n"
        assert [s for s, _ in slept] == waited and all(err == "" for _, err in slept)   # nothing printed before
