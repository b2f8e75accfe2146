"""Sampling: KV-cache decoding equals full recomputation; CFG, temperature, top-k/top-p rules;
registers play no part; class-balanced, sharded, resumable npz files; sample.py end to end."""
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
from mutor2d.checkpoint.__main__ import main as checkpoint_main
from mutor2d.model.config import ModelConfig
from mutor2d.tokenizer.pixel import PixelTokenizer
from mutor2d.model.gpt import GPT
from mutor2d.objectives.layout import regular_position_ids
from mutor2d.sampling.values import SampleFileError, parse_classes
from mutor2d.sampling.images import balanced_labels, make_sampler, sample_batches, save_grid, spread_classes
from mutor2d.sampling.npz import NpzJob, read_npz, shard_dir
from mutor2d.sampling.rules import SamplingRules, filter_logits, guide, sample_logits
from mutor2d.sampling.decoding import generate, run_decoder

from test_generation import cli_error
from timeouts import limit

ROOT = Path(__file__).resolve().parent.parent
V, C = 17, 10


def tiny(prefix="class", rope="2d", register=False, seed=0, dropout=0.0):
    torch.manual_seed(seed)
    cfg = ModelConfig(preset="tiny", vocab_size=V, num_classes=C, conditioning=prefix, rope=rope,
                      token_dropout=dropout, resid_dropout=dropout, ffn_dropout=dropout, class_dropout=dropout)
    m = GPT(cfg, register_token=register).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3)
    return m


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


def gen(seed):
    return torch.Generator().manual_seed(seed)


@torch.no_grad()
def generate_uncached(model, prefix, grid, cfg_scale=1.0, temperature=1.0, top_k=0, top_p=1.0, generator=None,
                      seen=None):
    """Reference: recompute the whole sequence every step, same per-step rules. ``seen`` collects
    the (guided) logits each step samples from."""
    B, N = prefix.shape[0], grid[0] * grid[1]
    P = model.prefix_len(prefix)
    guided = cfg_scale != 1.0
    if guided:
        prefix = torch.cat([prefix, torch.full_like(prefix, C)])
    body = torch.zeros(prefix.shape[0], 0, dtype=torch.long)
    for t in range(N):
        pos = regular_position_ids(grid, P, P + t).expand(prefix.shape[0], -1, -1)
        logits = model(body, pos, prefix)[:, -1]
        if guided:
            logits = guide(logits[:B], logits[B:], cfg_scale)
        seen.append(logits)
        tok = sample_logits(logits, temperature, top_k, top_p, generator)
        body = torch.cat([body, (torch.cat([tok, tok]) if guided else tok)[:, None]], 1)
    return body[:B]


CACHE_CASES = [  # id, model kwargs, prefix, grid, sampling settings
    ("class-2d-cfg", dict(), torch.tensor([0, 3, 7, 9]), (4, 4), dict(cfg_scale=2.0)),
    ("class-2d-topk-topp", dict(register=True), torch.tensor([1, 1, 5]), (3, 5),
     dict(temperature=0.8, top_k=6, top_p=0.9)),
    ("prompt-1d-sampled", dict(prefix="prompt", rope="1d"), torch.tensor([[1, 2, 3], [4, 5, 6]]), (1, 12), dict()),
    ("prompt-1d-greedy", dict(prefix="prompt", rope="1d"), torch.tensor([[1, 2, 3], [9, 9, 0]]), (1, 12),
     dict(temperature=0.0)),
]


@pytest.mark.parametrize("case", CACHE_CASES, ids=[c[0] for c in CACHE_CASES])
def test_cached_decoding_equals_recomputation(case, monkeypatch):
    _, kw, prefix, grid, settings = case
    m = tiny(**kw)
    seen_cached, seen_full = [], []

    def recording(rules, logits):                 # the logits (B, 1, V) of the one token a round draws
        seen_cached.append(logits[:, 0])
        return probs(rules, logits)

    probs = SamplingRules.probs
    monkeypatch.setattr(SamplingRules, "probs", recording)
    cached = generate(m, prefix, grid, generator=gen(5), **settings)
    full = generate_uncached(m, prefix, grid, generator=gen(5), seen=seen_full, **settings)
    assert cached.shape == (prefix.shape[0], grid[0] * grid[1]) and cached.dtype == torch.long
    assert torch.equal(cached, full)
    torch.testing.assert_close(torch.stack(seen_cached), torch.stack(seen_full), rtol=1e-4, atol=1e-4)
    assert len(set(map(tuple, cached.tolist()))) > 1   # the samples are not all alike


