"""The extension recipes of docs/EXTENDING.md ("A decoding mode", "Datasets and conditioning"), run as
written: each code block becomes a plugin module in a temporary folder, imported through
MUTOR2D_PLUGINS, and goes through the public commands (train.py -> sample.py -> eval/fid.py ->
eval/leaderboard.py; their ``main`` in this process, and sample.py once as a fresh process, which
imports the plugin from the environment alone). Also: a checkpoint written before ``sample.decode``
existed samples as before."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mutor2d import config
from mutor2d import checkpoint
from mutor2d.registry import REGISTRY, build
from mutor2d.sampling import images as generation
from mutor2d.sampling import npz as npz_files
from timeouts import limit

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


def recipe(name: str) -> str:
    """The code block of docs/EXTENDING.md that starts with the comment ``# name``."""
    text = (ROOT / "docs" / "EXTENDING.md").read_text()
    found = re.search(rf"```python\n# {re.escape(name)}\n(.*?)```", text, re.S)
    assert found, f"docs/EXTENDING.md has no recipe block '# {name}'"
    return found.group(1)


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    """A folder holding the two recipes as modules row_above and text_vectors."""
    folder = tmp_path_factory.mktemp("plugins")
    for name in ("row_above.py", "text_vectors.py"):
        (folder / name).write_text(recipe(name))
    return folder


