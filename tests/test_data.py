"""Token data: digits (pixel and VQ tokenizers), image-folder scanning, augmentations, code
extraction (corrupt files, resume, settings check) and the code dataset."""
import hashlib
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mutor2d import config
from mutor2d.config import make
from mutor2d.registry import named
from mutor2d.data.tokens import CodeDataset, build_dataset, build_tokenizer, collate
from mutor2d.tokenizer.base import TOKENIZERS, parse_tokenizer, tokenizer_kind
from mutor2d.tokenizer.pixel import PixelTokenizer
from mutor2d.tokenizer.codes import CodesError, open_store
from mutor2d.tokenizer.extract import extract
from mutor2d.tokenizer.image_folder import augment, augmentation_names, center_crop_arr, scan_image_folder
from mutor2d.tokenizer.config import vq_config
from mutor2d.tokenizer.vq import VQTokenizer
from mutor2d.tokenizer.vq_model import VQModel
from timeouts import limit

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


ROOT = Path(__file__).resolve().parent.parent
TINY = dict(codebook_size=32, codebook_embed_dim=4, ch=8, ch_mult=(1, 2), num_res_blocks=1, z_channels=8,
            norm_groups=4, image_size=8, usage_window=0)


class Quiet:
    """accelerate-like single-process state."""
    process_index, num_processes, is_main_process = 0, 1, True

    def wait_for_everyone(self):
        pass


