"""Sharded training (train.sharding=fsdp, FSDP2 over 2 gloo CPU processes): the same losses and weights
as DDP on the same processes' random streams, the same losses as one process on the same global batch,
sharded checkpoints that resume bit-exactly and load into DDP, one process and a safetensors export,
train.py under accelerate launch stopping with exit 75 on every process, and crafted sharded
checkpoints (tests/hostile.py) that run no code through any reader, on one process or two.

The 2-process runs happen in one launch of this file as a script (``worker``): starting processes is
the expensive part on 2 CPU cores."""
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile  # noqa: E402
from conftest import demo_extra  # noqa: E402
from test_training import ROOT, env, losses, losses_so_far, tiny, write_yaml  # noqa: E402

from mutor2d import checkpoint as ckpt_lib  # noqa: E402
from mutor2d.checkpoint import inference  # noqa: E402
from mutor2d.checkpoint.__main__ import main as checkpoint_main  # noqa: E402
from mutor2d.engine.runlog import read_log  # noqa: E402
from mutor2d.engine.loop import train  # noqa: E402
from timeouts import limit  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

PY = sys.executable
COMMON = ["train.max_steps=3", "train.grad_accum=2", "train.ema=true", "train.ema_decay=0.5",
          "train.ckpt_every=2", "train.sample_every=100"]
OBJECTIVES = {"ntp": ["objective.name=ntp"], "dense": [],
              "sparse": ["objective.placement=sparse", "objective.num_registers=12"],
              "multihead": ["objective.name=multihead", "objective.d_max=2"]}
NO_DROPOUT = ["objective.name=ntp", "model.token_dropout=0", "model.resid_dropout=0", "model.ffn_dropout=0",
              "model.attn_dropout=0", "model.class_dropout=0"]


def worker_runs(out: Path) -> dict[str, list[str]]:
    """name -> overrides of the runs the 2-process worker makes into ``out/name`` (in this order)."""
    runs = {}
    for name, over in OBJECTIVES.items():
        for sharding in ("ddp", "fsdp"):
            runs[f"{name}_{sharding}"] = [*over, *COMMON, f"train.sharding={sharding}"]
    runs["dense_fsdp_recompute"] = [*COMMON, "train.sharding=fsdp", "train.activation_checkpointing=true"]
    runs["nodrop_fsdp"] = [*NO_DROPOUT, *COMMON, "train.sharding=fsdp"]
    stop = ckpt_lib.checkpoint_path(out / "sparse_fsdp", 2).with_suffix(".dcp")
    for sharding in ("fsdp", "ddp"):               # continue the sharded step-2 checkpoint both ways
        runs[f"sparse_resumed_{sharding}"] = [*OBJECTIVES["sparse"], *COMMON, f"train.sharding={sharding}",
                                              f"@resume={stop}"]
    full = ckpt_lib.checkpoint_path(out / "sparse_ddp", 2)     # and a DDP checkpoint into FSDP
    runs["sparse_from_ddp_fsdp"] = [*OBJECTIVES["sparse"], *COMMON, "train.sharding=fsdp", f"@resume={full}"]
    return runs


def worker(out: Path) -> None:
    """Run ``worker_runs`` on every process of a torchrun launch."""
    import accelerate.state
    # train() ends by destroying the process group; this process trains several runs in a row
    accelerate.state.PartialState.destroy_process_group = lambda self, group=None: None
    for name, over in worker_runs(out).items():
        resume = next((o[len("@resume="):] for o in over if o.startswith("@resume=")), None)
        train(tiny(*[o for o in over if not o.startswith("@")]), out / name, resume=resume)
    for kind in HOSTILE_2P:
        resume_past_crafted(out, kind)


HOSTILE_2P = ("nested", "bytes_entry")       # crafted checkpoints resumed past on 2 processes


def crafted_run(src: Path, run: Path, kind: str, marker: Path) -> Path:
    """A copy of run folder ``src`` (checkpoints of steps 2 and 3, no log) whose step-3 checkpoint is
    crafted as ``kind`` (tests/hostile.py); -> that checkpoint."""
    shutil.copytree(src, run)
    (run / "log.jsonl").unlink()
    return hostile.craft(ckpt_lib.checkpoint_path(run, 3).with_suffix(".dcp"), kind, marker)


