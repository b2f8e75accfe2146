"""Conditioning kinds other than class labels, end to end through the real engine and sample.py: a kind
with a fixed set of choices (a plugin-style "style" kind, 3 choices of 2 tokens each, guidable) writes
training sample grids (rows: sample.classes, indices into its choices, checked at start-up) and samples
grids and npz files from its run; a kind without a fixed set (``prompt``) says at start-up that it writes
no grids, and sample.py refuses its run in one line."""
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import TINY_DIGITS, demo_extra  # noqa: E402
from test_generation import cli_error, sample_main  # noqa: E402

from mutor2d import checkpoint, config  # noqa: E402
from mutor2d.checks import ConfigError  # noqa: E402
from mutor2d.engine.loop import train  # noqa: E402
from mutor2d.sampling import images as generation  # noqa: E402
from mutor2d.sampling import npz as npz_files  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

STYLES = torch.tensor([[0, 1], [2, 3], [4, 0]])      # the 3 choices: fixed prefixes of 2 tokens
NULL = 5                                             # the null style token (CFG)
STYLE_RUN = [*TINY_DIGITS, "train.sample_every=1", "model.conditioning=style", "data.name=styled-digits",
             "sample.classes=[2,0]"]
NO_GRIDS = "note: no sample grids are written: model.conditioning='prompt' has no fixed set of prefixes to sample"


@pytest.fixture(scope="module")
def style_kind():
    """A "style" conditioning kind and a "styled-digits" dataset (digit d drawn in style d % 3), registered
    as a plugin module would; unregistered after, so other test modules see the shipped parts only."""
    from mutor2d.config import register_variant
    from mutor2d.registry import REGISTRY
    from mutor2d.data.config import DigitsDataConfig
    from mutor2d.data.tokens import TokenGrids, digits_dataset
    from mutor2d.model.conditioning import CONDITIONING, Conditioning, register_conditioning

    @register_conditioning
    class Style(Conditioning):
        name, guidable = "style", True

        def build(self, model):
            model.style_embedding = nn.Embedding(NULL + 1, model.shape.dim)

        def embed(self, model, prefix):
            return model.style_embedding(prefix)

        def prefix_len(self, prefix):
            return prefix.shape[1]

        def check(self, cfg, prefix):
            if prefix.dtype != torch.int64 or prefix.dim() != 2 or prefix.shape[1] != STYLES.shape[1]:
                raise ValueError(f"prefix: expected style tokens (B, 2), got {prefix.dtype} {tuple(prefix.shape)}")

        def null_prefix(self, cfg, prefix):
            return torch.full_like(prefix, NULL)

        def choices(self, cfg):
            return STYLES

        def row_label(self, cfg, pick):
            return f"style {pick}"

    def styled_digits(cfg, split):
        d = digits_dataset(cfg, split)
        return TokenGrids(d.codes.view(len(d), *d.grid), STYLES[d.labels % len(STYLES)], d.vocab_size,
                          d.num_classes)

    @register_variant("data", "styled-digits", build=styled_digits)
    @dataclass
    class StyledDigits(DigitsDataConfig):
        pass

    yield Style
    CONDITIONING.pop("style")
    REGISTRY.pop("data.styled-digits")


@pytest.fixture(scope="module")
def style_run(style_kind, tmp_path_factory):
    """A 2-step digits run conditioned on styles, a sample grid after every step."""
    out = tmp_path_factory.mktemp("style") / "run"
    train(config.load("digits_mutor2d.yaml", STYLE_RUN), out)
    return out


