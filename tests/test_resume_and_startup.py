"""Resume, start-up and fast command lines: the divergence guard of
language-model runs, a finished run resumed changes nothing, one start-up line per run, scaled
subprocess timeouts, named leaderboard rows, readable small grids and a hub card sampled from its own
weights (entry points that parse before importing torch, item 8: tests/test_help.py). Each test is one
row of docs/RELIABILITY.md."""
import contextlib
import io as text_io
import json
from pathlib import Path

import pytest

from mutor2d import checkpoint as ckpt_lib
from mutor2d.checkpoint import inference
from mutor2d.engine.entry import Diverged
from mutor2d.engine.runlog import read_log
from mutor2d.engine.loop import train

from conftest import demo_extra
from test_training import ROOT, tiny

pytestmark = pytest.mark.usefixtures("one_thread")

LM_DATA = ROOT / "tests" / "data" / "lm_tiny.jsonl"


def tiny_llama(folder: Path) -> Path:
    """The README's tiny Llama (python -m mutor2d.lm.tiny) with the arithmetic character tokenizer."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from mutor2d.lm.tiny import write_tiny_llama
    return write_tiny_llama(folder)


def arith_data(path: Path, count: int = 64) -> Path:
    """Synthetic arithmetic problems as GSM8K lines (python -m mutor2d.lm.data arith)."""
    from mutor2d.lm.arith import arith_records
    path.write_text("".join(json.dumps(r) + "\n" for r in arith_records(count, [2], 0)))
    return path


def lm_config(base: Path, data: Path, **train_fields) -> dict:
    return {"task": "lm", "model": {"hf": str(base), "finetune": "full", "dtype": "float32"},
            "data": {"name": "gsm8k", "path": str(data), "max_prompt_len": 160, "max_answer_len": 64},
            "optim": {"lr": 3e-3, "schedule": "constant", "warmup_steps": 80},
            "train": {"batch_size": 8, "log_every": 1, "tracker": "none", "mixed_precision": "no", **train_fields}}


# ----------------------------------------------------------------------------- item 9: LM divergence

def test_an_exploding_lm_update_is_judged_bad_and_its_last_good_checkpoint_kept(tmp_path):
    """The sweep's probe on the tiny Llama: resumed at optim.lr=1e6 (warming up: 87500 at the first
    update) with ckpt_every=1, keep_ckpts=1. That update's weights still give a normal loss (uniform
    predictions, ln V) and a zero gradient; their weight norm blows up, so the next update is skipped,
    the run diverges, and rotation never deletes the last checkpoint from before the change."""
    import mutor2d.lm as lm_pkg
    cfg = lm_config(tiny_llama(tmp_path / "base"), arith_data(tmp_path / "arith.jsonl"), max_steps=6,
                    ckpt_every=1, keep_ckpts=1)
    run = tmp_path / "run"
    lm_pkg.train(cfg, run)
    with pytest.raises(Diverged) as e:
        lm_pkg.train(cfg, run, ["optim.lr=1e6", "train.max_steps=16", "train.max_nonfinite=3"], resume="auto")
    good = ckpt_lib.checkpoint_path(run, 6)
    assert f"the last good checkpoint is {good}; continue from it with --resume auto" in str(e.value)
    assert ckpt_lib.list_checkpoints(run) == [good]
    assert (run / "checkpoints" / "step_00000007.pt.diverged").is_file()    # the exploded update's weights
    assert {r["step"]: r.get("skipped_blowup", 0) for r in read_log(run) if r["step"] > 6} == \
        {7: 0, 8: 1, 9: 1, 10: 1, 11: 1}


# ----------------------------------------------------------------------------- item 5: finished runs

def files_of(folder: Path) -> dict:
    """Every file under ``folder`` -> (modification time in ns, bytes)."""
    return {p.relative_to(folder).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def train_image(run: Path, resume=None):
    return train(tiny("train.max_steps=2", "train.ckpt_every=1", "train.tracker=tensorboard"), run, resume=resume)


def train_lm(run: Path, resume=None):
    import mutor2d.lm as lm_pkg
    base = tiny_llama(run.parent / "base")
    cfg = {"task": "lm", "model": {"hf": str(base), "finetune": "lora", "lora_targets": ["q_proj", "v_proj"]},
           "data": {"path": str(LM_DATA)}, "optim": {"lr": 1e-2},
           "train": {"batch_size": 4, "max_steps": 2, "log_every": 1, "ckpt_every": 1, "tracker": "none"}}
    return lm_pkg.train(cfg, run, resume=resume)


def train_vq(run: Path, resume=None):
    from mutor2d.vq.config import load_config
    from mutor2d.vq.run import train as vq_train
    sets = ["model.preset=tiny", "data.eval_images=16", "train.batch_size=4", "train.max_steps=2",
            "train.log_every=1", "train.ckpt_every=1", "train.eval_every=1", f"train.out_dir={run}"]
    return vq_train(load_config("vq_digits", sets), resume=resume)


KINDS = {"image": train_image, "lm": train_lm, "vq": train_vq}


@pytest.fixture(scope="module", params=sorted(KINDS))
def finished(request, tmp_path_factory):
    """(run kind, a run of it trained to train.max_steps, what that run printed)."""
    run = tmp_path_factory.mktemp(request.param) / "run"
    out = text_io.StringIO()
    with contextlib.redirect_stdout(out):
        KINDS[request.param](run)
    return request.param, run, out.getvalue()


def test_resuming_a_finished_run_prints_nothing_to_do_and_rewrites_no_file(finished, capsys):
    kind, run, _ = finished
    before = files_of(run)
    capsys.readouterr()
    KINDS[kind](run, resume="auto")
    assert "nothing to do: the run is at step 2, train.max_steps is 2" in capsys.readouterr().out
    after = files_of(run)
    assert sorted(after) == sorted(before)
    assert [name for name in before if after[name] != before[name]] == []


def test_a_run_killed_before_its_final_folder_writes_it_on_resume(finished, capsys):
    """An LM run that reached max_steps (its last checkpoint written) but died before its model folder
    was complete: --resume auto writes the folder instead of saying nothing to do."""
    from mutor2d.lm.hf import INFERENCE_FILE
    kind, run, _ = finished
    if kind != "lm":
        pytest.skip("only language-model runs write a final folder (image and VQ results are their checkpoints)")
    (run / INFERENCE_FILE).unlink()
    capsys.readouterr()
    KINDS[kind](run, resume="auto")
    printed = capsys.readouterr().out
    assert "nothing to do" not in printed and "writing the final outputs" in printed, printed
    assert (run / INFERENCE_FILE).is_file()


# ----------------------------------------------------------------------------- item 7: start-up line

def test_every_run_kind_starts_with_one_line_naming_device_parameters_and_folder(finished):
    kind, run, printed = finished
    lines = [line for line in printed.splitlines() if line.startswith(f"{kind} run on ")]
    assert len(lines) == 1, printed
    assert lines[0].startswith(f"{kind} run on cpu: ") and " parameters (" in lines[0]
    assert lines[0].endswith(f" trained); run folder {run}")


def test_subprocess_timeouts_scale_with_one_variable_and_fail_saying_so(tmp_path):
    """MUTOR2D_TEST_TIMEOUT_SCALE scales every limit (tests/timeouts.py); a subprocess past its limit
    fails its test in one line naming the timeout and the scaled limit (tests/conftest.py)."""
    import os
    import subprocess
    import sys
    from timeouts import SCALE_VAR, limit
    (tmp_path / "test_slow.py").write_text(
        "import subprocess, sys\nfrom timeouts import limit\n\n\ndef test_slow():\n"
        "    subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'], timeout=limit(2))\n")
    env = {**os.environ, SCALE_VAR: "0.25", "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "conftest", "-q",
                        "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "t"), str(tmp_path / "test_slow.py")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=limit(120))
    assert r.returncode == 1, r.stdout[-2000:]
    assert "timeout: " in r.stdout and f"ran past its limit of 0.5 s ({SCALE_VAR}=0.25" in r.stdout, r.stdout[-2000:]
    assert "Traceback" not in r.stdout
    os.environ[SCALE_VAR], old = "3", os.environ.get(SCALE_VAR)
    try:
        assert limit(120) == 360
        os.environ[SCALE_VAR] = "0"
        with pytest.raises(ValueError, match=f"{SCALE_VAR}='0': expected a number > 0"):
            limit(1)
    finally:
        os.environ.pop(SCALE_VAR) if old is None else os.environ.__setitem__(SCALE_VAR, old)


# ----------------------------------------------------------------------------- item 8: config errors before torch

CONFIG_ERROR_PROBE = """
import contextlib, importlib.abc, io, json, os, runpy, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError(f"{name} imported before the config was checked")
        return None