def resume_past_crafted(out: Path, kind: str) -> None:
    """Every process: --resume auto on a copy of sparse_fsdp whose newest checkpoint is crafted."""
    import torch.distributed as dist
    run = out / f"hostile_{kind}"
    if dist.get_rank() == 0:
        crafted_run(out / "sparse_fsdp", run, kind, out / f"ran_{kind}")
    dist.barrier()
    train(tiny(*OBJECTIVES["sparse"], *COMMON, "train.sharding=fsdp"), run, resume="auto")


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    r = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__, str(out)],
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=limit(300))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return out


def close(a: dict, b: dict, rel: float) -> bool:
    return sorted(a) == sorted(b) and all(abs(a[s] - b[s]) <= rel * abs(b[s]) for s in a)


def weights(run_dir, use_ema: bool = False) -> dict:
    """The GPT weights of a run's newest checkpoint (file or sharded folder)."""
    return inference.load_weights(run_dir, use_ema)[0]


def same_weights(a: dict, b: dict, rel: float) -> bool:
    """Every tensor within ``rel`` of the other in norm (AdamW turns float rounding of the gradient
    reductions into ~1e-6 differences in single elements, so no element-wise bound)."""
    return sorted(a) == sorted(b) and all(torch.linalg.vector_norm(a[k] - b[k]) <= rel * torch.linalg.vector_norm(b[k])
                                          for k in a)


@pytest.mark.parametrize("objective", list(OBJECTIVES))
def test_fsdp_matches_ddp_on_the_same_random_streams(two_process_runs, objective):
    """Dropout, label dropout and register layouts drawn from the same per-process streams: losses,
    gradient norms (before clipping), final weights and EMA agree to 1e-5; the sharded run wrote
    step_N.dcp/ folders, DDP .pt files."""
    ddp, fsdp = two_process_runs / f"{objective}_ddp", two_process_runs / f"{objective}_fsdp"
    a, b = losses(fsdp), losses(ddp)
    assert sorted(a) == [1, 2, 3] and close(a, b, 1e-5), (a, b)
    norms = [{r["step"]: r["grad_norm"] for r in read_log(d)} for d in (fsdp, ddp)]  # clipped over all shards
    assert close(*norms, 1e-5) and all(v > 0 for v in norms[0].values()), norms
    assert [p.name for p in ckpt_lib.list_checkpoints(fsdp)] == ["step_00000002.dcp", "step_00000003.dcp"]
    assert [p.name for p in ckpt_lib.list_checkpoints(ddp)] == ["step_00000002.pt", "step_00000003.pt"]
    for use_ema in (False, True):
        assert same_weights(weights(fsdp, use_ema), weights(ddp, use_ema), 1e-5)
    assert not same_weights(weights(fsdp, True), weights(fsdp, False), 1e-3)   # EMA lags
    assert (fsdp / "samples" / "step_00000003.png").stat().st_size > 0              # gathered weights


def test_activation_checkpointing_keeps_the_losses(two_process_runs):
    a, b = losses(two_process_runs / "dense_fsdp_recompute"), losses(two_process_runs / "dense_fsdp")
    assert close(a, b, 1e-6), (a, b)


def test_two_sharded_processes_match_one_process(two_process_runs, tmp_path):
    """No dropout, NTP: 2 FSDP processes x 2 micro-batches = one process's global batch of 8."""
    train(tiny(*NO_DROPOUT, *COMMON), tmp_path)
    a, b = losses(two_process_runs / "nodrop_fsdp"), losses(tmp_path)
    assert close(a, b, 1e-5), (a, b)


