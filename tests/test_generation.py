"""mutor2d.sampling.images, the one path from a model to images: labels and seeds, grids, sample-file
metadata, a checkpoint opened for sampling; sample.py's one-line errors for a wrong grid, seed or
device."""
import dataclasses
import json
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from mutor2d import config
from mutor2d import checkpoint
from mutor2d.checkpoint import locate
from mutor2d.sampling import images as generation
from mutor2d.sampling import npz as npz_files
from mutor2d.sampling.values import SampleFileError

ROOT = Path(__file__).resolve().parent.parent
V, C = 17, 10

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run folder with one checkpoint of a tiny random class-conditional digits model (8x8)."""
    from mutor2d.model.gpt import GPT
    folder = tmp_path_factory.mktemp("run")
    cfg = config.load(None, ["data.name=digits", "model.preset=tiny", f"model.vocab_size={V}",
                             f"model.num_classes={C}", "sample.per_class=3", "sample.classes=[2,5]",
                             "sample.seed=4"])
    torch.manual_seed(0)
    model = GPT(cfg.model)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    checkpoint.save_atomic({"model": model.state_dict(), "ema": None, "objective": {}, "step": 7,
                            "config": cfg.to_dict(), "grid": [8, 8]}, checkpoint.checkpoint_path(folder, 7))
    return folder


def sample_main():
    """sample.py's main, in this process on the CPU."""
    spec = importlib.util.spec_from_file_location("sample_cli", ROOT / "sample.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def cli_error(main, argv, capsys) -> str:
    """The one stderr line of a command that fails with exit status 2."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, (e.value.code, err)
    return err[0]


def test_labels_classes_and_seeds():
    assert generation.spread_classes(10) == list(range(10))
    assert generation.spread_classes(1000) == [0, 111, 222, 333, 444, 555, 666, 777, 888, 999]
    assert generation.balanced_labels(6, [4, 1]).tolist() == [4, 4, 4, 1, 1, 1]
    assert generation.parse_classes("1, 7,9", 10) == [1, 7, 9]
    cfg = config.load(None, ["data.name=digits"]).sample
    assert generation.grid_classes(cfg, 1000) == generation.spread_classes(1000)
    cfg.classes = [3, 12]
    with pytest.raises(SampleFileError, match="^sample.classes '3,12': class 12 is out of range 0..9$"):
        generation.grid_classes(cfg, 10)
    assert generation.shard_seed(5, 0) != generation.shard_seed(5, 1) == generation.shard_seed(5, 1)
    with pytest.raises(SampleFileError, match=r"^seed -1: expected an integer >= 0$"):
        generation.shard_seed(-1, 0)
    assert generation.parse_grid("16x8") == (16, 8)
    for bad in ("8by8", "0x4"):
        with pytest.raises(SampleFileError, match=f"--grid '{bad}'"):
            generation.parse_grid(bad)


def test_pick_grid_refuses_another_grid_than_the_models():
    assert generation.pick_grid(None, (8, 8)) == (8, 8)
    assert generation.pick_grid("4x4", None) == (4, 4)
    with pytest.raises(SampleFileError, match="^--grid 16x16: this model was trained on a 8x8 grid$"):
        generation.pick_grid("16x16", (8, 8))
    with pytest.raises(SampleFileError, match="pass --grid HxW"):
        generation.pick_grid(None, None)


def test_training_grid_equals_sample_py_grid(run, tmp_path):
    """write_grid (what training calls) and sample.py give the same PNG bytes for the same model,
    settings and seed; write_grid leaves the model's mode and the global RNG alone."""
    src = generation.open_checkpoint(locate.resolve(run), device="cpu")
    assert (src.step, src.grid, src.ema) == (7, (8, 8), False)
    model = src.model.train()
    classes = generation.grid_classes(src.cfg.sample, src.cfg.model.num_classes)
    state = torch.random.get_rng_state()
    ours = generation.write_grid(model, src.tokenizer, src.grid, src.cfg.sample, classes, tmp_path / "train.png")
    assert model.training and torch.equal(torch.random.get_rng_state(), state)
    sample_main()(["--ckpt", str(run), "--out", str(tmp_path / "cli.png"), "--device", "cpu"])
    assert ours.read_bytes() == (tmp_path / "cli.png").read_bytes()
    from PIL import Image
    sample_main()(["--ckpt", str(run), "--out", str(tmp_path / "bare.png"), "--device", "cpu", "--no-labels"])
    png, bare = Image.open(ours), np.asarray(Image.open(tmp_path / "bare.png"))
    assert bare.shape == (2 * (2 + 2 * 66), 2 * (2 + 3 * 66), 3)   # 3 a class, classes 2, 5, no margin; x2 to 256+
    margin = png.width - bare.shape[1]                            # the labels' margin: the cells unchanged
    assert margin > 0 and np.array_equal(np.asarray(png)[:, margin:], bare)
    assert json.loads(png.text["rows"]) == ["2", "5"] and (np.asarray(png)[:, :margin] < 128).any()


def test_npz_meta_is_built_in_one_place(run, tmp_path):
    src = generation.open_checkpoint(locate.resolve(run))
    sample_cfg = dataclasses.replace(src.cfg.sample, cfg_scale=2.0)
    settings = generation.sampling_settings(sample_cfg)
    meta = npz_files.sample_meta(checkpoint="ck.pt", step=src.step, config=src.cfg.to_dict(), settings=settings,
                                 seed=1, classes=[0, 1], num=4, batch_size=3, ema=src.ema, grid=src.grid)
    assert {k: meta[k] for k in ("step", "cfg_scale", "top_p", "per_class", "num", "classes", "grid", "ema")} == \
        {"step": 7, "cfg_scale": 2.0, "top_p": 1.0, "per_class": 2, "num": 4, "classes": [0, 1], "grid": [8, 8],
         "ema": False}
    job = npz_files.NpzJob(tmp_path / "s.npz", generation.balanced_labels(4, [0, 1]), 3, 1, meta)
    sampler = generation.make_sampler(src.model, src.tokenizer, src.grid, sample_cfg)
    images, labels, found = npz_files.read_npz(job.complete(sampler))
    assert images.shape == (4, 8, 8, 3) and labels.tolist() == [0, 0, 1, 1] and found["cfg_scale"] == 2.0
    assert np.array_equal(images, generation.sample_batches(sampler, torch.tensor([0, 0, 1, 1]), 3, 1))


@pytest.mark.parametrize("args, msg", [
    (["--grid", "16x16"], "error: --grid 16x16: this model was trained on a 8x8 grid"),
    (["--seed", "-1"], "error: --seed -1: expected an integer >= 0"),
    (["--per-class", "0"], "error: --per-class 0: expected >= 1"),
    (["--batch-size", "0"], "error: --batch-size 0: expected >= 1"),
])
def test_sample_py_bad_flags_are_one_line_errors(run, tmp_path, args, msg, capsys):
    assert cli_error(sample_main(), ["--ckpt", str(run), "--out", str(tmp_path / "x.png"), "--device", "cpu", *args],
                     capsys) == msg


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_sample_py_cuda_without_cuda_is_a_one_line_error(run, tmp_path, capsys):
    assert cli_error(sample_main(), ["--ckpt", str(run), "--out", str(tmp_path / "x.png"), "--device", "cuda"],
                     capsys) == "error: --device cuda: CUDA is not available on this machine"


@pytest.fixture(scope="module")
def mutor_run(tmp_path_factory):
    """A checkpoint of a tiny random MuToR-2D (D = 4) digits model (it has a register embedding)."""
    from mutor2d.model.gpt import GPT
    folder = tmp_path_factory.mktemp("mutor")
    cfg = config.load(None, ["data.name=digits", "model.preset=tiny", f"model.vocab_size={V}",
                             f"model.num_classes={C}", "objective.name=mutor-2d", "objective.d_max=4"])
    torch.manual_seed(1)
    model = GPT(cfg.model, register_token=True)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    checkpoint.save_atomic({"model": model.state_dict(), "ema": None, "objective": {}, "step": 3,
                            "config": cfg.to_dict(), "grid": [8, 8]}, checkpoint.checkpoint_path(folder, 3))
    return folder


def test_sample_py_speculative_modes_record_their_counts_and_keep_greedy_tokens(run, mutor_run, tmp_path, capsys):
    from mutor2d.evaluation.records import markdown_table
    common = ["--ckpt", str(mutor_run), "--num", "10", "--batch-size", "5", "--device", "cpu",
              "--temperature", "0"]
    out = {}
    for mode in (["plain"], ["registers", "--draft", "2"], ["jacobi", "--window", "3"]):
        path = tmp_path / f"{mode[0]}.npz"
        sample_main()([*common, "--npz", str(path), "--decode", *mode])
        out[mode[0]] = npz_files.read_npz(path)
    plain = out["plain"][2]["decode_stats"]
    assert plain["forwards_per_sequence"] == 64 and "acceptance_by_distance" not in plain
    for mode in ("registers", "jacobi"):
        images, _, meta = out[mode]
        assert np.array_equal(images, out["plain"][0])                    # greedy: the same tokens
        stats = meta["decode_stats"]
        assert stats["forwards_per_sequence"] < 64 and stats["tokens_per_forward"] > 1
        assert len(stats["acceptance_by_distance"]) == {"registers": 2, "jacobi": 3}[mode]
    assert out["registers"][2]["decode_options"] == {"draft": 2, "anchors": "every", "fill": True}
    assert len(out["registers"][2]["decode_stats"]["register_acceptance_by_distance"]) == 2
    rec = {"method": "m", "objective": {}, "metrics": {"fid": 1.0}, "step": 3, "n": 10,
           "sampling": out["registers"][2]}
    table = markdown_table([rec], paper=False)
    assert "decoding" in table.splitlines()[0] and "registers anchors=every draft=2 fill=True:" in table
    assert cli_error(sample_main(), [*common, "--npz", str(tmp_path / "x.npz"), "--decode", "registers", "--draft", "0"],
                     capsys) == "error: --draft 0: expected >= 1"
    assert cli_error(sample_main(), ["--ckpt", str(run), "--num", "10", "--npz", str(tmp_path / "y.npz"),  # next-token
                                     "--device", "cpu", "--decode", "registers"], capsys) == \
        "error: --decode registers: this checkpoint has no registers to draft with (objective ntp); use jacobi or plain"


@pytest.mark.parametrize("args, msg", [
    (["--decode", "registers", "--draft", "5"],
     "error: --draft 5: this checkpoint's registers draft at most 2 tokens (objective mutor-2d, d_max=4)"),
    (["--decode", "jacobi", "--window", "64"],
     "error: --window 64: a 8x8 grid has 64 tokens, so a window guesses at most 63 (the first comes from the prefix)"),
    (["--decode", "jacobi", "--draft", "1"], "error: --draft: not an option of --decode jacobi (its options: --window)"),
    (["--window", "2"], "error: --window: not an option of --decode plain (its options: none)"),
])
def test_sample_py_decode_flags_are_checked_against_the_checkpoint(mutor_run, tmp_path, args, msg, capsys):
    """--draft is bounded by the register offsets the checkpoint's objective trained (D - 2 = 2 for
    D = 4), --window by the grid's token count; a flag of another mode is refused, all in one line."""
    assert cli_error(sample_main(), ["--ckpt", str(mutor_run), "--out", str(tmp_path / "x.png"), "--device", "cpu",
                                     *args], capsys) == msg


def test_decode_defaults_come_from_the_checkpoint(mutor_run, tmp_path):
    """--decode registers without --draft drafts the checkpoint's useful length (2 for D = 4); the stored
    sample.decode section is the default mode, and --decode to another mode drops its fields."""
    ckpt = checkpoint.load(checkpoint.checkpoint_path(mutor_run, 3))
    ckpt["config"]["sample"]["decode"] = {"name": "registers", "anchors": "last"}
    checkpoint.save_atomic(ckpt, tmp_path / "reg.pt")
    common = ["--num", "10", "--batch-size", "10", "--device", "cpu", "--temperature", "0"]
    sample_main()(["--ckpt", str(tmp_path / "reg.pt"), *common, "--npz", str(tmp_path / "a.npz")])
    sample_main()(["--ckpt", str(tmp_path / "reg.pt"), *common, "--npz", str(tmp_path / "b.npz"), "--decode", "jacobi"])
    sample_main()(["--ckpt", str(tmp_path / "reg.pt"), *common, "--npz", str(tmp_path / "c.npz"), "--decode", "plain"])
    a, b, c = (npz_files.read_npz(tmp_path / f"{n}.npz") for n in "abc")
    assert (a[2]["decode"], a[2]["decode_options"]) == ("registers", {"draft": 2, "anchors": "last", "fill": True})
    assert (b[2]["decode"], b[2]["decode_options"]) == ("jacobi", {"window": 4})
    assert (c[2]["decode"], c[2]["decode_options"]) == ("plain", {})
    assert np.array_equal(a[0], c[0]) and np.array_equal(b[0], c[0])         # greedy: plain's tokens


# ----------------------------------------------------------------------------- training hooks, npz reruns, codes

def fake_run(cfg, model, grid, device, run_dir):
    """What SampleGrids / OnlineEval read of a training run (RunState), on one process."""
    from types import SimpleNamespace
    return SimpleNamespace(cfg=cfg, sample_model=model, sampling_model=lambda: model, grid=grid,
                           device=torch.device(device), run_dir=run_dir, main=True, acc=SimpleNamespace(wait_for_everyone=lambda: None, log=lambda *a, **k: None))


def tiny_vq_tokenizer():
    from mutor2d.tokenizer.config import vq_config
    from mutor2d.tokenizer.vq import VQTokenizer
    from mutor2d.tokenizer.vq_model import VQModel
    torch.manual_seed(0)
    return VQTokenizer(VQModel(vq_config("tiny", **TINY_VQ)))


TINY_VQ = dict(codebook_size=V, codebook_embed_dim=4, ch=8, ch_mult=(1, 2), num_res_blocks=1, z_channels=8,
               norm_groups=4, image_size=8, usage_window=0)


def test_training_hooks_decode_on_the_run_device(monkeypatch, tmp_path):
    """Sample grids and online evaluation get the tokenizer with its weights on the run's device (the
    model's), not where the engine's loop.Hooks made it (the CPU). "meta" stands in for a GPU here."""
    from mutor2d.engine.hooks import StepStatus
    from mutor2d.engine.runlog import JsonLog
    from mutor2d.evaluation import online
    from mutor2d.image.hooks import OnlineEval, SampleGrids
    seen = {}

    def grid(model, tokenizer, *args, **kwargs):
        seen["grid"] = generation.tokenizer_device(tokenizer)

    def evaluate(model, data_cfg, per_class, sample_cfg, tokenizer, *args, **kwargs):
        seen["eval"] = generation.tokenizer_device(tokenizer)
        return {}

    monkeypatch.setattr(generation, "write_grid", grid)
    monkeypatch.setattr(online, "online_digits_eval", evaluate)
    cfg = config.load(None, ["data.name=digits", "train.eval_every=1", "train.tracker=none"])
    run = fake_run(cfg, None, (4, 4), "meta", tmp_path)
    tokenizer = tiny_vq_tokenizer()
    assert tokenizer.device.type == "cpu"
    SampleGrids(tokenizer, [0, 1])(run, StepStatus(done=1, last=True))
    OnlineEval(tokenizer, JsonLog(tmp_path / "log.jsonl", 0, False))(run, StepStatus(done=1, last=True))
    assert seen == {"grid": torch.device("meta"), "eval": torch.device("meta")}


def test_sample_grid_hook_equals_sample_py(run, tmp_path):
    """The training hook's PNG (tokenizer moved to the run's device) is sample.py's PNG, byte for byte."""
    from mutor2d.engine.hooks import StepStatus
    from mutor2d.image.hooks import SampleGrids
    src = generation.open_checkpoint(locate.resolve(run), device="cpu")
    classes = generation.grid_classes(src.cfg.sample, src.cfg.model.num_classes)
    SampleGrids(src.tokenizer, classes)(fake_run(src.cfg, src.model, src.grid, "cpu", tmp_path), StepStatus(7, True))
    sample_main()(["--ckpt", str(run), "--out", str(tmp_path / "cli.png"), "--device", "cpu"])
    assert (tmp_path / "samples" / "step_00000007.png").read_bytes() == (tmp_path / "cli.png").read_bytes()


def test_is_complete_reads_only_the_meta(run, tmp_path, monkeypatch):
    """Rerunning a finished npz job reads its meta entry, never the images (~10 GB at 50K x 256 px)."""
    src = generation.open_checkpoint(locate.resolve(run))
    settings = generation.sampling_settings(src.cfg.sample)
    labels = generation.balanced_labels(4, [0, 1])

    def job(seed):
        meta = npz_files.sample_meta(checkpoint="ck.pt", step=src.step, config=src.cfg.to_dict(), settings=settings,
                                     seed=seed, classes=[0, 1], num=4, batch_size=2, ema=src.ema, grid=src.grid)
        return npz_files.NpzJob(tmp_path / "s.npz", labels, 2, seed, meta)

    job(1).complete(generation.make_sampler(src.model, src.tokenizer, src.grid, src.cfg.sample))
    read, get = [], np.lib.npyio.NpzFile.__getitem__
    monkeypatch.setattr(np.lib.npyio.NpzFile, "__getitem__", lambda f, key: read.append(key) or get(f, key))
    assert job(1).is_complete() and not job(2).is_complete()
    assert read and set(read) == {"meta"}


def test_sample_py_without_the_codes_folder(tmp_path, capsys):
    """A codes-trained checkpoint samples on a machine without its codes folder: one warning line, once."""
    from PIL import Image

    from mutor2d.data.tokens import build_tokenizer
    from mutor2d.model.gpt import GPT
    from mutor2d.tokenizer.extract import extract
    from mutor2d.tokenizer.vq import VQTokenizer
    model = tiny_vq_tokenizer().model
    vq = tmp_path / "vq.pt"
    torch.save({"model": model.state_dict(), "ema": None,
                "config": {"task": "vq", "model": model.config.to_dict()}}, vq)
    tok = VQTokenizer.from_checkpoint(vq)                                   # with its file's sha256, as extract_codes
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / "img" / c).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / "img" / c / f"{i}.png")

    class One:
        process_index, num_processes, is_main_process = 0, 1, True

        def wait_for_everyone(self):
            pass

    codes = tmp_path / "codes"
    extract(tmp_path / "img", codes, tok, state=One(), progress=False, log=lambda *a: None)
    cfg = config.load(None, ["data.name=codes", f"data.path={codes}", f"data.tokenizer={vq}", "model.preset=tiny",
                             f"model.vocab_size={V}", "model.num_classes=2", "sample.per_class=2"])
    model = GPT(cfg.model)
    folder = tmp_path / "run"
    checkpoint.save_atomic({"model": model.state_dict(), "ema": None, "objective": {}, "step": 2,
                            "config": cfg.to_dict(), "grid": [4, 4]}, checkpoint.checkpoint_path(folder, 2))
    sample_main()(["--ckpt", str(folder), "--out", str(tmp_path / "with.png"), "--device", "cpu"])
    assert "warning" not in capsys.readouterr().err
    codes.rename(tmp_path / "elsewhere")
    sample_main()(["--ckpt", str(folder), "--out", str(tmp_path / "without.png"), "--device", "cpu"])
    build_tokenizer(cfg.data)                                              # a second build: no second warning
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and str(codes) in err[0]
    assert (tmp_path / "without.png").read_bytes() == (tmp_path / "with.png").read_bytes()