def test_cfg_scale_one_equals_conditional_sampling():
    m, labels = tiny(), torch.tensor([2, 4, 6, 8, 0])
    plain = generate(m, labels, (4, 4), generator=gen(1))
    batched = run_decoder(m, labels, (4, 4), SamplingRules(guided=True), config.make("sample.decode"), None,
                          gen(1))                                        # [cond; uncond], u + 1·(c − u)
    assert torch.equal(plain, batched)


def test_cfg_uses_the_null_class():
    m, labels = tiny(), torch.tensor([2, 4, 6])
    assert not torch.equal(generate(m, labels, (4, 4), cfg_scale=3.0, generator=gen(1)),
                           generate(m, labels, (4, 4), generator=gen(1)))
    with torch.no_grad():       # null class = class 2: guidance has nothing to push against
        m.cls_embedding.embedding_table.weight[C] = m.cls_embedding.embedding_table.weight[2]
    two = torch.tensor([2, 2, 2])
    torch.testing.assert_close(generate(m, two, (4, 4), cfg_scale=3.0, generator=gen(1)),
                               generate(m, two, (4, 4), generator=gen(1)))


def test_top_k_one_equals_greedy():
    m, labels = tiny(), torch.tensor([0, 1, 2, 3])
    greedy = generate(m, labels, (4, 4), temperature=0.0)
    assert torch.equal(generate(m, labels, (4, 4), top_k=1, generator=gen(3)), greedy)
    assert not torch.equal(generate(m, labels, (4, 4), generator=gen(3)), greedy)


def test_filter_logits_top_k_and_top_p_on_hand_made_logits():
    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3]])
    logits = probs.log()
    kept = lambda out: torch.isfinite(out[0]).nonzero()[:, 0].tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_k=2)) == [1, 3]
    assert kept(filter_logits(logits, top_p=0.7)) == [1, 3]         # 0.5 + 0.3 reaches 0.7
    assert kept(filter_logits(logits, top_p=0.8)) == [1, 3]         # mass before 0.15 is 0.8: dropped
    assert kept(filter_logits(logits, top_p=0.81)) == [0, 1, 3]
    assert kept(filter_logits(logits, top_p=0.3)) == [1]            # the top token always survives
    assert kept(filter_logits(logits, top_k=3, top_p=0.6)) == [1, 3]
    assert kept(filter_logits(logits)) == [0, 1, 2, 3]
    out = filter_logits(logits, top_p=0.7)
    torch.testing.assert_close(out[0, [1, 3]], logits[0, [1, 3]])  # survivors keep their logits


def test_sample_logits_follows_the_filtered_distribution():
    logits = torch.tensor([0.15, 0.5, 0.05, 0.3]).log().expand(20000, 4)
    freq = torch.bincount(sample_logits(logits, top_p=0.7, generator=gen(0)), minlength=4) / 20000
    torch.testing.assert_close(freq, torch.tensor([0.0, 0.625, 0.0, 0.375]), atol=0.02, rtol=0)
    sharp = torch.bincount(sample_logits(logits, temperature=0.5, generator=gen(0)), minlength=4) / 20000
    p = torch.tensor([0.15, 0.5, 0.05, 0.3]) ** 2
    torch.testing.assert_close(sharp, p / p.sum(), atol=0.02, rtol=0)


def test_seeded_eval_mode_and_training_flag_restored():
    m = tiny(dropout=0.5)
    labels = torch.tensor([1, 2, 3])
    ref = generate(m, labels, (4, 4), generator=gen(7))
    assert torch.equal(generate(m, labels, (4, 4), generator=gen(7)), ref)
    assert not torch.equal(generate(m, labels, (4, 4), generator=gen(8)), ref)
    m.train()   # dropout and label dropping must be off while sampling, and training resumes after
    assert torch.equal(generate(m, labels, (4, 4), generator=gen(7)), ref)
    assert m.training and all(layer.attention.cache is None for layer in m.layers)