def test_sharded_checkpoint_resumes_exactly_and_loads_anywhere(two_process_runs, tmp_path):
    """Step 2's sharded checkpoint: FSDP on 2 processes continues bit-exactly (weights, EMA, optimizer,
    RNG streams); DDP on 2 processes continues to 1e-5, and so does FSDP from DDP's step-2 file; one
    process continues; the export is one file holding the EMA weights."""
    straight = two_process_runs / "sparse_fsdp"
    resumed = losses(two_process_runs / "sparse_resumed_fsdp")
    assert sorted(resumed) == [3] and resumed[3] == losses(straight)[3]
    for use_ema in (False, True):
        a, b = weights(two_process_runs / "sparse_resumed_fsdp", use_ema), weights(straight, use_ema)
        assert all(torch.equal(a[k], b[k]) for k in b)
    assert close(losses(two_process_runs / "sparse_resumed_ddp"), {3: losses(straight)[3]}, 1e-5)
    from_ddp = two_process_runs / "sparse_from_ddp_fsdp"                  # a DDP .pt into FSDP
    assert close(losses(from_ddp), {3: losses(straight)[3]}, 1e-5)
    assert same_weights(weights(from_ddp, True), weights(straight, True), 1e-5)
    stop = ckpt_lib.checkpoint_path(straight, 2).with_suffix(".dcp")
    cfg = tiny(*OBJECTIVES["sparse"], *COMMON, "train.sharding=fsdp")
    train(cfg, tmp_path / "one", resume=str(stop))                 # RNG streams of 2 processes: fresh ones
    one = losses(tmp_path / "one")
    assert sorted(one) == [3] and math.isfinite(one[3])
    assert ckpt_lib.list_checkpoints(tmp_path / "one")[-1].suffix == ".pt"     # one process: unsharded
    out = tmp_path / "w.safetensors"
    checkpoint_main(["export", str(straight), str(out)])             # python -m mutor2d.checkpoint export
    from safetensors.torch import load_file
    exported, ema = load_file(str(out)), weights(straight, use_ema=True)
    assert sorted(exported) == sorted(ema) and all(torch.equal(exported[k], ema[k]) for k in ema)
    assert inference.read_meta(out)["has_ema"] and inference.read_meta(straight)["step"] == 3


def test_cut_sharded_checkpoints_are_skipped(two_process_runs, tmp_path):
    """--resume auto: a sharded folder without DCP's .metadata (a cut save) is set aside as
    *.unreadable, the older one is used; a temp folder of a killed save is removed at start."""
    run = tmp_path / "run"
    shutil.copytree(two_process_runs / "sparse_fsdp", run)
    (ckpt_lib.checkpoint_path(run, 3).with_suffix(".dcp") / ".metadata").unlink()
    stale = run / "checkpoints" / ".step_00000004.dcp.tmp"
    stale.mkdir()
    train(tiny(*OBJECTIVES["sparse"], *COMMON), run, resume="auto")
    assert not stale.exists() and (run / "checkpoints" / "step_00000003.dcp.unreadable").is_dir()
    assert [p.name for p in ckpt_lib.list_checkpoints(run)] == ["step_00000002.dcp", "step_00000003.pt"]


def _exit_codes(output: str) -> dict[int, int]:
    """rank -> exit code from torchrun's failure report."""
    found = re.findall(r"rank\s*:\s*(\d+) \(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", output)
    return {int(rank): int(code) for rank, code in found}


def test_train_py_fsdp_stops_with_75_and_resumes(tmp_path):
    """accelerate launch train.py --set train.sharding=fsdp on 2 processes; SIGTERM to both: each writes
    its shards of the stop checkpoint and exits 75; --resume auto finds it and continues on one process.
    (Bit-exact continuation on 2 processes: test_sharded_checkpoint_resumes_exactly_and_loads_anywhere.)"""
    over = [*OBJECTIVES["sparse"], "train.max_steps=1000", "train.ckpt_every=2", "train.keep_ckpts=2",
            "train.sample_every=0", "optim.schedule=constant"]
    cfg, run = write_yaml(tmp_path / "t.yaml", *over), tmp_path / "run"
    launch = [PY, "-m", "accelerate.commands.launch", "--main_process_port", "0", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", str(ROOT / "train.py"), "--config", str(cfg),
              "--out", str(run), "--set", "train.sharding=fsdp"]
    with open(tmp_path / "out.txt", "w+") as log:
        proc = subprocess.Popen(launch, cwd=ROOT, env=env(), stdout=log, stderr=subprocess.STDOUT)
        end = time.time() + limit(120)
        while proc.poll() is None and time.time() < end and max(losses_so_far(run) or [0]) < 3:
            time.sleep(0.05)
        for pid in _children(proc.pid):
            os.kill(pid, signal.SIGTERM)
        proc.wait(timeout=limit(120))
    text = (tmp_path / "out.txt").read_text()
    assert _exit_codes(text) == {0: 75, 1: 75}, text[-3000:]
    assert text.count("continue with --resume auto") == 2
    k = max(losses(run))
    found = [p.name for p in ckpt_lib.list_checkpoints(run)]
    assert k >= 3 and found[-1] == f"step_{k:08d}.dcp" and len(found) == 2, found    # rotated to 2
    assert not list((run / "checkpoints").glob(".*"))                                 # no temp folder left
    train(tiny(*over, f"train.max_steps={k + 2}"), run, resume="auto")                # one process
    assert sorted(losses(run)) == list(range(1, k + 3)) and all(math.isfinite(v) for v in losses(run).values())
    assert ckpt_lib.list_checkpoints(run)[-1].name == f"step_{k + 2:08d}.pt"


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