@pytest.fixture(scope="module")
def vq_path(tmp_path_factory):
    torch.manual_seed(0)
    model = VQModel(vq_config("tiny", **TINY))
    with torch.no_grad():
        model.quant_conv.weight.mul_(20)  # spread encodings over many codes
    path = tmp_path_factory.mktemp("vq") / "vq.pt"
    torch.save({"model": model.state_dict(), "ema": None,
                "config": {"task": "vq", "model": model.config.to_dict()}}, path)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """3 classes x 3 images of assorted sizes; class 'b' holds one corrupt file."""
    root = tmp_path_factory.mktemp("imgs") / "train"
    rng = np.random.default_rng(0)
    sizes = [(20, 24), (31, 17), (12, 12)]
    for c in ("a", "b", "c"):
        (root / c).mkdir(parents=True)
        for i, (w, h) in enumerate(sizes):
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    (root / "b" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    return root


def run_extract(folder, out, vq_path, **kw):
    lines = []
    tok = VQTokenizer.from_checkpoint(vq_path)
    summary = extract(folder, out, tok, state=Quiet(), progress=False, log=lines.append,
                      **{"num_crops": 2, "flip": True, "shard_size": 2, "batch_size": 5, **kw})
    return summary, lines


# ----------------------------------------------------------------------------- digits

def test_digits_pixel_default():
    cfg = make("data")
    ds = build_dataset(cfg, "train")
    test = build_dataset(cfg, "test")
    assert len(ds) + len(test) == 1797 and ds.grid == (8, 8) and ds.vocab_size == 17 and ds.num_classes == 10
    item = ds[0]
    assert item["body"].shape == (64,) and item["body"].dtype == torch.long and item["prefix"].shape == ()
    batch = collate([ds[i] for i in range(8)])
    assert batch["body"].shape == (8, 64) and batch["prefix"].shape == (8,)
    labels = torch.stack([ds[i]["prefix"] for i in range(len(ds))])
    assert labels.min() == 0 and labels.max() == 9
    assert ds.codes.max() < 17 and ds.codes.min() >= 0
    assert isinstance(build_tokenizer(cfg), PixelTokenizer)
    assert build_tokenizer(cfg).decode(ds.codes[:2]).shape == (2, 3, 8, 8)


def test_digits_validation_split_and_nested_fractions():
    from mutor2d.data.tokens import digits_indices
    old = np.random.default_rng(1234).permutation(1797)           # the first protocol's 80/20 split
    assert np.array_equal(digits_indices("train", 1234), old[:1438])
    assert np.array_equal(digits_indices("test", 1234, 0.15, 0.25), old[1438:])   # test never moves
    val = digits_indices("val", 1234, 0.15)
    full = digits_indices("train", 1234, 0.15, 1.0)
    assert (len(val), len(full)) == (216, 1222)                     # ceil(0.15 * 1438), the rest
    assert not set(val) & set(full) and set(val) | set(full) == set(old[:1438])
    assert np.array_equal(val, digits_indices("val", 1234, 0.15, 0.25))   # val does not depend on the fraction
    assert np.array_equal(full, digits_indices("train", 1234, 0.15))     # fixed by the seed
    quarter, half = (digits_indices("train", 1234, 0.15, f) for f in (0.25, 0.5))
    assert (len(quarter), len(half)) == (306, 611)                  # ceil(f * 1222)
    assert set(quarter) < set(half) < set(full)
    assert not set(digits_indices("val", 1235, 0.15)) == set(val)   # another data_seed, another split
    cfg = make("data", val_fraction=0.15, train_fraction=0.5)
    train, valid = build_dataset(cfg, "train"), build_dataset(cfg, "val")
    assert (len(train), len(valid)) == (611, 216)
    assert len(np.unique(valid.labels.numpy())) == 10               # every digit is in the validation split
    with pytest.raises(ValueError, match=r"^split 'val': needs data.val_fraction > 0"):
        build_dataset(make("data"), "val")


@pytest.mark.parametrize("key, value, needle", [
    ("val_fraction", 1.0, "data.val_fraction: expected a number in [0, 1)"),
    ("val_fraction", -0.1, "data.val_fraction: expected a number in [0, 1)"),
    ("train_fraction", 0.0, "data.train_fraction: expected a number in (0, 1]"),
    ("train_fraction", 1.5, "data.train_fraction: expected a number in (0, 1]"),
])
def test_digits_split_settings_are_checked(key, value, needle):
    from mutor2d.config import ConfigError
    with pytest.raises(ConfigError) as e:
        make("data", **{key: value})
    assert str(e.value).startswith(needle) and f"got {value!r}" in str(e.value) and "\n" not in str(e.value)


def test_digits_through_a_vq_tokenizer(vq_path):
    cfg = make("data", tokenizer=str(vq_path))
    ds = build_dataset(cfg, "test")
    assert torch.equal(build_dataset(make("data", tokenizer=f"vq:{vq_path}"), "test").codes, ds.codes)
    assert ds.grid == (4, 4) and ds.vocab_size == 32 and ds.num_classes == 10
    assert ds[0]["body"].shape == (16,) and 0 <= ds.codes.min() and ds.codes.max() < 32
    assert len(ds.codes.unique()) > 1
    tok = build_tokenizer(cfg)
    assert tok.decode(ds.codes[:3]).shape == (3, 3, 8, 8)
    assert (tok.grid, tok.image_size, tok.vocab_size) == ((4, 4), 8, 32) and tok.to("cpu").device.type == "cpu"


# ----------------------------------------------------------------------------- folders and augmentations

def test_scan_image_folder_and_layout_errors(folder, tmp_path):
    files, labels, classes = scan_image_folder(folder)
    assert classes == ["a", "b", "c"] and len(files) == 9 and labels == [0] * 3 + [1] * 3 + [2] * 3
    assert files[0] == str(Path("a") / "0.png")
    with pytest.raises(CodesError, match="does not exist"):
        scan_image_folder(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CodesError, match="one subfolder per class"):
        scan_image_folder(tmp_path / "empty")
    flat = tmp_path / "flat"
    flat.mkdir()
    Image.new("RGB", (4, 4)).save(flat / "x.png")
    with pytest.raises(CodesError, match="1 images directly inside"):
        scan_image_folder(flat)
    (flat / "cls").mkdir()
    with pytest.raises(CodesError, match="outside class subfolders"):
        scan_image_folder(flat)
    (flat / "x.png").unlink()
    with pytest.raises(CodesError, match="no images"):
        scan_image_folder(flat)


def test_augmentations():
    assert augmentation_names(1, False) == ["center"]
    assert augmentation_names(3, True) == ["center", "center+flip", "tl", "tl+flip", "tr", "tr+flip"]
    with pytest.raises(CodesError, match="num_crops"):
        augmentation_names(6, True)
    img = Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 70, 3), dtype=np.uint8))
    assert center_crop_arr(img, 16).size == (16, 16)
    # a big image is first halved (BOX) then resized: still the right size
    assert center_crop_arr(img.resize((700, 400)), 16).size == (16, 16)
    names = augmentation_names(5, True)
    views = augment(img, 16, names, crop_range=1.25)
    assert views.shape == (10, 3, 16, 16) and 0 <= views.min() and views.max() <= 1
    assert torch.equal(views[1], views[0].flip(-1))           # center+flip mirrors center
    assert torch.equal(views[3], views[2].flip(-1))
    big = np.asarray(center_crop_arr(img, 20)) / 255.0        # corners of the 1.25x centre crop
    assert torch.allclose(views[2], torch.from_numpy(big[:16, :16]).permute(2, 0, 1).float())
    assert torch.allclose(views[8], torch.from_numpy(big[4:, 4:]).permute(2, 0, 1).float())