def test_registers_play_no_part_at_sampling_time():
    mutor = tiny(register=True)
    ntp = tiny(register=False, seed=1)
    ntp.load_state_dict({k: v for k, v in mutor.state_dict().items() if k != "register_embedding"})
    labels = torch.tensor([3, 5, 7])
    assert torch.equal(generate(mutor, labels, (4, 4), cfg_scale=1.5, generator=gen(2)),
                       generate(ntp, labels, (4, 4), cfg_scale=1.5, generator=gen(2)))


@pytest.mark.parametrize("kw, prefix, msg", [
    (dict(cfg_scale=-1.0), torch.tensor([1]), "cfg_scale"),
    (dict(temperature=-0.5), torch.tensor([1]), "temperature"),
    (dict(top_k=-2), torch.tensor([1]), "top_k"),
    (dict(top_p=0.0), torch.tensor([1]), "top_p"),
    (dict(), torch.tensor([11]), "0..10"),
    (dict(), torch.tensor([[1, 2]]), "takes labels"),
])
def test_bad_settings_raise_one_line_errors(kw, prefix, msg):
    with pytest.raises(ValueError, match=msg) as e:
        generate(tiny(), prefix, (2, 2), **kw)
    assert "\n" not in str(e.value)


def test_cfg_on_a_prompt_model_is_refused():
    with pytest.raises(ValueError, match="classifier-free guidance needs a null prefix"):
        generate(tiny(prefix="prompt", rope="1d"), torch.tensor([[1, 2]]), (1, 4), cfg_scale=2.0)


# ----------------------------------------------------------------------------- sample files

def test_class_balance_and_class_lists():
    labels = balanced_labels(30, [1, 7, 9])
    assert torch.bincount(labels, minlength=10)[[1, 7, 9]].tolist() == [10, 10, 10]
    assert labels.numel() == 30 and labels.dtype == torch.long
    with pytest.raises(SampleFileError, match="multiple of the number of classes"):
        balanced_labels(31, [1, 7, 9])
    assert spread_classes(10) == list(range(10))
    assert spread_classes(1000) == [0, 111, 222, 333, 444, 555, 666, 777, 888, 999]
    assert parse_classes("1, 7,9", 10) == [1, 7, 9]
    for bad in ("1,x", "1,10", "-1"):
        with pytest.raises(SampleFileError, match="--classes"):
            parse_classes(bad, 10)


def test_outputs_decode_to_images_of_the_right_size(tmp_path):
    sampler = make_sampler(tiny(), PixelTokenizer(V), (8, 8), config.make("sample", cfg_scale=1.5))
    images = sample_batches(sampler, balanced_labels(6, [0, 4, 9]), batch_size=4, seed=0)
    assert images.shape == (6, 8, 8, 3) and images.dtype == np.uint8
    assert (images[..., 0] == images[..., 2]).all()            # grey: three equal channels
    assert set(np.unique(images)) <= {round(255 * i / (V - 1)) for i in range(V)}
    from PIL import Image
    png = Image.open(save_grid(images, ncol=2, path=tmp_path / "g.png", min_side=0))
    assert png.size == (2 + 2 * (64 + 2), 2 + 3 * (64 + 2))    # 8x8 upscaled x8, 3 rows, 2 columns
    pixels = np.asarray(png)
    first, last = images[0].repeat(8, 0).repeat(8, 1), images[5].repeat(8, 0).repeat(8, 1)
    assert np.array_equal(pixels[2:66, 2:66], first) and np.array_equal(pixels[134:198, 68:132], last)


def counting(sampler, calls):
    def wrapped(labels, seed):
        calls.append(len(labels))
        return sampler(labels, seed)
    return wrapped