if __name__ == "__main__":
    torch.set_num_threads(1)
    worker(Path(sys.argv[1]))
    import launched
    launched.exit_worker()


def test_llamagen_384_configs():
    """configs/llamagen_{xl,xxl,3b}_384_{ntp,mutor2d}.yaml: LlamaGen's 384-px recipe; XXL and 3B shard."""
    from mutor2d import config as C
    from mutor2d.model.config import model_shape
    shapes = {"xl": (36, 20, 1280), "xxl": (48, 24, 1536), "3b": (24, 32, 3200)}
    for size, shape in shapes.items():
        for objective in ("ntp", "mutor2d"):
            cfg = C.load(f"llamagen_{size}_384_{objective}.yaml")
            s, t = model_shape(cfg.model), cfg.train
            assert (s.n_layer, s.n_head, s.dim) == shape and s.dim % s.n_head == 0
            assert (t.batch_size, cfg.optim.lr, t.mixed_precision) == (256, 1e-4, "bf16")
            assert (t.sharding, t.activation_checkpointing) == (("auto", False) if size == "xl" else ("fsdp", True))
            assert cfg.objective.name == {"ntp": "ntp", "mutor2d": "mutor-2d"}[objective]


def test_a_flipped_byte_in_a_sharded_checkpoint_is_caught(two_process_runs, tmp_path):
    """Sharded checkpoints are verified like the others: meta.pt holds each DCP file's SHA-256."""
    src = ckpt_lib.checkpoint_path(two_process_runs / "sparse_fsdp", 3).with_suffix(".dcp")
    run = tmp_path / "run"
    shutil.copytree(src, ckpt_lib.checkpoint_path(run, 3).with_suffix(".dcp"))
    inference.load_weights(run)                                          # intact: loads
    shard = max((p for p in ckpt_lib.list_checkpoints(run)[-1].glob("*.distcp")), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ckpt_lib.CheckpointError, match="do not match the checksum stored at save"):
        inference.load_weights(run)


@pytest.mark.parametrize("kind", HOSTILE_2P)
def test_two_processes_resume_past_a_crafted_checkpoint(two_process_runs, kind):
    """FSDP on 2 processes, --resume auto: the crafted step-3 folder is set aside (kept, renamed) on
    every process alike, the run continues bit-exactly from step 2, and the payload never ran."""
    run = two_process_runs / f"hostile_{kind}"
    assert not (two_process_runs / f"ran_{kind}").exists()
    assert (run / "checkpoints" / "step_00000003.dcp.unreadable" / ".metadata").is_file()
    assert losses(run) == {3: losses(two_process_runs / "sparse_fsdp")[3]}