sys.meta_path.insert(0, NoTorch())
entry, runs = sys.argv[1], []
sys.path[0] = os.path.dirname(os.path.abspath(entry))              # as python SCRIPT has it
for argv in json.loads(sys.argv[2]):
    sys.argv, err = [entry, *argv], io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            runpy.run_path(entry, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code
    except Exception as e:
        code = repr(e)
    runs.append([code, err.getvalue()])
print(json.dumps({"runs": runs, "torch": "torch" in sys.modules}))
"""


def test_a_config_error_of_train_py_is_reported_before_torch_is_imported(tmp_path):
    """Every config error of a fresh run (a key, a value, a variant, a section, a task, an empty file;
    image, lm and vq configs) is one line on stderr naming it, exit 2, and torch never imported: the
    sections' config modules import no torch and train.py checks the config before the engine."""
    import subprocess
    import sys
    from timeouts import limit
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    (tmp_path / "section.yaml").write_text("model: {preset: tiny}\nnosuch: {x: 1}\n")
    (tmp_path / "task.yaml").write_text("task: nope\n")
    digits = ["--config", "digits_mutor2d.yaml", "--set"]
    cases = [([*digits, "objective.foo=1"], "objective.foo"), ([*digits, "model.n_head=0"], "model.n_head"),
             ([*digits, "objective.name=nope"], "objective.name"), ([*digits, "nosuch.x=1"], "'nosuch'"),
             (["--config", str(tmp_path / "section.yaml")], "'nosuch'"),
             (["--config", "lm_tiny_arith.yaml", "--set", "objective.foo=1"], "objective.foo"),
             (["--config", "vq_digits.yaml", "--set", "model.foo=1"], "model.foo"),
             (["--config", str(tmp_path / "empty.yaml")], "is empty"),
             (["--config", str(tmp_path / "task.yaml")], "task:")]
    r = subprocess.run([sys.executable, "-c", CONFIG_ERROR_PROBE, str(ROOT / "train.py"),
                        json.dumps([argv for argv, _ in cases])], cwd=tmp_path, capture_output=True, text=True,
                       timeout=limit(120))
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.splitlines()[-1])
    for (argv, key), (code, err) in zip(cases, out["runs"]):
        assert code == 2 and err.startswith("error: ") and key in err and err.count("\n") == 1, (argv, code, err)
    assert out["torch"] is False