def test_sharded_and_resumed_npz_equal_the_one_shot_npz(tmp_path):
    sampler = make_sampler(tiny(), PixelTokenizer(V), (4, 4), config.make("sample", cfg_scale=2.0, top_k=8))
    labels = balanced_labels(20, list(range(10)))
    meta = {"cfg_scale": 2.0, "seed": 3, "num": 20}

    one = NpzJob(tmp_path / "one.npz", labels, 6, 3, meta)
    one.run(sampler, one.missing())
    one.assemble()

    two = NpzJob(tmp_path / "two.npz", labels, 6, 3, meta)
    todo = two.missing()
    assert todo == [0, 1, 2, 3]                                 # 20 samples in shards of 6
    for rank in (1, 0):                                         # two processes, any order
        two.run(sampler, todo[rank::2])
    two.assemble()

    calls = []
    res = NpzJob(tmp_path / "res.npz", labels, 6, 3, meta)
    res.run(sampler, [0, 2])                                    # interrupted after two shards
    res = NpzJob(tmp_path / "res.npz", labels, 6, 3, meta)      # rerun
    assert res.missing() == [1, 3]
    res.run(counting(sampler, calls), res.missing())
    assert calls == [6, 2]                                      # finished shards were skipped
    res.assemble()

    a, b, c = (read_npz(tmp_path / f"{n}.npz") for n in ("one", "two", "res"))
    assert a[0].shape == (20, 4, 4, 3) and a[0].dtype == np.uint8 and a[1].dtype == np.int64
    assert np.bincount(a[1]).tolist() == [2] * 10
    for other in (b, c):
        assert np.array_equal(a[0], other[0]) and np.array_equal(a[1], other[1])
        assert {k: v for k, v in other[2].items() if k != "decode_stats"} == meta   # + counts measured
    assert not shard_dir(tmp_path / "one.npz").exists() and one.is_complete()
    assert not NpzJob(tmp_path / "one.npz", labels, 6, 4, {**meta, "seed": 4}).is_complete()


def test_shards_of_other_settings_are_refused(tmp_path):
    sampler = make_sampler(tiny(), PixelTokenizer(V), (2, 2), config.make("sample"))
    labels = balanced_labels(10, list(range(10)))
    job = NpzJob(tmp_path / "s.npz", labels, 5, 0, {"cfg_scale": 1.0})
    job.run(sampler, [0])
    with pytest.raises(SampleFileError, match=r"differs in: cfg_scale"):
        NpzJob(tmp_path / "s.npz", labels, 5, 0, {"cfg_scale": 2.0}).missing()
    with pytest.raises(SampleFileError, match="1 of 2 shards are missing"):
        job.assemble()


# ----------------------------------------------------------------------------- sample.py

@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """A run folder holding a checkpoint of the embedded default (digits, pixel tokenizer)."""
    run = tmp_path_factory.mktemp("run")
    cfg = config.load(None, ["data.name=digits", "model.preset=tiny", f"model.vocab_size={V}",
                             f"model.num_classes={C}", "objective.name=mutor-2d", "objective.d_max=3"])
    model = GPT(cfg.model, register_token=True)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    checkpoint.save_atomic({"model": model.state_dict(), "ema": None, "objective": {}, "step": 3,
                            "config": cfg.to_dict()}, checkpoint.checkpoint_path(run, 3))
    return run


def sample_py(*args):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "sample.py", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=limit(120))