# ----------------------------------------------------------------------------- extraction

def test_extract_codes_shapes_labels_skips(folder, vq_path, tmp_path, capsys):
    out = tmp_path / "codes"
    summary, lines = run_extract(folder, out, vq_path)
    assert summary["complete"] and summary["num_skipped"] == 1 and summary["done_shards"] == 5
    assert "skipped 1 unreadable" in lines[-1]
    assert str(folder / "b" / "1.png") in capsys.readouterr().out  # reported by path
    store = open_store(out)
    h = store.header
    assert store.codes.shape == (9, 4, 4, 4) and store.codes.dtype == np.uint16
    assert store.labels.tolist() == [0, 0, 0, 1, -1, 1, 2, 2, 2]
    assert h["grid"] == [4, 4] and h["codebook_size"] == 32 and h["num_augs"] == 4
    assert h["augmentations"] == ["center", "center+flip", "tl", "tl+flip"]
    assert h["classes"] == ["a", "b", "c"] and h["source"] == str(folder.resolve())
    assert h["skipped"] == [str(Path("b") / "1.png")] and len(h["tokenizer_sha256"]) == 64
    assert h["tokenizer"] == f"vq:{vq_path.resolve()}"                    # the identity that rebuilds it
    assert (out / "files.txt").read_text().splitlines()[4] == str(Path("b") / "1.png")
    assert int(store.codes.max()) < 32
    # row 7 = c/1.png: its codes are the tokenizer's codes of its augmented views
    tok = VQTokenizer.from_checkpoint(vq_path)
    with Image.open(folder / "c" / "1.png") as im:
        want = tok.encode(augment(im.convert("RGB"), 8, h["augmentations"], 1.1))
    assert np.array_equal(store.codes[7], want.numpy())


def test_extract_codes_resumes_after_interruption(folder, vq_path, tmp_path):
    full, _ = run_extract(folder, tmp_path / "full", vq_path)
    out = tmp_path / "resumed"
    first, lines = run_extract(folder, out, vq_path, max_shards=2)
    assert not first["complete"] and first["done_shards"] == 2 and "rerun" in lines[-1]
    assert len(list((out / "shards").glob("*.json"))) == 2
    with pytest.raises(CodesError, match="incomplete"):
        open_store(out)
    with pytest.raises(CodesError, match="incomplete"):
        CodeDataset(out)
    marker = out / "shards" / "000000.json"
    stamp = marker.stat().st_mtime_ns
    (out / "shards" / ".000002.json.k1ll3d.tmp").write_text("{")   # a marker write killed mid-way
    second, lines = run_extract(folder, out, vq_path)
    assert second["complete"] and any("2 of 5 shards already done" in s for s in lines)
    assert marker.stat().st_mtime_ns == stamp  # finished shards were not redone
    assert not list(out.rglob("*.tmp"))
    a, b = open_store(tmp_path / "full"), open_store(out)
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.labels, b.labels)
    assert b.header["num_skipped"] == full["num_skipped"] == 1
    with pytest.raises(CodesError, match="other settings.*augmentations"):
        run_extract(folder, out, vq_path, num_crops=1)


def test_extract_codes_splits_shards_over_processes(folder, vq_path, tmp_path):
    class Rank(Quiet):
        def __init__(self, i):
            self.process_index, self.num_processes, self.is_main_process = i, 2, i == 0

    out = tmp_path / "two"
    tok = VQTokenizer.from_checkpoint(vq_path)
    kw = dict(num_crops=2, flip=True, shard_size=2, batch_size=5, progress=False, log=lambda s: None)
    extract(folder, out, tok, state=Rank(1), **kw)  # rank 1: shards 1 and 3
    assert sorted(p.name for p in (out / "shards").iterdir()) == ["000001.json", "000003.json"]
    summary = extract(folder, out, tok, state=Rank(0), **kw)  # rank 0: 0, 2, 4; then finishes
    assert summary["complete"]
    one, _ = run_extract(folder, tmp_path / "one", vq_path)
    assert np.array_equal(open_store(out).codes, open_store(tmp_path / "one").codes)
    assert open_store(out).header["num_skipped"] == 1


