"""Sharded fine-tuning of a Hugging Face causal LM (train.sharding=fsdp, FSDP2 over 2 gloo CPU processes):
a tiny Llama built from a config, fully fine-tuned or with LoRA, with MuToR-1D registers, gives DDP's
losses and final weights on the same processes' random streams, and DDP's online accuracy (evaluated
after every step, so steps 2 and 3 train after an evaluation). Its sharded checkpoints resume on 2 processes
and on one; crafted ones (tests/hostile.py) run no code. The 2-process runs happen in one launch of this file."""
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile  # noqa: E402
from test_training import ROOT, env, losses  # noqa: E402
from timeouts import limit  # noqa: E402

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

PY = sys.executable


def lm_config(base: Path, sharding: str, finetune: str) -> dict:
    return {"task": "lm", "model": {"hf": str(base), "finetune": finetune, "lora_targets": ["q_proj", "v_proj"]},
            "data": {"path": str(ROOT / "tests" / "data" / "lm_tiny.jsonl"), "group_by_length": False},
            "objective": {"name": "mutor-1d", "d_min": 1, "d_max": 3},
            "optim": {"lr": 3e-3, "grad_clip": 1.0},
            "train": {"batch_size": 4, "grad_accum": 2, "max_steps": 3, "log_every": 1, "ckpt_every": 3,
                      "eval_every": 1, "tracker": "none", "sharding": sharding},
            # 5 items in batches of 2: one process answers 2 batches, the other 1 (+ 1 padding batch)
            "eval": {"path": str(ROOT / "tests" / "data" / "lm_tiny.jsonl"), "limit": 5, "max_new_tokens": 4,
                     "batch_size": 2, "stop": [";"], "kind": "gsm8k"}}


def worker(out: Path) -> None:
    import accelerate.state

    import mutor2d.lm as lm_pkg
    accelerate.state.PartialState.destroy_process_group = lambda self, group=None: None   # several runs
    for finetune in ("full", "lora"):
        for sharding in ("ddp", "fsdp"):
            lm_pkg.train(lm_config(out / "base", sharding, finetune), out / f"{finetune}_{sharding}")
    import torch.distributed as dist
    for finetune in ("full", "lora"):                 # one more step from the sharded checkpoint, sharded
        run = out / f"{finetune}_fsdp_resumed"
        if dist.get_rank() == 0:
            shutil.copytree(out / f"{finetune}_fsdp", run)
        dist.barrier()
        lm_pkg.train(one_more_step(lm_config(out / "base", "fsdp", finetune)), run, resume="auto")


