"""Command-line values and writers: every value a command takes is checked where it is parsed
(bad and huge values are one line naming the value and the limit, before anything is allocated),
checkpoints and code stores that pass their checksums but are incomplete or of the wrong dtype are
one line, and every writer turns a full disk (exit 74) or a refused folder (exit 2) into one line and
leaves no partial file under its final name. One test per fault; docs/RELIABILITY.md lists them."""
import errno
import importlib.util
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from mutor2d import config, io
from mutor2d import checkpoint
from mutor2d.checkpoint.__main__ import main as checkpoint_main
from mutor2d.sampling import images as generation
from mutor2d.checks import ConfigError
from mutor2d.engine.loop import train
from mutor2d.lm import data as lm_data
from mutor2d.tokenizer import codes
from conftest import TINY_DIGITS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

TINY = TINY_DIGITS


def script(path: str, name: str):
    """The module of a script (sample.py, eval/fid.py, ...), imported without running it."""
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run(tiny_digits_run):
    return tiny_digits_run


@pytest.fixture(scope="module")
def sample():
    return script("sample.py", "sample_cli_values")


@pytest.fixture(scope="module")
def extract_codes():
    return script("tokenizers/extract_codes.py", "extract_codes_cli_values")


@pytest.fixture(scope="module")
def lm_accuracy():
    return script("eval/lm_accuracy.py", "lm_accuracy_cli_values")


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def exits(main, argv, capsys) -> tuple[int, str]:
    """(exit code, the one error line) of ``main(argv)``."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code, one_error_line(capsys)


def disk_full(monkeypatch, module) -> None:
    """``module.write_atomic`` (a writer's atomic write) runs into a full disk once it writes data."""
    real = io.write_atomic

    def full(f):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(module, "write_atomic", lambda path, write_fn: real(path, full))


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------- 1. undetected corruption

def latest(run: Path) -> Path:
    return checkpoint.latest_valid(run)


@pytest.mark.parametrize("key", ["step", "rng", "optimizer"])
def test_a_checkpoint_missing_an_entry_is_one_line_naming_it(run, sample, tmp_path, capsys, key):
    ckpt = {k: v for k, v in checkpoint.load(latest(run)).items() if k not in (key, io.CHECKSUM_KEY)}
    bad = checkpoint.save_atomic(ckpt, tmp_path / "run" / "checkpoints" / "step_00000002.pt")   # a valid checksum
    if key == "step":
        code, line = exits(sample.main, ["--ckpt", str(bad), "--device", "cpu"], capsys)
        assert code == 2
    else:                                                          # read when a run resumes from it
        with pytest.raises(checkpoint.CheckpointError) as e:
            train(config.load("digits_mutor2d.yaml", [*TINY, "train.max_steps=3"]), tmp_path / "run", resume=str(bad))
        line = str(e.value)
    assert str(bad) in line and f"has no {key!r} entry" in line and "\n" not in line


def test_non_finite_weights_are_refused_naming_the_first_tensor(run, sample, tmp_path, capsys):
    ckpt = dict(checkpoint.load(latest(run)))
    name = next(iter(ckpt["model"]))
    for weights in ("model", "ema"):
        if ckpt.get(weights) is not None:
            ckpt[weights] = {**ckpt[weights], name: torch.full_like(ckpt[weights][name], float("nan"))}
    bad = checkpoint.save_atomic({k: v for k, v in ckpt.items() if k != io.CHECKSUM_KEY}, tmp_path / "nan.pt")
    code, line = exits(sample.main, ["--ckpt", str(bad), "--device", "cpu"], capsys)
    assert code == 2 and str(bad) in line and "non-finite" in line and repr(name) in line
    assert not (tmp_path / "nan_samples").exists()


def small_store(path: Path) -> Path:
    """A complete codes folder of 4 images (2 augmentations, 3x3 grid) written by hand."""
    path.mkdir()
    header = {"format": codes.FORMAT, "grid": [3, 3], "codebook_size": 17, "classes": ["a", "b"], "num_images": 4,
              "num_augs": 2, "num_shards": 1, "complete": True}
    (path / "header.json").write_text(json.dumps(header))
    np.save(path / "labels.npy", np.zeros(4, np.int64))
    np.save(path / "codes.npy", np.zeros((4, 2, 3, 3), np.uint16))
    return path


def test_a_zero_length_or_truncated_codes_file_is_one_line(tmp_path):
    store = small_store(tmp_path / "codes")
    whole = (store / "codes.npy").read_bytes()
    for cut, why in ((0, "EOFError"), (len(whole) - 10, "mmap length")):
        (store / "codes.npy").write_bytes(whole[:cut])
        with pytest.raises(codes.CodesError) as e:
            codes.open_store(store)
        assert "codes.npy" in str(e.value) and why in str(e.value) and "\n" not in str(e.value)


def image_folder(root: Path) -> Path:
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(2):
            from PIL import Image
            Image.fromarray(np.full((12, 12, 3), 40 * i + 60 * (c == "b"), np.uint8)).save(root / c / f"{i}.png")
    return root


def test_resuming_a_code_store_of_the_wrong_dtype_is_refused(extract_codes, tmp_path, capsys):
    images, out = image_folder(tmp_path / "images"), tmp_path / "codes"
    argv = ["--images", str(images), "--tokenizer", "pixel:5", "--out", str(out), "--no-progress", "--workers", "0"]
    extract_codes.main(argv)
    shape = codes.open_store(out).codes.shape
    np.save(out / "codes.npy", np.zeros(shape, np.float16))          # the .npy header names float16
    for marker in (out / "shards").glob("*.json"):
        marker.unlink()
    code, line = exits(extract_codes.main, argv, capsys)
    assert code == 2 and "codes.npy" in line and "float16" in line and "expected uint16" in line


# ----------------------------------------------------------------------------- 2. huge values

@pytest.mark.parametrize("flags, needle", [(["--num", str(10 ** 7), "--npz", "x.npz"],
                                            "--num 10000000: expected at most 1000000"),
                                           (["--per-class", str(10 ** 9)],
                                            "--per-class 1000000000: expected at most 1024")])
def test_huge_sample_counts_are_refused_before_anything_loads(sample, tmp_path, capsys, flags, needle):
    code, line = exits(sample.main, ["--ckpt", str(tmp_path / "nowhere"), *flags], capsys)
    assert code == 2 and needle in line


def test_a_grid_larger_than_memory_is_refused_naming_both_sizes(run, sample, capsys, monkeypatch):
    from mutor2d import checks
    monkeypatch.setattr(checks, "physical_memory", lambda: 2 ** 20)     # a 1 MiB machine
    code, line = exits(sample.main, ["--ckpt", str(run), "--device", "cpu", "--per-class", "64"], capsys)
    assert code == 2 and "--per-class 64: 128 images of 64x64 pixels, 0.00146 GiB; this machine has 0.000977 GiB" in line
    assert not (run / "samples").exists() or not list((run / "samples").glob("step_*_x64_*.png"))


@pytest.mark.parametrize("item, needle", [
    ("train.eval_per_class=1000000000", "train.eval_per_class: expected <= 10000"),
    ("sample.per_class=1000000000", "sample.per_class: expected <= 1024"),
    ("model.dim=1000000", "expected at most 3e+10"),
    ("data.levels=100000", "data.levels: expected <= 256"),
])
def test_huge_config_values_are_refused_naming_the_limit(item, needle):
    with pytest.raises(ConfigError) as e:
        config.load("digits_mutor2d.yaml", [item])
    assert needle in str(e.value) and item.split("=")[0] in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("flags, needle", [
    (["--image-size", "100000"], "--image-size 100000: expected 1..4096"),
    (["--image-size", "0"], "--image-size 0: expected 1..4096"),
    (["--crop-range", "0"], "--crop-range 0.0: expected a number in [1, 2]"),
    (["--crop-range", "-1"], "--crop-range -1.0: expected a number in [1, 2]"),
    (["--max-shards", "-1"], "--max-shards -1: expected >= 1"),
    (["--workers", str(10 ** 12)], "--workers 1000000000000: expected 0..256"),
])
def test_extract_codes_values_are_checked(extract_codes, tmp_path, capsys, flags, needle):
    images = image_folder(tmp_path / "images")
    code, line = exits(extract_codes.main, ["--images", str(images), "--tokenizer", "pixel:5", "--out",
                                            str(tmp_path / "codes"), "--no-progress", "--workers", "0", *flags], capsys)
    assert code == 2 and needle in line and not (tmp_path / "codes").exists()


# ----------------------------------------------------------------------------- 3. writers

def test_sample_grid_on_a_full_disk_is_exit_74_and_no_file(run, sample, tmp_path, capsys, monkeypatch):
    disk_full(monkeypatch, generation)
    out = tmp_path / "grid.png"
    code, line = exits(sample.main, ["--ckpt", str(run), "--device", "cpu", "--out", str(out)], capsys)
    assert code == io.WRITE_FAILED_EXIT == 74 and str(out) in line and "no space left" in line
    assert files_under(tmp_path) == []


def test_sample_npz_on_a_full_disk_is_exit_74_and_no_file(run, sample, tmp_path, capsys, monkeypatch):
    from mutor2d.sampling import npz as npz_files
    disk_full(monkeypatch, npz_files)
    out = tmp_path / "s.npz"
    with pytest.raises(SystemExit) as e:
        sample.main(["--ckpt", str(run), "--device", "cpu", "--npz", str(out), "--num", "10"])
    *progress, line = capsys.readouterr().err.strip().splitlines()    # the progress bar, then one line
    assert all(p.startswith("shards:") for p in progress) and line.startswith("error: could not write")
    assert e.value.code == 74 and "no space left" in line and files_under(tmp_path) == []


def test_a_refused_folder_is_one_line_exit_2(run, sample, tmp_path, capsys, monkeypatch):
    def read_only(path, write_fn):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(generation, "write_atomic", read_only)
    code, line = exits(sample.main, ["--ckpt", str(run), "--device", "cpu", "--out", str(tmp_path / "g.png")], capsys)
    assert code == 2 and "Read-only file system" in line


def test_checkpoint_export_on_a_full_disk_is_exit_74_and_no_file(run, tmp_path, capsys, monkeypatch):
    disk_full(monkeypatch, io)
    code, line = exits(checkpoint_main, ["export", str(run), str(tmp_path / "w.safetensors")], capsys)
    assert code == 74 and "no space left" in line and files_under(tmp_path) == []


def test_extract_codes_on_a_full_disk_is_exit_74_and_leaves_no_folder(extract_codes, tmp_path, capsys, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(codes.os, "posix_fallocate", full, raising=False)
    images, out = image_folder(tmp_path / "images"), tmp_path / "codes"
    code, line = exits(extract_codes.main, ["--images", str(images), "--tokenizer", "pixel:5", "--out", str(out),
                                            "--no-progress", "--workers", "0"], capsys)
    assert code == 74 and "no space left" in line and not out.exists()


def lm_folder(path: Path, positions: int = 256) -> Path:
    """A folder that names a language model of ``positions`` positions (its config.json alone)."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": positions}))
    return path


def test_lm_accuracy_out_on_a_full_disk_is_exit_74(lm_accuracy, tmp_path, capsys, monkeypatch):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": " 2", "gold": "2"}) + "\n")

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(lm_accuracy, "generate_all", full)
    out = tmp_path / "pred.jsonl"
    code, line = exits(lm_accuracy.main, ["--ckpt", str(lm_folder(tmp_path / "m")), "--data", str(data), "--out",
                                          str(out), "--max-new-tokens", "16"], capsys)
    assert code == 74 and str(out) in line and "no space left" in line and not out.exists()


def test_train_config_naming_a_folder_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="is a folder; expected a YAML file"):      # train.py --config DIR
        config.load(str(tmp_path))


def test_sample_out_naming_a_folder_or_not_a_png_is_one_line(run, sample, tmp_path, capsys):
    code, line = exits(sample.main, ["--ckpt", str(run), "--out", str(tmp_path)], capsys)
    assert code == 2 and "is a directory; expected the path of a .png file" in line
    code, line = exits(sample.main, ["--ckpt", str(run), "--out", str(tmp_path / "g.jpg")], capsys)
    assert code == 2 and "is not a .png file name" in line


def test_extract_codes_out_naming_a_file_is_one_line(extract_codes, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code, line = exits(extract_codes.main, ["--images", str(image_folder(tmp_path / "images")), "--tokenizer",
                                            "pixel:5", "--out", str(tmp_path / "file"), "--workers", "0"], capsys)
    assert code == 2 and "is a file; expected a codes folder" in line and (tmp_path / "file").read_text() == "x"


def test_checkpoint_export_into_a_folder_is_one_line(run, tmp_path):
    with pytest.raises(SystemExit) as e:
        checkpoint_main(["export", str(run), str(tmp_path)])
    assert "is a folder; expected the path of the .safetensors file" in str(e.value.code)
    assert list(tmp_path.iterdir()) == []


def test_lm_accuracy_out_naming_a_folder_is_one_line(lm_accuracy, tmp_path):
    with pytest.raises(ValueError, match="--out .*: is a folder; expected the path of the prediction"):
        lm_accuracy.parse_args(["--score", str(tmp_path / "p.jsonl"), "--kind", "gsm8k", "--out", str(tmp_path)])


# ----------------------------------------------------------------------------- 4. bad values accepted silently

def test_lm_accuracy_max_new_tokens_is_capped_at_the_models_positions(lm_accuracy, tmp_path):
    model = lm_folder(tmp_path / "m", positions=256)
    with pytest.raises(ValueError) as e:
        lm_accuracy.parse_args(["--ckpt", str(model), "--data", "d.jsonl", "--max-new-tokens", str(10 ** 9)])
    assert "--max-new-tokens 1000000000: expected at most 256" in str(e.value)
    assert lm_accuracy.parse_args(["--ckpt", str(model), "--data", "d.jsonl", "--max-new-tokens", "256"])


def test_lm_accuracy_score_of_a_non_json_file_fails(lm_accuracy, tmp_path):
    bad = tmp_path / "notes.txt"
    for text in ("hello\n", ""):
        bad.write_text(text)
        with pytest.raises(ValueError, match="notes.txt"):
            lm_accuracy.main(["--score", str(bad), "--kind", "gsm8k"])


def test_fid_refuses_tiny_images_and_an_empty_metric_list(tmp_path):
    fid = script("eval/fid.py", "fid_cli_values")
    tiny = tmp_path / "tiny.npz"
    np.savez(tiny, images=np.zeros((4, 1, 1, 3), np.uint8))
    argv = [str(tiny), "--ref", str(tiny), "--features", "inception", "--inception-weights", str(tmp_path / "w.pth"),
            "--device", "cpu", "--json", str(tmp_path / "r.json"), "--quiet", "--no-cache"]
    with pytest.raises(ValueError, match="images of 1x1 pixels; --features inception needs at least 8x8"):
        fid.main(argv)
    with pytest.raises(ValueError, match="--metrics '': expected a comma-separated subset"):
        fid.main([*argv, "--metrics", ""])
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("flag, value", [("--layers", "-1"), ("--hidden", "0"), ("--heads", "0")])
def test_lm_tiny_refuses_sizes_below_one(tmp_path, flag, value):
    from mutor2d.lm import tiny
    with pytest.raises(SystemExit) as e:
        tiny.main([str(tmp_path / "m"), flag, value])
    assert e.value.code == f"error: {flag} {value}: expected >= 1" and not (tmp_path / "m").exists()


def test_checkpoint_export_refuses_a_language_model_run(tmp_path, capsys):
    run = tmp_path / "lm_run"
    checkpoint.save_atomic({"model": {}, "config": {"task": "lm"}, "step": 1, "grid": None},
                           checkpoint.checkpoint_path(run, 1))
    with pytest.raises(SystemExit) as e:
        checkpoint_main(["export", str(run), str(tmp_path / "w.safetensors")])
    assert "is a language-model run; its model is saved as" in str(e.value.code)
    assert f"{run}/model.safetensors" in str(e.value.code) and not (tmp_path / "w.safetensors").exists()


def test_sample_classes_empty_is_one_line(run, sample, capsys):
    code, line = exits(sample.main, ["--ckpt", str(run), "--classes", ""], capsys)
    assert code == 2 and "--classes '': expected comma-separated class indices" in line


def test_an_empty_config_file_is_an_error_not_the_default_run(tmp_path):
    for text in ("", "# nothing yet\n"):
        (tmp_path / "empty.yaml").write_text(text)
        with pytest.raises(ConfigError, match="empty.yaml' is empty; expected a mapping of sections"):
            config.load(tmp_path / "empty.yaml")
    (tmp_path / "defaults.yaml").write_text("{}\n")
    assert config.load(tmp_path / "defaults.yaml") == config.from_dict({})


def test_lm_data_check_refuses_an_over_long_line(tmp_path, capsys):
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"prompt": "x" * 20_000, "answer": " 2", "gold": "2"}) + "\n")
    with pytest.raises(SystemExit) as e:
        lm_data.main(["check", str(data)])
    line = one_error_line(capsys)
    assert e.value.code == 2 and f"{data}:1:" in line and f"expected at most {lm_data.CHECK_CHARS}" in line


@pytest.mark.parametrize("flag, value, needle", [("--num", "-1", "--num -1: expected >= 0"),
                                                 ("--batch-size", "0", "--batch-size 0: expected >= 1")])
def test_eval_stargraph_counts_are_checked_before_loading(tmp_path, flag, value, needle):
    stargraph = script("eval/stargraph.py", "stargraph_cli_values")
    with pytest.raises(ValueError, match=needle):
        stargraph.main(["--ckpt", str(tmp_path / "nowhere"), flag, value])


# ----------------------------------------------------------------------------- 5. hostile values sweep

def test_a_writer_refuses_a_pipe_or_device_as_its_file(tmp_path, capsys):
    fifo = tmp_path / "fifo"                                   # as /dev/null: the rename would replace it
    os.mkfifo(fifo)
    with pytest.raises(SystemExit) as e:
        lm_data.main(["arith", str(fifo), "--count", "2"])
    line = one_error_line(capsys)
    assert e.value.code == 2 and "is a device, pipe or socket; expected the path of a regular file" in line
    assert stat.S_ISFIFO(fifo.stat().st_mode) and files_under(tmp_path) == []


@pytest.mark.parametrize("flags, needle", [
    (["--grid", "100000x100000"], "--grid '100000x100000': 10000000000 tokens; expected at most 65536"),
    (["--prefix", str(10 ** 12)], "1000000000016 tokens; expected at most 256 in a figure"),
    (["--dmax2d", "0"], "--dmax2d 0: expected 2..256"),
    (["--grid", "1x8", "--dmin", "0"], "--dmin 0 --dmax 4: expected 1 <= dmin <= dmax <= 65536"),
    (["--sparse", "-1"], "--sparse -1: expected >= 0"),
    (["--out", "mask"], "--out 'mask': expected the path of a .png file"),
])
def test_mask_figure_values_are_checked_before_drawing(tmp_path, capsys, monkeypatch, flags, needle):
    from mutor2d.objectives import figure as mask_figure
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        mask_figure.main(flags)
    assert e.value.code == 2 and needle in capsys.readouterr().err and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags, needle", [
    (["--presets", "B,zz"], "--presets 'B,zz': 'zz' is not a preset; expected a comma-separated list of tiny"),
    (["--grid", str(10 ** 12)], "--grid 1000000000000: expected at most 256"),
])
def test_bench_scaling_refuses_unknown_presets_and_huge_grids(capsys, flags, needle):
    with pytest.raises(SystemExit) as e:
        script("bench/scaling.py", "scaling_cli_values").parse(flags)
    assert e.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("argv, needle", [
    (["stargraph", "--count", "0"], "--count 0: expected 1..10000000"),
    (["stargraph", "--count", str(10 ** 12)], "--count 1000000000000: expected 1..10000000"),
    (["stargraph", "--seed", "-1"], "--seed -1: expected an integer >= 0"),
    (["stargraph", "--num-nodes", str(10 ** 12)], "--num-nodes 1000000000000: expected at most 10000"),
    (["arith", "--steps", "2", str(10 ** 12)], "--steps 2 1000000000000: expected step counts 1..100"),
])
def test_lm_data_generator_values_are_checked_when_parsed(tmp_path, capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        lm_data.main([argv[0], str(tmp_path / "out.jsonl"), *argv[1:]])
    assert e.value.code == 2 and needle in capsys.readouterr().err and not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("item, needle", [("data.num_nodes=1000000", "data.num_nodes: expected <= 10000"),
                                          ("data.num_train=1000000000000", "data.num_train: expected <= 10000000")])
def test_huge_stargraph_config_values_are_refused_naming_the_limit(item, needle):
    with pytest.raises(ConfigError, match=needle):
        config.load("stargraph_ntp.yaml", [item])


@pytest.mark.parametrize("flags, needle", [
    (["--hidden", str(10 ** 12)], "--hidden 1000000000000 --layers 2 --max-positions 256: about 3.2e+25 parameters"),
    (["--layers", str(10 ** 12)], "about 6.55e+16 parameters; expected at most 1e+09"),
    (["--max-positions", str(10 ** 12)], "--max-positions 1000000000000: expected at most 1048576"),
])
def test_lm_tiny_refuses_huge_sizes(tmp_path, flags, needle):
    from mutor2d.lm import tiny
    with pytest.raises(SystemExit) as e:
        tiny.main([str(tmp_path / "m"), *flags])
    assert needle in e.value.code and not (tmp_path / "m").exists()


def test_lm_tiny_refuses_a_file_or_an_empty_path_as_its_folder(tmp_path, monkeypatch):
    from mutor2d.lm import tiny
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("x")
    for out in ("file", ""):                    # was: "wrote file" with nothing written; a model in the cwd
        with pytest.raises(SystemExit) as e:
            tiny.main([out])
        assert e.value.code == f"error: out {out!r}: expected the path of a model folder (a new or existing folder)"
    assert files_under(tmp_path) == ["file"]


def test_hub_push_to_a_bad_repo_id_is_refused_before_writing(run, tmp_path, capsys):
    from mutor2d import hub
    with pytest.raises(SystemExit) as e:
        hub.main(["save", str(run), str(tmp_path / "hub"), "--push", "/tmp/x"])
    assert e.value.code == 2 and "argument --push: '/tmp/x': Repo id must be" in capsys.readouterr().err
    assert not (tmp_path / "hub").exists()


def test_a_failed_hub_push_is_one_line(run, tmp_path, capsys, monkeypatch):
    from mutor2d import hub

    def offline(self, repo_id):
        raise ConnectionError("[Errno -2] Name or service not known")
    monkeypatch.setattr(hub.MutorModel, "push_to_hub", offline)
    code, line = exits(hub.main, ["save", str(run), str(tmp_path / "hub"), "--push", "user/m"], capsys)
    assert code == 2 and line.startswith("error: could not push to 'user/m' (ConnectionError: [Errno -2]")
    assert (tmp_path / "hub" / "config.json").is_file()


def test_leaderboard_of_a_binary_file_names_it(tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\x00\xba\xff" * 10)
    leaderboard = script("eval/leaderboard.py", "leaderboard_cli_values")
    with pytest.raises(ValueError, match=f"{binary}: not a readable JSON record"):      # was: a bare UnicodeDecodeError
        leaderboard.main([str(binary)])


@pytest.mark.parametrize("name, item, needle", [
    ("digits_mutor2d.yaml", "data.num_workers=1000000000000", "data.num_workers: expected <= 256"),
    ("lm_tiny_arith.yaml", "data.num_workers=1000000000000", "data.num_workers: expected <= 256"),
    ("vq_digits.yaml", "data.num_workers=1000000000000", "data.num_workers: expected <= 256"),
    ("vq_digits.yaml", "data.crop_range=1000000000000", "data.crop_range: expected a number in [1, 2]"),
    ("vq_digits.yaml", "model.codebook_size=1000000000000", "vq codebook_size: expected at most 65536"),
    ("vq_digits.yaml", "model.image_size=1000000000000", "vq image_size: expected at most 4096"),
    ("vq_digits.yaml", "model.usage_window=1000000000000", "vq usage_window: expected at most 16777216"),
    ("vq_digits.yaml", "model.ch=1000000000000", "about 2.59e+27 parameters; expected at most 1e+10"),
    ("vq_digits.yaml", "model.in_channels=1000000000000", "parameters; expected at most 1e+10"),
])
def test_huge_worker_counts_and_vq_sizes_are_refused_naming_the_limit(name, item, needle):
    with pytest.raises(ConfigError) as e:
        config.load(name, [item])
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_huge_lora_rank_is_refused_at_load():
    with pytest.raises(ConfigError, match="model.lora_r: expected <= 8192"):
        config.load("lm_tiny_arith.yaml", ["model.lora_r=1000000000000"])


def test_lm_eval_max_new_tokens_is_capped_at_the_models_positions_before_weights_load(tmp_path):
    from mutor2d.lm import tiny
    from mutor2d.lm.run import LMRun
    model = tiny.write_tiny_llama(tmp_path / "m", max_positions=64)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "Ann has 1 coin. How many coins?", "answer": "1\n#### 1"}) + "\n")
    cfg = config.load("lm_tiny_arith.yaml", [f"model.hf={model}", f"data.path={data}", f"eval.path={data}",
                                             "eval.max_new_tokens=1000000000000"])     # was: a generation loop
    with pytest.raises(ConfigError, match="eval.max_new_tokens: expected at most 64, the model's positions"):
        LMRun().prepare_data(cfg)


@pytest.mark.parametrize("flag", ["--out", "--ckpt"])
def test_lm_accuracy_empty_paths_are_refused(lm_accuracy, tmp_path, capsys, flag):
    argv = {"--out": ["--ckpt", str(lm_folder(tmp_path / "m")), "--data", "d.jsonl"], "--ckpt": ["--data", "d.jsonl"]}
    with pytest.raises(SystemExit) as e:
        lm_accuracy.parse_args([*argv[flag], flag, ""])
    assert e.value.code == 2 and f"{flag} '': expected a path" in capsys.readouterr().err


def test_lm_accuracy_out_naming_a_pipe_is_refused_before_the_model_loads(lm_accuracy, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)                                       # was: /dev/null replaced by the predictions file
    with pytest.raises(ValueError, match="--out .*fifo: is a device, pipe or socket; expected the path"):
        lm_accuracy.parse_args(["--ckpt", str(lm_folder(tmp_path / "m")), "--data", "d.jsonl", "--out", str(fifo)])
    assert stat.S_ISFIFO(fifo.stat().st_mode)


@pytest.mark.parametrize("flag, needle", [("--json", "is a file without the .json suffix; expected a .json path"),
                                          ("--cache-dir", "is a file; expected a folder")])
def test_fid_json_or_cache_dir_naming_a_plain_file_is_one_line(tmp_path, flag, needle):
    fid = script("eval/fid.py", "fid_paths_cli_values")
    (tmp_path / "notes").write_text("x")                  # was: "[Errno 17] File exists: 'notes'" after scoring
    argv = ["s.npz", "--ref", "digits:test", flag, str(tmp_path / "notes")]
    with pytest.raises(ValueError, match=f"{flag} '.*notes': {needle}"):
        fid.check_args(fid.parse_args(argv))
    assert (tmp_path / "notes").read_text() == "x"


def test_sample_out_empty_is_one_line(run, sample, capsys):
    code, line = exits(sample.main, ["--ckpt", str(run), "--out", ""], capsys)    # was: the default grid name
    assert code == 2 and "--out '': is a directory; expected the path of a .png file" in line


@pytest.mark.parametrize("bench", ["train_step", "sample"])
@pytest.mark.parametrize("flags, needle", [(["--dim", str(10 ** 12), "--heads", "1"], "about 1.2e+25 parameters"),
                                           (["--vocab", str(10 ** 12)], "about 1.54e+15 parameters"),
                                           (["--layers", str(10 ** 12)], "about 7.08e+18 parameters")])
def test_bench_gpt_sizes_are_capped_before_torch(capsys, monkeypatch, bench, flags, needle):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))         # bench scripts import bench/common.py
    with pytest.raises(SystemExit) as e:                     # was: an allocator traceback
        script(f"bench/{bench}.py", f"bench_{bench}_cli_values").parse(flags)
    assert e.value.code == 2 and f"{needle}; expected at most 3e+10" in capsys.readouterr().err


@pytest.mark.parametrize("bench, flags, needle", [
    ("lm_step", ["--vocab", str(10 ** 12)], "--hidden 512 --layers 4 --vocab 1000000000000: about 1.02e+15 parameters"),
    ("lm_step", ["--answer", "1", str(10 ** 12)], "--prompt 120 + --answer 1000000000000: expected at most 2048"),
    ("lm_decode", ["--layers", str(10 ** 12)], "--hidden 64 --layers 1000000000000: about 6.55e+16 parameters"),
    ("lm_decode", ["--max-new-tokens", str(10 ** 12)], "--max-new-tokens 1000000000000: expected at most 256 "
                                                       "(the tiny model's positions)"),
    ("lm_step", ["--sparse", str(10 ** 12)], "--sparse 1000000000000: expected at most 160 (registers of the "
                                             "longest answer, --answer MAX)"),
    ("lm_step", ["--batch", str(10 ** 12)], "--batch 1000000000000: its logits alone, "),
])
def test_bench_llama_sizes_are_capped_before_torch(capsys, monkeypatch, bench, flags, needle):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    with pytest.raises(SystemExit) as e:                     # was: an allocator traceback
        script(f"bench/{bench}.py", f"bench_{bench}_cli_values").parse(flags)
    assert e.value.code == 2 and needle in capsys.readouterr().err


def extrapolation():
    return script("eval/extrapolation.py", "extrapolation_cli_values")


def test_extrapolation_stack_is_capped(run, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:                     # was: an allocator traceback
        extrapolation().parse_args(["image", "--run", f"a={run}", "--out", str(tmp_path / "x.json"),
                                    "--stack", str(10 ** 12)])
    assert e.value.code == 2 and "--stack 1000000000000: expected 2..256" in capsys.readouterr().err


def test_extrapolation_out_naming_a_pipe_is_one_line(run, tmp_path, capsys, monkeypatch):
    module, fifo = extrapolation(), tmp_path / "fifo"
    os.mkfifo(fifo)
    monkeypatch.setattr(module, "curves", lambda args: [])
    code, line = exits(module.main, ["image", "--run", f"a={run}", "--out", str(fifo)], capsys)
    assert code == 2 and "is a device, pipe or socket" in line and stat.S_ISFIFO(fifo.stat().st_mode)


@pytest.mark.parametrize("bench", ["lm_decode", "lm_step", "sample", "train_step"])
def test_bench_threads_beyond_the_cores_are_one_line(capsys, monkeypatch, bench):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    with pytest.raises(SystemExit) as e:                     # was: "Overflow when unpacking long" in torch
        script(f"bench/{bench}.py", f"bench_{bench}_threads_cli_values").parse(["--threads", str(10 ** 12)])
    needle = f"--threads 1000000000000: expected at most {os.cpu_count()}"
    assert e.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("bench", ["lm_decode", "lm_step", "sample", "train_step"])
def test_bench_reps_that_would_time_for_ever_are_one_line(capsys, monkeypatch, bench):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    with pytest.raises(SystemExit) as e:                     # was: timing 10**12 repetitions
        script(f"bench/{bench}.py", f"bench_{bench}_reps_cli_values").parse(["--reps", str(10 ** 12)])
    assert e.value.code == 2 and "--reps 1000000000000: expected at most 10000" in capsys.readouterr().err
    script(f"bench/{bench}.py", f"bench_{bench}_reps_ok_cli_values").parse(["--reps", "10000"])   # the limit itself


@pytest.mark.parametrize("bench", ["lm_step", "sample", "train_step"])
def test_bench_device_that_torch_does_not_know_is_one_line(monkeypatch, bench):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    module = script(f"bench/{bench}.py", f"bench_{bench}_device_cli_values")
    with pytest.raises(SystemExit) as e:                     # was: torch's "Invalid device string" traceback
        module.main(["--device", "abc"])
    assert e.value.code == "error: --device 'abc': not a torch device; expected e.g. cpu, cuda or cuda:1"


def test_fid_record_onto_a_pipe_is_one_line(tmp_path, capsys, monkeypatch):
    from types import SimpleNamespace
    fid, fifo = script("eval/fid.py", "fid_record_cli_values"), tmp_path / "r.json"
    os.mkfifo(fifo)
    monkeypatch.setattr(fid, "score", lambda args, metrics: (SimpleNamespace(metrics={}, skipped={}), None, None))
    monkeypatch.setattr(fid.records, "make_record", lambda *args, **kwargs: {"metrics": {}})
    with pytest.raises(SystemExit) as e:                     # was: an OSError traceback after scoring
        fid.main(["s.npz", "--ref", "digits:test", "--json", str(fifo)])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and line.startswith(f"error: could not write {fifo}") and "is a device, pipe" in line


def test_train_out_naming_a_file_is_one_line(tmp_path, capsys):
    train_py, out = script("train.py", "train_cli_values"), tmp_path / "notes.txt"
    out.write_text("x")                                      # was: a FileExistsError traceback
    with pytest.raises(SystemExit) as e:
        train_py.main(["--config", "digits_mutor2d.yaml", "--out", str(out), *[f"--set={s}" for s in TINY]])
    assert e.value.code == 2 and f"'{out}' exists and is not a folder; expected a run folder" in capsys.readouterr().err
    assert out.read_text() == "x"


def test_bench_lm_decode_work_naming_a_file_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    (tmp_path / "f").write_text("x")                         # was: a FileExistsError traceback
    with pytest.raises(SystemExit) as e:
        script("bench/lm_decode.py", "bench_lm_decode_work_cli_values").parse(["--work", str(tmp_path / "f")])
    assert e.value.code == 2 and "f': exists and is not a folder; expected a work folder" in capsys.readouterr().err


def test_train_out_empty_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)                              # was: the default runs/<config> folder, silently
    with pytest.raises(SystemExit) as e:
        script("train.py", "train_empty_out_cli_values").main(["--config", "digits_mutor2d.yaml", "--out", ""])
    assert e.value.code == 2 and "--out '': expected a run folder path" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_train_vq_with_no_step_to_train_ends_without_a_traceback(tmp_path):
    train_vq = script("tokenizers/train_vq.py", "train_vq_cli_values")
    run_dir = train_vq.main(["--config", "vq_digits.yaml", "--out", str(tmp_path / "vq"), "--max-steps", "0"])
    assert run_dir == tmp_path / "vq" and not (run_dir / "log.jsonl").exists()     # was: FileNotFoundError


def test_fid_json_empty_is_refused_not_taken_as_left_out(tmp_path):
    fid = script("eval/fid.py", "fid_empty_json_cli_values")        # was: '' meant "not given" (RUN/eval/)
    with pytest.raises(ValueError, match=r"^--json '': expected a \.json path or a folder"):
        fid.check_args(fid.parse_args(["s.npz", "--ref", "digits:test", "--json", ""]))
    assert fid.check_args(fid.parse_args(["s.npz", "--ref", "digits:test", "--json", str(tmp_path / "r.json")]))


@pytest.mark.parametrize("argv", [["--config", ""], [" "]])
def test_train_vq_empty_config_is_refused_not_the_default(tmp_path, capsys, argv):
    train_vq = script("tokenizers/train_vq.py", "train_vq_empty_cli_values")   # was: silently vq_digits
    with pytest.raises(SystemExit) as exit_:
        train_vq.main([*argv, "--out", str(tmp_path / "vq")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and "expected a YAML path or a name under configs/" in err[-1]
    assert not (tmp_path / "vq").exists()


def test_a_checkpoint_that_rotation_removed_is_named_with_keep_ckpts(tmp_path):
    """A step checkpoint that is not there, beside others of its run: the error names train.keep_ckpts
    and the checkpoints that remain (was: only "does not exist")."""
    from mutor2d.checkpoint.locate import resolve
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    for step in (750, 1000):
        (folder / f"step_{step:08d}.pt").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match=r"step_00000250.pt' does not exist \(a run keeps only its newest "
                                                r"train.keep_ckpts .* holds step_00000750.pt, step_00001000.pt\)"):
        resolve(folder / "step_00000250.pt")
    with pytest.raises(FileNotFoundError, match=r"'elsewhere.pt' \(/.*/elsewhere.pt\) does not exist$"):  # no hint;
        resolve("elsewhere.pt")                                                   # the absolute path tried


def test_a_bench_launch_dies_with_the_benchmark_that_started_it(tmp_path):
    """bench/fsdp_memory.py's torchrun workers hung on once it was killed: a child started with
    common.die_with_parent gets SIGTERM when its parent dies, even by SIGKILL."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; sys.path.insert(0, 'bench'); "
                               "import common; c = subprocess.Popen(['sleep', '120'], preexec_fn=common.die_with_parent); "
                               "print(c.pid, flush=True); time.sleep(120)"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(child, 0)                                        # alive while its parent is
    parent.kill()
    parent.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        if open(f"/proc/{child}/stat").read().split()[2] == "Z":   # gone, not yet reaped by init
            return
        time.sleep(0.1)
    pytest.fail(f"the child {child} outlived its killed parent")