def test_extract_codes_script_errors(tmp_path, vq_path):
    (tmp_path / "empty").mkdir()
    r = subprocess.run([sys.executable, "tokenizers/extract_codes.py", "--images", str(tmp_path / "empty"),
                        "--tokenizer", str(vq_path), "--out", str(tmp_path / "o"), "--workers", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=limit(120))
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].startswith("error: image folder") and "Traceback" not in r.stderr


# ----------------------------------------------------------------------------- the code dataset

def test_code_dataset(folder, vq_path, tmp_path):
    out = tmp_path / "codes"
    run_extract(folder, out, vq_path)
    cfg = make("data", name="codes", path=str(out), tokenizer=str(vq_path))
    ds = build_dataset(cfg, "train")
    assert len(ds) == 8 and ds.grid == (4, 4) and ds.vocab_size == 32 and ds.num_classes == 3
    item = ds[0]
    assert item["body"].shape == (16,) and item["body"].dtype == torch.long and item["prefix"].dtype == torch.long
    labels = [int(ds[i]["prefix"]) for i in range(len(ds))]
    assert sorted(labels) == [0, 0, 0, 1, 1, 2, 2, 2]
    store = open_store(out)
    views = {tuple(store.codes[0, a].reshape(-1).tolist()) for a in range(4)}
    torch.manual_seed(0)
    draws = [tuple(ds[0]["body"].tolist()) for _ in range(40)]
    assert set(draws) <= views and len(set(draws)) > 1  # random augmentations, all from the stored ones
    torch.manual_seed(0)
    assert [tuple(ds[0]["body"].tolist()) for _ in range(40)] == draws  # seeded by torch's RNG
    clone = pickle.loads(pickle.dumps(ds))  # what a DataLoader worker receives: no memmap inside
    assert clone._codes is None and torch.equal(clone[3]["prefix"], ds[3]["prefix"])
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=collate)
    batch = next(iter(loader))
    assert batch["body"].shape == (4, 16) and batch["prefix"].shape == (4,)
    tok = build_tokenizer(cfg)
    assert tok.decode(batch["body"].reshape(4, 4, 4)).shape == (4, 3, 8, 8)
    with pytest.raises(ValueError, match="data.test_path"):
        build_dataset(cfg, "test")
    test = build_dataset(make("data", name="codes", path=str(out), test_path=str(out)), "test")
    with pytest.raises(ValueError, match="no validation split"):       # never the test folder in disguise
        build_dataset(make("data", name="codes", path=str(out), test_path=str(out)), "val")
    assert torch.equal(test[0]["body"], torch.from_numpy(store.codes[0, 0].astype(np.int64)).reshape(-1))
    with pytest.raises(ValueError, match="not a codes folder"):
        build_dataset(make("data", name="codes", path=str(tmp_path)), "train")
    with pytest.raises(ValueError, match="tokenizer 'pixel': expected pixel:LEVELS"):   # no data.levels here
        build_tokenizer(make("data", name="codes", path=str(out)))
    with pytest.raises(ValueError, match="has 17 codes but the codes at .* come from a codebook of 32"):
        build_tokenizer(make("data", name="codes", path=str(out), tokenizer="pixel:17"))
    header = json.loads((out / "header.json").read_text())
    header["tokenizer_sha256"] = "0" * 64
    (out / "header.json").write_text(json.dumps(header))
    with pytest.warns(UserWarning, match="not the tokenizer that made the codes"):
        build_tokenizer(cfg)
    (out / "header.json").write_text(json.dumps({**header, "codebook_size": 64}))
    with pytest.raises(ValueError, match="has 32 codes but the codes at .* come from a codebook of 64"):
        build_tokenizer(cfg)


# ----------------------------------------------------------------------------- registries