def one_more_step(cfg: dict) -> dict:
    return {**cfg, "train": {**cfg["train"], "max_steps": 4, "eval_every": 0}}


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    import subprocess

    from test_lm import _write_tiny_model
    from mutor2d.lm.offline_tokenizers import char_tokenizer
    out = tmp_path_factory.mktemp("fsdp_lm")
    _write_tiny_model(out / "base", char_tokenizer("0123456789+=;:sum "))
    r = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__, str(out)],
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=limit(300))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return out


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_sharded_lm_matches_ddp(two_process_runs, finetune):
    """Each decoder layer, then the rest, sharded; under LoRA the frozen base is sharded with its adapters."""
    from safetensors.torch import load_file
    ddp, fsdp = two_process_runs / f"{finetune}_ddp", two_process_runs / f"{finetune}_fsdp"
    a, b = losses(fsdp), losses(ddp)
    assert sorted(a) == [1, 2, 3] and all(abs(a[s] - b[s]) <= 1e-5 * abs(b[s]) for s in a), (a, b)
    assert (fsdp / "checkpoints" / "step_00000003.dcp").is_dir() and (ddp / "checkpoints" / "step_00000003.pt").is_file()
    name = "model.safetensors" if finetune == "full" else "adapter_model.safetensors"
    wa, wb = load_file(str(fsdp / name)), load_file(str(ddp / name))
    assert sorted(wa) == sorted(wb)
    assert all(torch.linalg.vector_norm(wa[k] - wb[k]) <= 1e-5 * torch.linalg.vector_norm(wb[k]) for k in wb)
    ra, rb = (load_file(str(d / "register_embedding.safetensors"))["register_embedding"] for d in (fsdp, ddp))
    assert torch.linalg.vector_norm(ra - rb) <= 1e-5 * torch.linalg.vector_norm(rb)
    if finetune == "full":
        assert json.loads((fsdp / "config.json").read_text())["model_type"] == "llama"
    else:
        assert sorted(wb) and all("lora" in k for k in wb)


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_sharded_online_accuracy_matches_ddp(two_process_runs, finetune, tmp_path):
    """Every process generates its share in step with the others: the per-item greedy outputs, the
    records and the logged accuracy are DDP's at every step, and the last step's outputs are those of
    a one-process evaluation of the saved run folder on the same batches."""
    from mutor2d.evaluation import records
    from mutor2d.lm import accuracy, hf
    from mutor2d.lm import prompts as lm_prompts
    from mutor2d.lm import records as lm_records
    runs = {s: two_process_runs / f"{finetune}_{s}" for s in ("ddp", "fsdp")}

    def outputs(run, step):
        lines = (run / "eval" / f"predictions_lm_tiny_step{step}.jsonl").read_text().splitlines()
        return [(r["index"], r["output"]) for r in map(json.loads, lines)]
    seen = {s: [outputs(d, step) for step in (1, 2, 3)] for s, d in runs.items()}
    assert seen["fsdp"] == seen["ddp"] and all([i for i, _ in o] == list(range(5)) for o in seen["fsdp"])
    assert len({text for o in seen["fsdp"] for _, text in o}) > 1          # outputs that can differ
    recs = {s: sorted((r["step"], r["n"], r["metrics"]["accuracy"], r["detail"]["no_answer"])
                      for r in records.read_records([d])[0]) for s, d in runs.items()}
    assert [r[:2] for r in recs["fsdp"]] == [(1, 5), (2, 5), (3, 5)] and recs["fsdp"] == recs["ddp"]
    logged = {s: [(r["step"], r["eval_accuracy"]) for r in map(json.loads, (d / "log.jsonl").read_text().splitlines())
                  if "eval_accuracy" in r] for s, d in runs.items()}
    assert logged["fsdp"] == logged["ddp"] == [(step, acc) for step, _, acc, _ in recs["ddp"]]
    assert not list((runs["fsdp"] / "eval").glob("*.part*"))
    tok, model = hf.load_tokenizer(runs["fsdp"]), hf.load_for_inference(runs["fsdp"])
    items = lm_prompts.eval_prompts(lm_records.load_located("jsonl", str(ROOT / "tests" / "data" / "lm_tiny.jsonl"))[:5], tok)
    for rank in (0, 1):                                   # the processes' batches, one after the other
        accuracy.predict(items, lambda b: hf.generate(model, tok, [it["prompt_ids"] for it in b], 4, [";"]),
                         tmp_path / "p.jsonl", "gsm8k", rank, 2, 2)
    assert [(r["index"], r["output"]) for r in accuracy.merge_parts(tmp_path / "p.jsonl")] == seen["fsdp"][-1]


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_sharded_lm_checkpoints_resume_on_two_processes_and_on_one(two_process_runs, finetune, tmp_path):
    """Step 3's sharded checkpoint continues on 2 processes (FSDP) and on one process (unsharded)."""
    assert sorted(losses(two_process_runs / f"{finetune}_fsdp_resumed")) == [1, 2, 3, 4]
    assert (two_process_runs / f"{finetune}_fsdp_resumed" / "checkpoints" / "step_00000004.dcp").is_dir()
    import mutor2d.lm as lm_pkg
    run = tmp_path / "run"
    shutil.copytree(two_process_runs / f"{finetune}_fsdp", run)
    cfg = one_more_step(lm_config(two_process_runs / "base", "ddp", finetune))
    lm_pkg.train(cfg, run, resume="auto")
    assert sorted(losses(run)) == [1, 2, 3, 4] and (run / "checkpoints" / "step_00000004.pt").is_file()


@pytest.mark.parametrize("kind", ["nested", "bytes_entry", "tensor_entry"])
@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_a_crafted_lm_checkpoint_runs_no_code(two_process_runs, finetune, kind, tmp_path, capsys):
    """--resume auto on a language-model run whose only checkpoint is crafted: it is set aside (kept,
    renamed) and named, the run refuses to start over in one line, and the payload never ran."""
    import mutor2d.lm as lm_pkg
    from mutor2d.config import ConfigError
    run, marker = tmp_path / "run", tmp_path / "ran"
    shutil.copytree(two_process_runs / f"{finetune}_fsdp", run)
    crafted = hostile.craft(run / "checkpoints" / "step_00000003.dcp", kind, marker)
    with pytest.raises(ConfigError, match="none of the 1 checkpoints .* is readable"):
        lm_pkg.train(one_more_step(lm_config(two_process_runs / "base", "ddp", finetune)), run, resume="auto")
    err = capsys.readouterr().err
    assert f"skipped {crafted}" in err and "refused" in err, err
    assert crafted.with_name(crafted.name + ".unreadable").is_dir() and not marker.exists()


def test_every_class_torch_writes_for_our_lm_states_is_allowed(two_process_runs):
    """The allow-list of mutor2d.checkpoint.safe_dcp against the LM states' DCP files (full and LoRA, sharded)."""
    folders = sorted(two_process_runs.glob("*/checkpoints/step_*.dcp"))
    assert len(folders) == 6
    seen = set().union(*map(hostile.names_torch_wrote, folders))
    assert not hostile.refused_names(seen), hostile.refused_names(seen)


if __name__ == "__main__":
    torch.set_num_threads(1)
    worker(Path(sys.argv[1]))
    import launched
    launched.exit_worker()