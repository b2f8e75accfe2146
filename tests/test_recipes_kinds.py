"""The dataset and run-kind recipes of docs/EXTENDING.md, built from the page's own code
blocks as a contributor would: each block is written verbatim into a module of its own, named in
MUTOR2D_PLUGINS, and run through train.py (train, resume) and, for the dataset, sample.py."""
import sys

import numpy as np
import pytest
import torch
import yaml

from mutor2d import config
from mutor2d.engine.runlog import read_log
from mutor2d.registry import REGISTRY
from test_recipes import ROOT, TINY, recipe_plugins, script

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """plugin(heading): that recipe as a plugin module (test_recipes.recipe_plugins)."""
    yield from recipe_plugins(tmp_path, monkeypatch, [REGISTRY])


def test_run_kind_recipe_trains_resumes_and_learns_the_chain(plugin, tmp_path, capsys):
    plugin("A run kind")
    cfg = {"task": "bigram", "data": {"vocab": 6, "count": 128},
           "train": {"log_every": 1, "ckpt_every": 10, "keep_ckpts": 0}}
    (tmp_path / "bigram.yaml").write_text(yaml.safe_dump(cfg))
    run, train = tmp_path / "run", script("train.py")
    train.main(["--config", str(tmp_path / "bigram.yaml"), "--out", str(run), "--max-steps", "20"])
    train.main(["--config", str(tmp_path / "bigram.yaml"), "--out", str(run), "--resume", "auto", "--max-steps", "30"])
    out = capsys.readouterr().out
    assert "bigram run on cpu" in out and "resuming from step 20" in out
    rows = [r for r in read_log(run) if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert rows[-1]["loss"] < 0.8 * rows[0]["loss"] and "sequences_per_s" in rows[0]
    saved = torch.load(run / "checkpoints" / "step_00000030.pt", weights_only=True)
    assert saved["config"]["task"] == "bigram" and saved["model"]["weight"].shape == (6, 6)
    loaded = config.from_dict(saved["config"])                     # the stored config reads back
    assert type(loaded).__name__ == "BigramConfig" and loaded.data.vocab == 6
    with pytest.raises(config.ConfigError, match="data.vocab: expected >= 2, got 1"):
        config.load({"task": "bigram", "data": {"vocab": 1}})


def test_an_unknown_task_is_one_line_naming_the_known_kinds(tmp_path, capsys):
    (tmp_path / "x.yaml").write_text(yaml.safe_dump({"task": "bigram"}))
    with pytest.raises(SystemExit) as e:
        script("train.py").main(["--config", str(tmp_path / "x.yaml"), "--out", str(tmp_path / "run")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "task: expected a run kind, one of ['image', 'lm', 'vq'], got 'bigram'" in err


def test_dataset_recipe_trains_and_samples(plugin, tmp_path):
    plugin("A dataset")
    cfg = {k: dict(v) for k, v in TINY.items()}
    cfg["data"] = {"name": "stripes", "side": 6, "count": 32}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    script("train.py").main(["--config", str(tmp_path / "run.yaml"), "--out", str(run)])
    rows = [r for r in read_log(run) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(np.isfinite(r["loss"]) for r in rows)
    saved = torch.load(run / "checkpoints" / "step_00000004.pt", weights_only=True)
    assert saved["grid"] == [6, 6] and saved["config"]["data"]["name"] == "stripes"
    assert (run / "samples" / "step_00000004.png").is_file()         # a sample grid from its tokenizer
    npz = run / "s.npz"
    script("sample.py").main(["--ckpt", str(run), "--npz", str(npz), "--num", "6", "--batch-size", "6",
                              "--device", "cpu"])
    images = np.load(npz)["images"]
    assert images.shape == (6, 6, 6, 3) and images.dtype == np.uint8
    with pytest.raises(config.ConfigError, match="data.side: expected >= 2, got 1"):
        config.make("data", name="stripes", side=1)