def test_a_kind_with_choices_writes_training_grids_and_sample_py_grids_and_npz_files(style_run, tmp_path):
    """Training grids: one row per choice of sample.classes, named by the kind; the last one is sample.py's
    grid (the run's own sample.classes) byte for byte. --npz stores the kind's prefixes (``prefixes``
    (N, 2)), balanced over all choices or --classes."""
    from PIL import Image
    grids = sorted((style_run / "samples").glob("step_*.png"))
    assert [p.name for p in grids] == ["step_00000001.png", "step_00000002.png"]
    assert json.loads(Image.open(grids[-1]).text["rows"]) == ["style 2", "style 0"]
    main = sample_main()
    main(["--ckpt", str(style_run), "--out", str(tmp_path / "cli.png"), "--device", "cpu"])
    assert (tmp_path / "cli.png").read_bytes() == grids[-1].read_bytes()
    for name, flags, picks in (("all", [], [0, 1, 2]), ("some", ["--classes", "1,2"], [1, 2])):
        main(["--ckpt", str(style_run), "--npz", str(tmp_path / f"{name}.npz"), "--num", "6", "--device", "cpu",
              *flags])
        images, labels, meta = npz_files.read_npz(tmp_path / f"{name}.npz")
        with np.load(tmp_path / f"{name}.npz") as f:
            prefixes = f["prefixes"]
        assert images.shape == (6, 8, 8, 3) and labels is None and meta["classes"] == picks
        assert np.array_equal(prefixes, STYLES[picks].repeat_interleave(6 // len(picks), 0).numpy())


def test_bad_choice_indices_are_one_line_errors(style_run, tmp_path, capsys):
    """sample.classes beyond the kind's choices stops training before a step; --classes stops sample.py."""
    bad = [*STYLE_RUN[:-1], "sample.classes=[0,7]"]
    with pytest.raises(ConfigError, match=r"^sample.classes: 7 is not a choice of model.conditioning='style' "
                                          r"\(0..2\)$"):
        train(config.load("digits_mutor2d.yaml", bad), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    argv = ["--ckpt", str(style_run), "--out", str(tmp_path / "x.png"), "--device", "cpu", "--classes", "0,3"]
    assert cli_error(sample_main(), argv, capsys) == "error: --classes '0,3': class 3 is out of range 0..2"


def test_the_demo_names_a_kinds_choices_as_the_kind_does(style_run):
    """app.py on a run of a kind with choices: the dropdown lists them by the kind's row labels ("style 2"),
    as its grids do, not as class indices or ImageNet names; the page says what they are."""
    demo_extra("gradio")
    from mutor2d.demo import page as demo_lib
    src = generation.open_checkpoint(checkpoint.latest_valid(style_run), device="cpu")
    app = demo_lib.build_app(demo_lib.Demo(src, torch.device("cpu"), "RUN"))
    dropdown = next(b for b in app.blocks.values() if getattr(b, "elem_id", None) == "classes")
    assert [tuple(c) for c in dropdown.choices] == [("style 0", 0), ("style 1", 1), ("style 2", 2)]
    assert dropdown.label.startswith("style ")
    assert any("3 style choices" in str(getattr(b, "value", "")) for b in app.blocks.values())


TINY_STARGRAPH = ["model.n_layer=1", "model.n_head=2", "model.dim=32", "data.num_train=16", "data.num_test=4",
                  "objective.d_max=2", "optim.warmup_steps=1", "train.batch_size=4", "train.max_steps=2",
                  "train.log_every=1", "train.ckpt_every=0", "train.keep_ckpts=0", "train.sample_every=1"]


def test_a_kind_without_choices_says_it_writes_no_grids_and_sample_py_refuses(tmp_path, capsys):
    """A prompt run (star graphs): one note line at start-up, no samples folder; sample.py: one line."""
    run = train(config.load("stargraph_mutor.yaml", TINY_STARGRAPH), tmp_path / "run")
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if "sample grids" in line] == [NO_GRIDS]
    assert not (run / "samples").exists()
    ckpt = checkpoint.latest_valid(run)
    for flags in (["--out", str(tmp_path / "x.png")], ["--npz", str(tmp_path / "x.npz"), "--num", "4"]):
        assert cli_error(sample_main(), ["--ckpt", str(run), "--device", "cpu", *flags], capsys) == \
            f"error: {ckpt.resolve()}: model.conditioning='prompt' has no fixed set of prefixes to sample grids " \
            f"or sample files from"
    demo_extra("huggingface_hub")
    from mutor2d.hub import MutorModel
    MutorModel.from_checkpoint(run).save_pretrained(tmp_path / "hub")       # no grid to draw: no picture
    assert sorted(p.name for p in (tmp_path / "hub").iterdir()) == ["README.md", "config.json", "model.safetensors"]
    card = (tmp_path / "hub" / "README.md").read_text()
    assert "prompt-conditioned" in card and "no sample grid" in card and "sample.png" not in card