def test_registries_and_tokenizer_properties():
    assert set(named("data")) >= {"digits", "codes", "stargraph"} and set(TOKENIZERS) >= {"pixel", "vq"}
    assert tokenizer_kind("pixel") == "pixel" and tokenizer_kind("runs/vq/step_1.pt") == "vq"
    assert parse_tokenizer("vq:runs/a.pt") == ("vq", "runs/a.pt") and parse_tokenizer("C:/a.pt") == ("vq", "C:/a.pt")
    with pytest.raises(ValueError, match="expected a VQ checkpoint path"):
        build_tokenizer(make("data", tokenizer="vq"))
    tok = build_tokenizer(make("data"))
    assert (tok.vocab_size, tok.grid, tok.image_size) == (17, (8, 8), 8)
    assert tok.to("cpu") is tok and tok.device is None
    grey = torch.rand(3, 8, 8)
    assert torch.equal(tok.encode(grey[:, None].expand(-1, 3, -1, -1)), tok.encode(grey))
    # the digits' pixel codes are exactly the quantised grey levels (as before the registries)
    from mutor2d.data.tokens import digits_images
    images, labels = digits_images("train", 1234)
    ds = build_dataset(make("data"), "train")
    assert torch.equal(ds.codes, (images.clamp(0, 1) * 16).round().long()) and torch.equal(ds.labels, labels)
    with pytest.raises(ValueError, match="stargraph' has no image tokenizer"):
        build_tokenizer(make("data", name="stargraph"))
    with pytest.raises(config.ConfigError, match="data.name: expected one of"):
        make("data", name="nope")


def test_any_registered_tokenizer_makes_codes(folder, tmp_path):
    """extract_codes.py takes KIND:ARG like data.tokenizer; the header records the tokenizer's identity."""
    from importlib.util import module_from_spec, spec_from_file_location
    spec = spec_from_file_location("extract_codes_script", ROOT / "tokenizers" / "extract_codes.py")
    script = module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "codes"
    script.main(["--images", str(folder), "--tokenizer", "pixel:5", "--image-size", "6", "--out", str(out),
                 "--crops", "1", "--no-flip", "--workers", "0", "--no-progress"])
    store = open_store(out)
    tok = PixelTokenizer(5, (6, 6))
    assert store.header["tokenizer"] == "pixel:5" and store.header["tokenizer_sha256"] == tok.sha256
    assert store.header["grid"] == [6, 6] and store.header["codebook_size"] == 5
    with Image.open(folder / "c" / "2.png") as im:
        view = augment(im.convert("RGB"), 6, ["center"])
    assert np.array_equal(store.codes[8], tok.encode(view).numpy())
    cfg = make("data", name="codes", path=str(out), tokenizer="pixel:5")
    assert build_tokenizer(cfg).identity == "pixel:5" and len(build_dataset(cfg, "train")) == 8
    with pytest.raises(ValueError, match="expected pixel:LEVELS with an integer >= 2, e.g. pixel:17"):
        build_tokenizer(make("data", tokenizer="pixel:many"))


class Broken(PixelTokenizer):
    """A tokenizer that breaks its protocol: its codes lose ``cut`` rows of its grid, and its ids are
    shifted by ``shift`` (past its vocabulary)."""

    def __init__(self, cut: int = 0, shift: int = 0):
        super().__init__(4, (8, 8))
        self.cut, self.shift = cut, shift

    def encode(self, images):
        return super().encode(images)[:, self.cut:] + self.shift


def test_extract_names_a_tokenizer_that_breaks_its_protocol(folder, tmp_path):
    kw = dict(num_crops=1, flip=False, state=Quiet(), progress=False, log=lambda *a: None)
    with pytest.raises(CodesError, match=r"tokenizer 'pixel:4' encoded 2 images to codes of shape \(2, 7, 8\); "
                                         r"expected \(2, 8, 8\) from its grid"):
        extract(folder, tmp_path / "a", Broken(cut=1), batch_size=2, **kw)
    with pytest.raises(CodesError, match=r"tokenizer 'pixel:4' gave ids in \[\d, 7\]; expected ids in \[0, 4\)"):
        extract(folder, tmp_path / "b", Broken(shift=4), **kw)


def test_vq_tokenizer_identity_and_hash(vq_path):
    from_file = VQTokenizer.from_checkpoint(vq_path)
    assert from_file.identity == f"vq:{vq_path.resolve()}"
    assert from_file.sha256 == hashlib.sha256(vq_path.read_bytes()).hexdigest()
    in_memory = VQTokenizer(from_file.model)                   # no file: the hash of its weights
    assert in_memory.identity == "vq:(in memory)" and in_memory.sha256 == VQTokenizer(from_file.model).sha256
    with torch.no_grad():
        from_file.model.quantize.embedding.weight[0, 0] += 1
    assert VQTokenizer(from_file.model).sha256 != in_memory.sha256
    assert build_tokenizer(make("data", tokenizer=f"vq:{vq_path}")).sha256 == from_file.sha256


# ----------------------------------------------------------------------------- bad data is named