def sample_main():
    """sample.py's main, run in this process on the CPU (as accelerate state is process-wide)."""
    spec = importlib.util.spec_from_file_location("sample_cli", ROOT / "sample.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return lambda argv: module.main([*argv, "--device", "cpu"])


def test_sample_py_grid_png_on_cpu(digits_run):
    r = sample_py("--ckpt", digits_run, "--classes", "1,7,9", "--per-class", "3", "--cfg", "2", "--seed", "1")
    assert r.returncode == 0, r.stderr
    from PIL import Image
    [png] = (digits_run / "samples").glob("step_00000003_cfg2_seed1_plain_cls1-7-9_x3_??????.png")   # beside step_N.png
    assert png.is_file() and str(png) in r.stdout
    assert Image.open(png).height == 2 * (2 + 3 * 66) and Image.open(png).width > 2 * (2 + 3 * 66)  # x2 to 256+, margin
    assert json.loads(Image.open(png).text["rows"]) == ["1", "7", "9"]


def test_sample_py_writes_beside_the_checkpoint_it_samples(digits_run, tmp_path, monkeypatch):
    """Default outputs go next to their checkpoint, never into the current folder: DIR/STEM_samples/ for
    a safetensors export or a .pt outside a run folder (RUN/samples/ for a run's: the test above), grids
    and npz files alike, named step first as the training grids are."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    checkpoint_main(["export", str(digits_run), str(tmp_path / "model.safetensors")])
    checkpoint.save_atomic(checkpoint.load(checkpoint.checkpoint_path(digits_run, 3)), tmp_path / "ck.pt")
    run = sample_main()
    run(["--ckpt", str(tmp_path / "model.safetensors"), "--classes", "1,2", "--per-class", "1", "--seed", "4"])
    run(["--ckpt", str(tmp_path / "ck.pt"), "--classes", "1,2", "--per-class", "1", "--temperature", "0.5"])
    run(["--ckpt", str(tmp_path / "ck.pt"), "--npz", "--num", "10", "--batch-size", "5", "--no-ema"])
    found = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("step_*"))
    assert [re.sub(r"_[0-9a-f]{6}\.", ".", name) for name in found] == [      # the settings' hash left out
        "ck_samples/step_00000003_cfg1_seed0_plain_raw_all_n10.npz",
        "ck_samples/step_00000003_cfg1_seed0_plain_t0.5_cls1-2_x1.png",
        "model_samples/step_00000003_cfg1_seed4_plain_cls1-2_x1.png"]
    assert read_npz(tmp_path / found[0])[0].shape == (10, 8, 8, 3)
    assert list(cwd.iterdir()) == []


def test_grid_labels_sit_in_a_left_margin_beside_unchanged_cells(tmp_path):
    from PIL import Image
    images = np.random.default_rng(0).integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    rows = ["0", "4", "207: golden retriever"]
    bare = np.asarray(Image.open(save_grid(images, 2, tmp_path / "a.png", rows, labels=False, min_side=0)))
    png = Image.open(save_grid(images, 2, tmp_path / "b.png", rows, min_side=0))
    short = Image.open(save_grid(images, 2, tmp_path / "c.png", ["0", "4", "9"], min_side=0))
    margin = png.width - bare.shape[1]
    assert bare.shape[:2] == (2 + 3 * 66, 2 + 2 * 66) and png.height == bare.shape[0]
    assert np.array_equal(np.asarray(png)[:, margin:], bare) and 0 < short.width - bare.shape[1] < margin
    ink = (np.asarray(png)[:, :margin] < 128).any(axis=(1, 2))          # margin lines holding text
    bands = [list(range(2 + r * 66, 2 + r * 66 + 64)) for r in range(3)]
    assert all(ink[b].any() for b in bands) and ink.sum() == sum(ink[b].sum() for b in bands)
    assert json.loads(png.text["rows"]) == rows


def test_class_rows_are_named_by_the_class_names():
    from types import SimpleNamespace

    from mutor2d.model.conditioning import conditioning
    kind = conditioning("class")
    assert kind.row_label(SimpleNamespace(num_classes=10), 7) == "7"
    assert kind.row_label(SimpleNamespace(num_classes=1000), 207) == "207: golden retriever"


def test_sample_py_npz_is_class_balanced_with_meta(digits_run, tmp_path):
    out = tmp_path / "s.npz"         # in-process: the grid test above runs the script as a subprocess
    sample_main()(["--ckpt", str(digits_run), "--num", "20", "--npz", str(out), "--batch-size", "8",
                   "--top-p", "0.9", "--seed", "5"])
    images, labels, meta = read_npz(out)
    assert images.shape == (20, 8, 8, 3) and images.dtype == np.uint8
    assert np.bincount(labels, minlength=C).tolist() == [2] * C
    assert meta["step"] == 3 and meta["top_p"] == 0.9 and meta["seed"] == 5 and meta["per_class"] == 2
    assert meta["cfg_scale"] == 1.0 and meta["temperature"] == 1.0 and meta["top_k"] == 0
    assert meta["checkpoint"].endswith("step_00000003.pt") and meta["config"]["data"]["name"] == "digits"
    assert json.loads(json.dumps(meta)) == meta and not shard_dir(out).exists()


@pytest.mark.parametrize("args, msg", [
    (["--classes", "1,12"], "class 12 is out of range 0..9"),
    (["--classes", "1,seven"], "'seven' is not a class index"),
    (["--num", "15", "--npz", "x.npz"], "multiple of the number of classes"),
    (["--num", "20"], "--num goes with --npz"),
    (["--grid", "8by8"], "--grid '8by8': expected HxW"),
    (["--cfg", "-2"], "--cfg-scale: expected a finite number >= 0"),
])
def test_sample_py_bad_input_is_a_one_line_error(digits_run, tmp_path, args, msg, capsys):
    args = [str(tmp_path / a) if a.endswith(".npz") else a for a in args]
    text = cli_error(sample_main(), ["--ckpt", str(digits_run), *args], capsys)
    assert text.startswith("error: ") and "\n" not in text and msg in text


def test_sample_py_missing_checkpoint_or_tokenizer(tmp_path, digits_run, capsys):
    assert re.match(r"^error: checkpoint .*nope.pt' does not exist$",
                    cli_error(sample_main(), ["--ckpt", str(tmp_path / "nope.pt")], capsys))
    ckpt = checkpoint.load(checkpoint.checkpoint_path(digits_run, 3))
    ckpt["config"]["data"]["tokenizer"] = str(tmp_path / "missing_vq.pt")
    checkpoint.save_atomic(ckpt, tmp_path / "vq.pt")
    assert re.match(r"^error: tokenizer of .*vq.pt: ", cli_error(sample_main(), ["--ckpt", str(tmp_path / "vq.pt")], capsys))


def test_sample_py_uses_recorded_grid_and_ema_choice(digits_run, tmp_path):
    ckpt = checkpoint.load(checkpoint.checkpoint_path(digits_run, 3))
    ema = {k: v + 0.5 * torch.randn_like(v) for k, v in ckpt["model"].items()}
    checkpoint.save_atomic({**ckpt, "grid": [4, 4], "ema": ema}, tmp_path / "ck.pt")
    out = {}
    for flag in ("--ema", "--no-ema"):
        path = tmp_path / f"{flag[2:]}.npz"
        sample_main()(["--ckpt", str(tmp_path / "ck.pt"), "--num", "10", "--npz", str(path), flag])
        out[flag] = read_npz(path)
    for flag, used in (("--ema", True), ("--no-ema", False)):
        images, _, meta = out[flag]
        assert images.shape == (10, 4, 4, 3) and meta["grid"] == [4, 4] and meta["ema"] is used
    assert not np.array_equal(out["--ema"][0], out["--no-ema"][0])


# ----------------------------------------------------------------------------- the sample.decode section

def test_decode_is_a_tagged_section_nested_in_sample():
    """Built from --set items, written back by to_dict, switched with its fields dropped, checked."""
    cfg = config.load(None, ["sample.decode.name=registers", "sample.decode.draft=2", "sample.decode.fill=no"])
    assert config.section_dict(cfg.sample.decode) == {"name": "registers", "draft": 2, "anchors": "every",
                                                      "fill": False}
    assert config.from_dict(cfg.to_dict()).sample.decode == cfg.sample.decode
    switched = config.from_dict(config.apply_overrides(cfg.to_dict(), ["sample.decode.name=jacobi"]))
    assert config.section_dict(switched.sample.decode) == {"name": "jacobi", "window": 4}
    assert config.load(None).sample.decode.name == "plain"                  # and old configs have none
    assert config.make("sample.decode", name="jacobi", window=2).window == 2
    for items, msg in ((["sample.decode.window=2"], r"unknown config key 'sample.decode.window' for "
                                                     r"sample.decode.name=plain \(known: name\)"),
                       (["sample.decode.name=jacobi", "sample.decode.window=0"], r"^sample.decode.window: expected "
                                                                                 r"an integer >= 1, got 0$"),
                       (["sample.decode=registers"], r"^sample.decode: expected a mapping, got 'registers'$"),
                       (["sample.decode.name=fast"], r"^sample.decode.name: expected one of \[.*\], got 'fast'$")):
        with pytest.raises(config.ConfigError, match=msg):
            config.load(None, items)


def test_decode_mode_must_fit_the_run():
    """A run config with register decoding (its training grids use it) needs registers and a draft
    length its objective trained; checked with the data's grid before training starts."""
    cfg = config.load(None, ["objective.name=mutor-2d", "objective.d_max=4", "sample.decode.name=registers"])
    cfg.check_data((8, 8), 1, 10)
    with pytest.raises(config.ConfigError, match=r"^sample.decode.draft=3: this checkpoint's registers draft "
                                                 r"at most 2 tokens \(objective mutor-2d, d_max=4\)$"):
        config.load(None, ["objective.name=mutor-2d", "objective.d_max=4", "sample.decode.name=registers",
                           "sample.decode.draft=3"]).check_data((8, 8), 1, 10)
    with pytest.raises(config.ConfigError, match=r"^sample.decode.name=registers: this checkpoint has no registers"):
        config.load(None, ["sample.decode.name=registers"]).check_data((8, 8), 1, 10)