def env(plugins: Path, modules: str) -> dict:
    """What a user sets: the plugin folder on PYTHONPATH, the modules in MUTOR2D_PLUGINS."""
    path = os.pathsep.join([str(plugins), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "MUTOR2D_PLUGINS": modules, "OMP_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": ""}


def command(args: list, plugins: Path, modules: str) -> subprocess.CompletedProcess:
    r = subprocess.run([PY, *map(str, args)], cwd=ROOT, env=env(plugins, modules), capture_output=True,
                       text=True, timeout=limit(120))
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def load_script(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem + "_script", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def imported(plugins, monkeypatch):
    """The plugins imported into this process as a command would (MUTOR2D_PLUGINS at config build);
    unregistered after, so other test modules see the shipped modes and kinds only."""
    from mutor2d.model.conditioning import CONDITIONING
    monkeypatch.syspath_prepend(str(plugins))
    monkeypatch.setenv("MUTOR2D_PLUGINS", "row_above,text_vectors")
    config.import_parts()
    yield
    REGISTRY.pop("sample.decode.row-above")
    CONDITIONING.pop("text-vectors")
    for module in ("row_above", "text_vectors"):
        sys.modules.pop(module)


TINY_RUN = {
    "model": {"preset": "tiny", "attention": "sdpa"},
    "data": {"name": "digits", "levels": 5},
    "objective": {"name": "mutor-2d", "d_max": 3},
    "train": {"batch_size": 8, "log_every": 1, "ckpt_every": 0, "keep_ckpts": 0, "tracker": "none", "seed": 3,
              "sample_every": 4},
    "sample": {"classes": [0, 7], "per_class": 1, "temperature": 0.0, "decode": {"name": "row-above"}},
}


def test_decoding_mode_recipe_trains_samples_scores_and_ranks(imported, tmp_path, capsys):
    """train.py with the plugin mode as the config's decoding mode (its training grid uses it), sample.py
    --decode row-above with a field of the mode set by --set (greedy: plain's images, in fewer forwards),
    then the record on the leaderboard."""
    import yaml
    cfg, run = tmp_path / "run.yaml", tmp_path / "run"
    cfg.write_text(yaml.safe_dump(TINY_RUN))
    load_script("train.py").main(["--config", str(cfg), "--out", str(run), "--max-steps", "4"])
    assert (run / "samples" / "step_00000004.png").is_file()
    npz, plain = run / "samples" / "row_above.npz", run / "samples" / "plain.npz"
    common = ["--ckpt", str(run), "--num", "20", "--batch-size", "20", "--device", "cpu", "--temperature", "0"]
    load_script("sample.py").main([*common, "--npz", str(npz), "--decode", "row-above", "--set", "sample.decode.draft=2"])
    load_script("sample.py").main([*common, "--npz", str(plain), "--decode", "plain"])
    assert "wrote" in capsys.readouterr().out
    images, labels, meta = npz_files.read_npz(npz)
    assert images.shape == (20, 8, 8, 3) and np.bincount(labels).tolist() == [2] * 10
    assert np.array_equal(images, npz_files.read_npz(plain)[0])               # exact: plain greedy's images
    assert (meta["decode"], meta["decode_options"]) == ("row-above", {"draft": 2})
    assert meta["decode_stats"]["forwards_per_sequence"] < 64                  # some drafts were kept
    assert len(meta["decode_stats"]["acceptance_by_distance"]) == 2
    load_script("eval/fid.py").main([str(npz), "--ref", "digits:train", "--metrics", "fid", "--device", "cpu",
                                     "--cache-dir", str(tmp_path / "cache"), "--quiet"])
    table = load_script("eval/leaderboard.py").main([str(run)])
    row = next(line for line in table.splitlines() if "row-above" in line)
    assert "| mutor-2d |" in row and "| 4 |" in row and "row-above draft=2:" in row


def test_decoding_mode_recipe_rules_are_one_line_errors(imported, monkeypatch):
    from mutor2d.sampling.config import decode_modes
    from mutor2d.sampling.decoding import generate
    from mutor2d.sampling.stats import DecodeStats
    assert "row-above" in decode_modes() and "row-above" not in decode_modes("text")
    cfg = config.from_dict({**TINY_RUN, "model": {"preset": "tiny", "num_classes": 10, "vocab_size": 5}})
    model = build(cfg.model)
    labels = torch.tensor([1, 2])
    want = generate(model, labels, (2, 3), temperature=0)
    assert torch.equal(generate(model, labels, (2, 3), temperature=0, decode="row-above", draft=3), want)
    stats = DecodeStats()
    sampled = generate(model, labels, (2, 3), decode="row-above", stats=stats, generator=torch.Generator().manual_seed(0))
    assert sampled.shape == (2, 6) and len(stats.summary()["acceptance_by_distance"]) == 3
    with pytest.raises(config.ConfigError, match=r"^sample.decode.draft: expected an integer >= 1, got 0$"):
        config.load(None, ["sample.decode.name=row-above", "sample.decode.draft=0"])
    monkeypatch.setenv("MUTOR2D_PLUGINS", "no_such_plugin")
    with pytest.raises(config.ConfigError, match=r"^MUTOR2D_PLUGINS: cannot import module 'no_such_plugin'"):
        config.import_parts()


def test_conditioning_recipe_samples_grids_and_npz_files(imported, plugins, tmp_path, capsys):
    """A text-vector kind (float (B, 2, 6) prefixes) from one plugin file: a checkpoint conditioned on it
    samples grids with its row names and npz files storing its prefixes, with plain and exact
    speculative decoding alike."""
    cfg = config.load(None, ["data.name=digits", "model.preset=tiny", "model.vocab_size=5",
                             "model.conditioning=text-vectors", "objective.name=mutor-2d", "objective.d_max=4",
                             "sample.per_class=2", "sample.temperature=0"])
    torch.manual_seed(0)
    model = build(cfg.model, register_token=True)
    assert "text_proj.weight" in model.state_dict() and "cls_embedding.embedding_table.weight" not in model.state_dict()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    run = tmp_path / "run"
    checkpoint.save_atomic({"model": model.state_dict(), "ema": None, "objective": {}, "step": 2,
                            "config": cfg.to_dict(), "grid": [8, 8]}, checkpoint.checkpoint_path(run, 2))
    npz = tmp_path / "text.npz"
    command(["sample.py", "--ckpt", run, "--npz", npz, "--num", 6, "--batch-size", 4, "--device", "cpu",
             "--decode", "registers"], plugins, "text_vectors")
    images, labels, meta = npz_files.read_npz(npz)
    with np.load(npz) as f:
        prefixes = f["prefixes"]
    assert images.shape == (6, 8, 8, 3) and labels is None and meta["decode_options"]["draft"] == 2
    choices = model.conditioning.choices(model.cfg).numpy()
    assert prefixes.dtype == np.float32 and np.array_equal(prefixes, choices.repeat(2, axis=0))
    sample_py = load_script("sample.py")
    sample_py.main(["--ckpt", str(run), "--npz", str(tmp_path / "plain.npz"), "--num", "6", "--batch-size", "4",
                    "--device", "cpu"])
    assert np.array_equal(npz_files.read_npz(tmp_path / "plain.npz")[0], images)   # greedy: plain's tokens
    sample_py.main(["--ckpt", str(run), "--out", str(tmp_path / "grid.png"), "--device", "cpu", "--classes", "2,0"])
    from PIL import Image
    png = Image.open(tmp_path / "grid.png")
    sample_py.main(["--ckpt", str(run), "--out", str(tmp_path / "bare.png"), "--device", "cpu", "--classes", "2,0",
                    "--no-labels"])
    bare = np.asarray(Image.open(tmp_path / "bare.png"))          # the rows' names in a left margin, cells unchanged
    assert json.loads(png.text["rows"]) == ["caption 2", "caption 0"] and bare.shape == (268, 268, 3)  # x2: 256+
    assert png.width > bare.shape[1] and np.array_equal(np.asarray(png)[:, png.width - bare.shape[1]:], bare)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        sample_py.main(["--ckpt", str(run), "--out", str(tmp_path / "x.png"), "--device", "cpu", "--classes", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err == ["error: --classes '3': class 3 is out of range 0..2"]
    with pytest.raises(ValueError, match=r"^prefix: expected float vectors \(B, P, 6\), got torch.int64 \(2,\)$"):
        from mutor2d.sampling.decoding import generate
        generate(model, torch.tensor([0, 1]), (8, 8))


def test_checkpoint_written_before_sample_decode_samples_the_same(tmp_path):
    """A checkpoint whose stored config has no ``sample.decode`` loads with plain decoding and samples
    byte-identically."""
    from mutor2d.engine.loop import train
    run = tmp_path / "run"
    cfg = config.from_dict({**TINY_RUN, "sample": {"classes": [0, 7], "per_class": 1},
                            "train": {**TINY_RUN["train"], "sample_every": 0, "max_steps": 2}})
    train(cfg, run)
    ckpt = checkpoint.load(checkpoint.latest_valid(run))
    old = json.loads(json.dumps(ckpt["config"]))
    del old["sample"]["decode"]
    checkpoint.save_atomic({**ckpt, "config": old}, tmp_path / "old.pt")
    loaded = generation.open_checkpoint(tmp_path / "old.pt")
    assert loaded.cfg.sample.decode.name == "plain" and loaded.cfg.model.conditioning == "class"
    sample_py = load_script("sample.py")
    for name, ck in (("new", checkpoint.latest_valid(run)), ("old", tmp_path / "old.pt")):
        sample_py.main(["--ckpt", str(ck), "--npz", str(tmp_path / f"{name}.npz"), "--num", "10", "--device", "cpu"])
        sample_py.main(["--ckpt", str(ck), "--out", str(tmp_path / f"{name}.png"), "--device", "cpu"])
    new, old_npz = (npz_files.read_npz(tmp_path / f"{n}.npz") for n in ("new", "old"))
    assert np.array_equal(new[0], old_npz[0]) and np.array_equal(new[1], old_npz[1])
    assert (tmp_path / "new.png").read_bytes() == (tmp_path / "old.png").read_bytes()