def test_the_built_in_attention_backends_a_config_checks_without_torch_are_registered():
    """model.attention's built-in names (mutor2d.model.config, no torch) are the registry's."""
    from mutor2d.model.attention import BACKENDS
    from mutor2d.model.config import BUILT_IN_BACKENDS
    assert set(BUILT_IN_BACKENDS) <= set(BACKENDS)


# ----------------------------------------------------------------------------- item 7: outputs say what they are

def test_the_leaderboard_names_its_runs_and_shows_the_decoding_mode(tmp_path):
    from mutor2d.evaluation import records
    for seed, decode in ((0, "plain"), (1, "plain"), (2, "registers")):
        rec = {"method": "ntp", "objective": {"name": "ntp"}, "step": 500, "metrics": {"fid": 9.0 + seed},
               "evaluator": {"feature_extractor": "digits"}, "reference": "digits:train", "n": 100,
               "sampling": {"decode": decode}, "seed": seed, "samples": f"s{seed}.npz"}
        records.write_record(rec, tmp_path / f"ntp_seed{seed}" / "eval")
    table = records.markdown_table(records.read_records(sorted(tmp_path.iterdir()))[0])
    head, _, *rows = table.splitlines()
    cells = [[c.strip() for c in row.split("|")[1:-1]] for row in rows]
    assert head.startswith("| run | method |") and "| n | decoding |" in head
    at = [c.strip() for c in head.split("|")[1:-1]].index("decoding")
    assert [(c[0], c[at]) for c in cells] == [("ntp_seed0", "plain"), ("ntp_seed1", "plain"),
                                              ("ntp_seed2", "registers")]


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    """A tiny digits run (2 steps, sample grid of 1 per class for classes 0 and 7)."""
    run = tmp_path_factory.mktemp("image") / "run"
    train(tiny("train.max_steps=2", "train.ckpt_every=1"), run)
    return run