def _sample_py():
    import importlib.util
    spec = importlib.util.spec_from_file_location("sample_cli", ROOT / "sample.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _one_line_error(call, capsys) -> str:
    """The message of ``call``'s one-line failure (SystemExit or ConfigError), from it or stderr."""
    from mutor2d.config import ConfigError
    with pytest.raises((SystemExit, ConfigError)) as e:
        call()
    printed = isinstance(e.value, SystemExit) and isinstance(e.value.code, int)     # printed, then exit 2
    text = capsys.readouterr().err if printed else str(e.value)
    assert len(text.strip().splitlines()) == 1, text
    return text


@pytest.mark.parametrize("kind", hostile.KINDS)
def test_a_crafted_sharded_checkpoint_runs_no_code_through_any_reader(two_process_runs, tmp_path, kind, capsys):
    """export, hub save, sample.py, train.init_from: one line naming the folder and what was refused;
    --resume auto: the folder set aside and named, the run continued from step 2; the payload
    (``os.system("touch MARKER")``) never ran. Fails on DCP's own reader (plain pickle.load)."""
    from mutor2d import hub
    marker = tmp_path / "ran"
    crafted = crafted_run(two_process_runs / "sparse_fsdp", tmp_path / "run", kind, marker)
    readers = {"export": lambda: checkpoint_main(["export", str(crafted), str(tmp_path / "w.safetensors")]),
               "hub save": lambda: hub.main(["save", str(crafted), str(tmp_path / "hub")]),
               "sample.py": lambda: _sample_py().main(["--ckpt", str(crafted), "--classes", "1", "--per-class", "1",
                                                       "--device", "cpu", "--out", str(tmp_path / "s.png")]),
               "init_from": lambda: train(tiny(f"train.init_from={crafted}"), tmp_path / "init")}
    for name, read in readers.items():
        text = _one_line_error(read, capsys)
        assert str(crafted) in text and re.search(r"refused|not a DCP metadata file|unreadable", text), (name, text)
    assert not list(tmp_path.glob("w.safetensors*")) and not (tmp_path / "hub").exists()
    capsys.readouterr()
    train(tiny(*OBJECTIVES["sparse"], *COMMON), tmp_path / "run", resume="auto")
    assert f"skipped {crafted}" in capsys.readouterr().err
    assert crafted.with_name(crafted.name + ".unreadable").is_dir() and sorted(losses(tmp_path / "run")) == [3]
    assert not marker.exists()


def test_sample_py_and_app_py_refuse_a_crafted_checkpoint_in_one_line(two_process_runs, tmp_path):
    """The command lines themselves (their own processes): exit 2, one line, the payload never ran."""
    demo_extra("gradio")
    marker = tmp_path / "ran"
    crafted = crafted_run(two_process_runs / "sparse_fsdp", tmp_path / "run", "nested", marker)
    for command in (["sample.py", "--ckpt", str(crafted), "--classes", "1", "--per-class", "1", "--device", "cpu"],
                    ["app.py", "--ckpt", str(crafted), "--device", "cpu"]):
        r = subprocess.run([PY, *command], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=limit(300))
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "refused" in lines[0] and str(crafted) in lines[0], r.stderr
    assert not marker.exists()


def test_every_class_torch_writes_for_our_states_is_allowed(two_process_runs):
    """The allow-list against what DCP wrote for the image states of this project (the model with each
    objective, EMA, optimizer, sharded by FSDP2 over 2 processes; the LM ones: test_fsdp_lm.py): each
    name their pickles hold is allowed, their stored values pass, and nothing is allowed that torch
    does not write (beyond the other dtypes and path classes)."""
    from mutor2d.checkpoint import safe_dcp
    folders = sorted(two_process_runs.glob("*/checkpoints/step_*.dcp"))
    assert len(folders) >= 10
    seen = set().union(*map(hostile.names_torch_wrote, folders))
    assert not hostile.refused_names(seen), hostile.refused_names(seen)
    optional = {("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath")}
    assert safe_dcp.ALLOWED - seen <= optional, safe_dcp.ALLOWED - seen


def test_one_launched_process_shards_on_a_one_rank_mesh(tmp_path):
    """torchrun with one process (as bench/gpu.sh runs it on one GPU): FSDP2 on a one-rank mesh, sharded
    checkpoints, --resume auto from one; a plain single process trains unsharded (.pt)."""
    cfg = write_yaml(tmp_path / "t.yaml", "train.max_steps=2", "train.ckpt_every=2", "train.sharding=fsdp")
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "train.py", "--config", str(cfg),
           "--out", str(tmp_path / "run")]
    for extra in ([], ["--max-steps", "3", "--resume", "auto"]):
        r = subprocess.run(cmd + extra, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=limit(300))
        assert r.returncode == 0, r.stderr[-3000:]
    assert [p.name for p in ckpt_lib.list_checkpoints(tmp_path / "run")] == ["step_00000002.dcp", "step_00000003.dcp"]
    assert sorted(losses(tmp_path / "run")) == [1, 2, 3]