def test_code_store_checks_ids_labels_and_shapes(folder, vq_path, tmp_path, monkeypatch):
    import mutor2d.tokenizer.codes as codes_mod
    out = tmp_path / "codes"
    run_extract(folder, out, vq_path)
    codes = np.load(out / "codes.npy", mmap_mode="r+")
    codes[6, 1, 2, 3] = 32                       # codebook size is 32
    codes.flush()
    monkeypatch.setattr(codes_mod, "CHECK_CHUNK", 2 * 64)   # two rows per chunk: found in the 4th chunk
    with pytest.raises(CodesError, match=r"codes.npy'.*row 6 holds token id 32; expected an id below the codebook size 32"):
        open_store(out)
    with pytest.raises(ValueError, match="row 6 holds token id 32"):
        build_dataset(make("data", name="codes", path=str(out)), "train")
    codes[6, 1, 2, 3] = 0
    codes.flush()
    labels = np.load(out / "labels.npy", mmap_mode="r+")
    for bad in (3, -2):                          # 3 classes: 3 would silently be the CFG null class
        labels[2] = bad
        labels.flush()
        with pytest.raises(CodesError, match=rf"labels.npy'.*row 2 holds label {bad}; expected -1 \(unreadable"):
            open_store(out)
    labels[2] = 0
    labels.flush()
    open_store(out)
    np.save(out / "labels.npy", np.zeros(5, dtype=np.int64))
    with pytest.raises(CodesError, match=r"labels.npy' holds int64 \(5,\), expected int64 \(9,\)"):
        open_store(out)
    header = json.loads((out / "header.json").read_text())
    (out / "header.json").write_text(json.dumps({**header, "codebook_size": 0}))
    with pytest.raises(CodesError, match="header.json'.*codebook_size=0"):
        open_store(out)


def test_extracting_nothing_is_an_error(vq_path, tmp_path):
    root = tmp_path / "bad"
    (root / "a").mkdir(parents=True)
    (root / "a" / "0.png").write_bytes(b"not an image")
    with pytest.raises(CodesError, match="no image of .* could be read"):
        run_extract(root, tmp_path / "o1", vq_path)
    r = subprocess.run([sys.executable, "tokenizers/extract_codes.py", "--images", str(root), "--tokenizer",
                        str(vq_path), "--out", str(tmp_path / "o2"), "--workers", "0", "--no-progress"],
                       cwd=ROOT, capture_output=True, text=True, timeout=limit(120))
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: no image of")


class Payload:
    """Unpickling this runs code: it writes ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def test_payload_tokenizer_never_runs(folder, tmp_path):
    marker = tmp_path / "marker"
    evil = tmp_path / "evil.pt"
    torch.save({"model": {"x": torch.zeros(1)}, "extra": Payload(marker)}, evil)
    with pytest.raises(ValueError, match=r"evil.pt' refused.*builtins.exec"):
        build_dataset(make("data", tokenizer=str(evil)), "train")
    r = subprocess.run([sys.executable, "tokenizers/extract_codes.py", "--images", str(folder), "--tokenizer",
                        str(evil), "--out", str(tmp_path / "o"), "--workers", "0", "--no-progress"],
                       cwd=ROOT, capture_output=True, text=True, timeout=limit(120))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: VQ checkpoint") and "evil.pt" in r.stderr
    assert not marker.exists()


# ----------------------------------------------------------------------------- atomic writes

def test_atomic_writes(tmp_path):
    from mutor2d.io import remove_stale_temps, write_atomic, write_json_atomic, write_text_atomic
    path = tmp_path / "sub" / "a.json"
    write_json_atomic(path, {"x": 1})
    assert json.loads(path.read_text()) == {"x": 1}
    write_text_atomic(path, "old")

    def boom(f):
        f.write(b"half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        write_atomic(path, boom)
    assert path.read_text() == "old" and sorted(p.name for p in path.parent.iterdir()) == ["a.json"]
    with pytest.raises(ValueError):
        write_json_atomic(path, {"loss": float("nan")})   # not JSON
    assert path.read_text() == "old"
    (path.parent / ".a.json.x1y2.tmp").write_bytes(b"left by a SIGKILL")
    (path.parent / ".other.tmp").write_bytes(b"")
    assert [p.name for p in remove_stale_temps(path.parent, "a.json")] == [".a.json.x1y2.tmp"]
    assert len(remove_stale_temps(path.parent)) == 1 and sorted(p.name for p in path.parent.iterdir()) == ["a.json"]
