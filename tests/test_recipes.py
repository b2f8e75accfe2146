"""The extension recipes of docs/EXTENDING.md, built as a new contributor builds them: each
test writes a sketch of that page, verbatim, into a module of its own (tmp_path), names it in
MUTOR2D_PLUGINS and runs the public commands in this process: (images -> codes ->) train -> resume
-> sample -> eval/fid.py -> eval/leaderboard.py; the objective also fine-tunes a tiny Llama."""
import dataclasses
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
import yaml
from PIL import Image

from mutor2d import config, run_configs
from mutor2d.model.attention import BACKENDS
from mutor2d.engine.runlog import read_log
from mutor2d.evaluation import digits
from mutor2d.plugins import load_plugins
from mutor2d.objectives.spec import RegisterSpec2D
from mutor2d.objectives.layout import make_layout
from mutor2d.registry import REGISTRY
from mutor2d.tokenizer.base import TOKENIZERS
from mutor2d.tokenizer.image_folder import augment, center_crop_arr
from timeouts import limit

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

TINY = {
    "model": {"preset": "tiny", "attention": "sdpa"},
    "data": {"name": "digits", "levels": 5},
    "objective": {"name": "ntp"},
    "optim": {"lr": 3e-3, "warmup_steps": 1},
    "train": {"batch_size": 8, "max_steps": 4, "log_every": 1, "ckpt_every": 2, "keep_ckpts": 0,
              "tracker": "none", "seed": 3},
    "sample": {"classes": [0, 1], "per_class": 1},
}


def recipe(heading: str) -> tuple[str, str]:
    """(module name, source) of the first python block under ``### heading`` in docs/EXTENDING.md; the
    block's first line names its file (``# name.py``)."""
    text = (ROOT / "docs" / "EXTENDING.md").read_text()
    section = text[text.index(f"### {heading}\n"):]
    source = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return re.match(r"# (\w+)\.py\n", source).group(1), source