def test_a_one_per_class_grid_is_written_at_a_readable_size(image_run, tmp_path):
    from PIL import Image

    from test_reliability_v2 import script
    out = tmp_path / "one.png"
    script("sample")(["--ckpt", str(image_run), "--per-class", "1", "--device", "cpu", "--out", str(out)])
    assert min(Image.open(out).size) >= 256


def test_the_hub_card_picture_is_sampled_from_the_weights_it_ships(image_run, tmp_path):
    """A training grid older than the checkpoint (Ctrl-C between sample intervals) is never the card's."""
    import shutil
    demo_extra("huggingface_hub")
    from mutor2d import hub
    from mutor2d.sampling import images as generation
    from mutor2d.data.tokens import build_tokenizer
    run = tmp_path / "run"
    shutil.copytree(image_run, run)
    (run / "samples" / "step_00000002.png").write_bytes(b"a grid of older weights")
    out = tmp_path / "hub"
    hub.MutorModel.from_checkpoint(run).save_pretrained(out)
    model, cfg, meta = inference.open_model(out / "model.safetensors")
    expected = generation.write_grid(model, build_tokenizer(cfg.data), tuple(meta["grid"]), cfg.sample,
                                     generation.grid_classes(cfg.sample, cfg.model.num_classes), tmp_path / "x.png",
                                     objective=cfg.objective)
    assert (out / "sample.png").read_bytes() == expected.read_bytes()


def test_a_run_prints_its_evaluations_and_ends_with_a_summary_naming_absolute_paths(tmp_path, monkeypatch, capsys):
    """Started from another folder with a relative --out: the start-up line, each evaluation and the
    closing summary (steps, time, last loss, last evaluation, newest checkpoint, run folder) name it absolutely."""
    from mutor2d.engine.runlog import read_log
    from mutor2d.engine.loop import train
    from test_training import tiny
    monkeypatch.chdir(tmp_path)
    train(tiny("train.max_steps=4", "train.eval_every=4", "train.eval_per_class=1", "train.ckpt_every=4"),
          "runs/rel")
    lines = capsys.readouterr().out.splitlines()
    run = (tmp_path / "runs" / "rel").resolve()
    assert lines[0].endswith(f"run folder {run}")
    log = read_log(run)
    evals = [r for r in log if "eval_fid" in r]
    assert [r["step"] for r in evals] == [4]
    assert f"step 4: evaluation fid {evals[0]['eval_fid']:.4g}, " in "\n".join(lines)
    end = lines[-1]
    loss = [r["loss"] for r in log if "loss" in r][-1]
    assert end.startswith("done: steps 1-4 in 0 min ") and f"last logged loss {loss:.4f}" in end
    assert f"evaluation at step 4: fid {evals[0]['eval_fid']:.4g}" in end
    assert f"newest checkpoint {run / 'checkpoints' / 'step_00000004.pt'}" in end and f"run folder {run}" in end


def test_the_summary_of_a_run_without_loss_evaluation_or_checkpoint(tmp_path):
    from mutor2d.engine.runlog import summary
    (tmp_path / "log.jsonl").write_text('{"step": 1, "lr": 0.1, "skipped_blowup": 1}\n')
    line = summary(tmp_path, 1, 1, 125.4, None)
    assert line == f"done: steps 1-1 in 2 min 5 s; no loss logged; run folder {tmp_path.absolute()}"


def test_a_sharded_checkpoint_of_the_key_scheme_before_is_refused_in_one_line(tmp_path):
    """A folder written before mutor2d.checkpoint.state's key scheme (the optimizer's entries under
    "optim", the TrainModule's under "model") is not read: one line names what changed."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from mutor2d.checkpoint import sharded
    old = tmp_path / "step_00000002.dcp"
    with warnings.catch_warnings():              # "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore")
        dcp.save({"model": {"model.w": torch.zeros(2)}, "optim": {"state": {"model.w": {"step": torch.ones(())}}}},
                 checkpoint_id=str(old))
    for read in (sharded.metadata, sharded.stored_parts):
        with pytest.raises(ckpt_lib.CheckpointError) as e:
            read(old)
        assert "\n" not in str(e.value) and str(e.value).endswith(
            "was written by an older version (entries model.model.*, optim.*; now model.*, objective.*, "
            "optimizer.*): this version does not read it")
