"""mutor2d.hub: save_pretrained / from_pretrained folders (local only, no network), read by sample.py,
train.init_from and locate.resolve like a run folder; the model card shows the run's numbers."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from mutor2d import config
from mutor2d import checkpoint
from mutor2d.checkpoint import inference, locate
from mutor2d.engine.loop import train
from conftest import demo_extra

demo_extra("huggingface_hub")
from mutor2d.hub import MutorModel  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

TINY = ["model.preset=tiny", "data.levels=5", "objective.d_max=3", "optim.warmup_steps=1", "train.batch_size=8",
        "train.max_steps=2", "train.log_every=1", "train.ckpt_every=0", "train.keep_ckpts=0", "train.tracker=none",
        "train.sample_every=0", "sample.classes=[0,7]", "sample.per_class=2"]


def tiny_run(out: Path) -> Path:
    """A few steps of digits_mutor2d.yaml with tiny settings -> its run folder."""
    train(config.load("digits_mutor2d.yaml", TINY), out)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tiny_run(tmp_path_factory.mktemp("hub") / "run")
    (folder / "eval").mkdir(exist_ok=True)
    (folder / "eval" / "digits.json").write_text(json.dumps(
        {"method": "MuToR-2D", "objective": {"name": "mutor-2d", "d_max": 3}, "step": 2, "n": 100,
         "metrics": {"fid": 43.21, "accuracy": 0.875}, "reference": "digits:train"}))
    return folder


@pytest.fixture(scope="module")
def saved(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("hub") / "digits_hub"
    (run / "samples" / "step_99999999_cfg2_seed0_plain.png").write_bytes(b"not the training grid")   # sample.py's
    MutorModel.from_checkpoint(run).save_pretrained(out)
    return out


def test_saved_folder_layout_and_card(saved, run):
    cfg = json.loads((saved / "config.json").read_text())
    assert cfg["format"] == "mutor2d" and cfg["grid"] == [8, 8] and cfg["step"] == inference.read_meta(run)["step"]
    assert cfg["tokenizer"] == {"data": "digits", "tokenizer": "pixel", "levels": 5}
    assert cfg["run_config"]["objective"]["name"] == "mutor-2d"
    card = (saved / "README.md").read_text()
    assert "library_name: mutor2d" in card and "43.21" in card and "](sample.png)" in card
    assert "python sample.py --ckpt THIS_FOLDER" in card and "d_max: 3" in card
    assert (saved / "sample.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"   # of its weights: test_resume_and_startup
    assert locate.resolve(saved) == saved / "model.safetensors"


def test_from_pretrained_gives_the_same_weights(saved, run):
    loaded = MutorModel.from_pretrained(str(saved))
    model, _, meta = inference.open_model(run)
    assert loaded.meta["step"] == meta["step"] and loaded.cfg.objective.name == "mutor-2d"
    for (k, a), (k2, b) in zip(loaded.model.state_dict().items(), model.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k


def test_not_a_model_folder_is_a_one_line_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(checkpoint.CheckpointError, match="is not a mutor2d model folder"):
        MutorModel.from_pretrained(str(tmp_path))


def test_sample_py_is_byte_identical_from_the_hub_folder(saved, run, tmp_path):
    spec = importlib.util.spec_from_file_location("sample_cli", ROOT / "sample.py")
    sample_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample_py)

    def grid(src, name):
        out = tmp_path / name
        sample_py.main(["--ckpt", str(src), "--classes", "1,7", "--per-class", "2", "--seed", "3",
                        "--device", "cpu", "--decode", "registers", "--out", str(out)])
        return out.read_bytes()
    assert grid(run, "run.png") == grid(saved, "hub.png")


def test_init_from_a_hub_folder(saved, tmp_path):
    out = tmp_path / "warm"
    train(config.load("digits_mutor2d.yaml", [*TINY, "train.max_steps=1", f"train.init_from={saved}"]), out)
    assert checkpoint.latest_valid(out) is not None