def script(path: str):
    """An entry script (train.py, eval/fid.py, ...) loaded as a module, to call its main()."""
    spec = importlib.util.spec_from_file_location(f"script_{Path(path).stem}", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recipe_plugins(tmp_path, monkeypatch, registries: list[dict]):
    """The body of the ``plugin`` fixtures: yields write(heading), which writes that recipe into
    tmp_path/plugins/NAME.py and names it in MUTOR2D_PLUGINS; ``registries`` (the ones the recipes
    fill) are restored, and the modules forgotten, afterwards. Every shipped part and run kind is
    registered first: a registry saved before a lazy import would be restored without it."""
    from mutor2d.run_configs import run_kind
    config.import_parts()
    for task in run_configs.known_tasks():
        run_configs.run_config_class(task), run_kind(task)
    saved = [dict(r) for r in registries]
    folder = tmp_path / "plugins"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    names = []

    def write(heading: str) -> str:
        name, source = recipe(heading)
        (folder / f"{name}.py").write_text(source)
        names.append(name)
        monkeypatch.setenv("MUTOR2D_PLUGINS", ",".join(names))
        return name
    yield write
    for registry, before in zip(registries, saved):
        registry.clear()
        registry.update(before)
    for name in names:
        sys.modules.pop(name, None)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """plugin(heading): that recipe as a plugin module (recipe_plugins)."""
    yield from recipe_plugins(tmp_path, monkeypatch, [REGISTRY, BACKENDS, TOKENIZERS])


@pytest.fixture(scope="module")
def classifier_cache(tmp_path_factory):
    """A cache holding the digits classifier file eval/fid.py looks for. Its weights are random: these
    tests check the commands, not the scores, and training it would take longer than all of them."""
    cache = tmp_path_factory.mktemp("cache")
    settings = digits.DigitsClassifierSettings()
    torch.manual_seed(0)
    net = digits.DigitsNet(settings.width, settings.feat_dim)
    torch.save({"settings": dataclasses.asdict(settings), "state": net.state_dict()},
               cache / f"digits_classifier_{settings.key()}.pt")
    assert digits.digits_classifier_path(settings, cache).is_file()      # found, not retrained
    return cache


def run_commands(tmp_path, cache, sections: dict, ref: str = "digits:train", num: int = 20) -> str:
    """train 2 steps, resume to 4, sample ``num`` images, score them, and return the leaderboard."""
    cfg = {k: {**TINY[k], **sections.get(k, {})} for k in TINY}
    cfg.update({k: sections[k] for k in ("data", "objective") if k in sections})   # another variant: its own fields
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    train = script("train.py")
    train.main(["--config", str(tmp_path / "run.yaml"), "--out", str(run), "--max-steps", "2"])
    train.main(["--config", str(tmp_path / "run.yaml"), "--out", str(run), "--resume", "auto", "--max-steps", "4"])
    steps = [r["step"] for r in read_log(run) if "loss" in r]
    assert steps == [1, 2, 3, 4] and all(np.isfinite(r["loss"]) for r in read_log(run) if "loss" in r)
    npz = run / "samples.npz"
    script("sample.py").main(["--ckpt", str(run), "--npz", str(npz), "--num", str(num), "--batch-size",
                              str(num), "--device", "cpu"])
    fid = script("eval/fid.py").main([str(npz), "--ref", ref, "--features", "digits", "--metrics", "fid",
                                      "--cache-dir", str(cache), "--device", "cpu", "--quiet"])
    assert fid["step"] == 4 and fid["n"] == num and np.isfinite(fid["metrics"]["fid"])
    return script("eval/leaderboard.py").main([str(run)])


def test_objective_recipe(plugin, tmp_path, classifier_cache):
    """The doc's objective trains a digits model through the commands, and a tiny Llama (train.py on a
    ``task: lm`` config) with the same section."""
    plugin("An objective")
    board = run_commands(tmp_path, classifier_cache, {"objective": {"name": "smooth-ntp", "smoothing": 0.2}})
    assert "| smooth-ntp | smoothing=0.2 | 4 |" in board              # described by its config's fields
    assert config.make("objective", name="smooth-ntp").describe() == "smoothing=0.1"
    with pytest.raises(config.ConfigError, match="objective.smoothing: expected 0 <= value < 1, got 1.5"):
        config.make("objective", name="smooth-ntp", smoothing=1.5)
    rows, changed = train_tiny_llama(tmp_path, {"name": "smooth-ntp", "smoothing": 0.2})
    assert all(np.isfinite(r["loss"]) for r in rows) and rows[-1]["loss"] < rows[0]["loss"], rows
    assert changed


def train_tiny_llama(tmp_path, objective: dict, steps: int = 8) -> tuple[list[dict], bool]:
    """(log rows, whether the weights moved) of a full fine-tuning of a tiny Llama under ``objective``."""
    pytest.importorskip("transformers")
    from safetensors.torch import load_file
    from mutor2d.lm.offline_tokenizers import char_tokenizer
    from mutor2d.lm.tiny import write_tiny_llama
    base = write_tiny_llama(tmp_path / "llama", char_tokenizer("0123456789+=;:sum "), hidden=32, layers=2)
    cfg = {"task": "lm", "model": {"hf": str(base), "finetune": "full"},
           "data": {"path": str(ROOT / "tests" / "data" / "lm_tiny.jsonl")}, "objective": objective,
           "optim": {"lr": 3e-3}, "train": {"batch_size": 8, "max_steps": steps, "log_every": 1, "tracker": "none"}}
    (tmp_path / "lm.yaml").write_text(yaml.safe_dump(cfg))
    run = tmp_path / "lm_run"
    script("train.py").main(["--config", str(tmp_path / "lm.yaml"), "--out", str(run)])
    before, after = load_file(str(base / "model.safetensors")), load_file(str(run / "model.safetensors"))
    changed = any(not torch.equal(before[k], after[k]) for k in before if k in after)
    return [r for r in read_log(run) if "loss" in r], changed


def test_attention_backend_recipe(plugin, tmp_path, classifier_cache, monkeypatch, capsys):
    name = plugin("An attention backend")
    load_plugins()
    backend = BACKENDS["dense"]
    lay = make_layout(2, (3, 3), 1, RegisterSpec2D(2), torch.Generator().manual_seed(0))
    q, k, v = torch.randn(3, 2, 2, lay.key_rank.shape[1], 8, generator=torch.Generator().manual_seed(1))
    backend.prepare(lay.visibility)
    torch.testing.assert_close(backend.attend(q, k, v, lay.visibility),          # the recipe's own test
                               BACKENDS["sdpa"].attend(q, k, v, lay.visibility))
    calls = {"attend": 0, "attend_cached": 0}
    for method in calls:                      # count what the commands run through the new backend
        def counted(*args, _inner=getattr(backend, method), _method=method, **kw):
            calls[_method] += 1
            return _inner(*args, **kw)
        monkeypatch.setattr(backend, method, counted)
    board = run_commands(tmp_path, classifier_cache, {"model": {"attention": "dense"},
                                                      "objective": {"name": "mutor-2d", "d_max": 2}})
    assert calls["attend"] > 0 and calls["attend_cached"] > 0
    assert "| mutor-2d | a=0.5, D=2, dense | 4 |" in board
    monkeypatch.delitem(BACKENDS, "dense")              # a shell without the plugin: a one-line error
    monkeypatch.delitem(sys.modules, name)
    monkeypatch.delenv("MUTOR2D_PLUGINS")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        script("sample.py").main(["--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "x.png"),
                                  "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert re.match(r"error: model.attention: expected one of .* MUTOR2D_PLUGINS.*got 'dense'", err) and "\n" not in err


def draw_images(root: Path, classes=("a", "b"), per_class: int = 3) -> Path:
    """An image folder (root/CLASS/IMAGE) of random RGB images of assorted sizes."""
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            size = (10 + 3 * i, 9 + 2 * i)
            Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


def test_tokenizer_recipe_through_the_codes_path(plugin, tmp_path, classifier_cache):
    plugin("A tokenizer")
    images, codes = draw_images(tmp_path / "images"), tmp_path / "codes"
    script("tokenizers/extract_codes.py").main(["--images", str(images), "--tokenizer", "blocks:4", "--out",
                                                str(codes), "--workers", "0", "--no-progress"])
    header = json.loads((codes / "header.json").read_text())
    tok = TOKENIZERS["blocks"]("4")
    assert header["tokenizer"] == "blocks:4" and header["tokenizer_sha256"] == tok.sha256
    assert header["grid"] == [4, 4] and header["codebook_size"] == 4 and header["num_augs"] == 2
    with Image.open(images / "b" / "2.png") as im:
        views = augment(im.convert("RGB"), 8, header["augmentations"])
    assert np.array_equal(np.load(codes / "codes.npy")[5], tok.encode(views).numpy())    # row 5 = b/2.png
    ref = tmp_path / "reference"                 # the images as tokenised (8x8 centre crops), in one folder
    ref.mkdir()
    for f in images.glob("*/*.png"):
        with Image.open(f) as im:
            center_crop_arr(im.convert("RGB"), 8).save(ref / f"{f.parent.name}_{f.name}")
    board = run_commands(tmp_path, classifier_cache, {"data": {"name": "codes", "path": str(codes),
                                                               "tokenizer": "blocks:4"},
                                                      "train": {"batch_size": 4}}, ref=str(ref), num=4)
    samples = np.load(tmp_path / "run" / "samples.npz")
    assert samples["images"].shape == (4, 8, 8, 3)                      # decoded by the new tokenizer
    assert "| ntp |  | 4 |" in board and "| reference |" in board


# ----------------------------------------------------------------------------- MUTOR2D_PLUGINS

ARGS = {"train.py": ["--config", "digits_ntp"], "sample.py": ["--ckpt", "runs/none"],
        "tokenizers/extract_codes.py": ["--images", "x", "--tokenizer", "pixel:5", "--out", "y"]}


@pytest.mark.parametrize("path", sorted(ARGS))
def test_a_plugin_that_cannot_be_imported_stops_the_command_in_one_line(path, monkeypatch, capsys):
    monkeypatch.setenv("MUTOR2D_PLUGINS", "mutor2d_no_such_plugin")
    with pytest.raises(SystemExit) as stop:
        script(path).main(ARGS[path])
    message = stop.value.code if isinstance(stop.value.code, str) else capsys.readouterr().err.strip()
    assert stop.value.code in (2, message) and len(message.splitlines()) == 1
    assert message.startswith("error: MUTOR2D_PLUGINS: cannot import module 'mutor2d_no_such_plugin' "
                              "(ModuleNotFoundError: No module named 'mutor2d_no_such_plugin')")


def test_load_plugins_names_a_failing_module(tmp_path, monkeypatch):
    from mutor2d.plugins import PluginError, plugin_names
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert plugin_names(" a.b , c,,") == ["a.b", "c"] and load_plugins("") == []
    with pytest.raises(PluginError, match=r"module 'broken_plugin' \(RuntimeError: boom\)"):
        load_plugins("json,broken_plugin")
    r = subprocess.run(                         # the shell's view: exit 2, one line
        [sys.executable, "eval/leaderboard.py", "runs/none"], cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "MUTOR2D_PLUGINS": "broken_plugin", "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
        timeout=limit(120))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: MUTOR2D_PLUGINS: cannot import module 'broken_plugin' (RuntimeError: boom); expected an importable "
        "module name (installed, or on PYTHONPATH)"]
