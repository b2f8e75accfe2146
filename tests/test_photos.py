"""The photo crops (mutor2d.data.photos): the data set, its four configs on a 16 x 16 token grid,
its tokenizer through tokenizers/extract_codes.py as a user runs it, and its evaluator's sanity checks."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("skimage", reason="the photo crops need scikit-image's bundled photographs: pip install -e .")

from mutor2d.data.photos import CLASSES, crop_params, photo_crops  # noqa: E402
from mutor2d.registry import build  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py
ROOT = Path(__file__).resolve().parent.parent
ARMS = ("ntp", "mutor1d", "mutor2d", "mutor2d_sparse")
SMALL_MODEL = ["model.n_layer=1", "model.n_head=2", "model.dim=32"]


def entry(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_crops_are_natural_distinct_balanced_and_a_function_of_seed_split_and_index():
    images, labels = photo_crops("train", 200, 32, seed=5)
    assert images.shape == (200, 32, 32, 3) and images.dtype == np.uint8 and len(CLASSES) == 10
    assert np.bincount(labels).tolist() == [20] * 10                       # balanced: i mod 10
    assert len({im.tobytes() for im in images}) == 200                     # no repeats
    assert images.std(axis=(1, 2, 3)).min() > 0                             # no flat crops
    again, _ = photo_crops("train", 10, 32, seed=5)
    assert np.array_equal(again, images[:10])                               # a prefix of the same split
    assert np.array_equal(crop_params("train", 150, 3, 5), crop_params("train", 0, 153, 5)[150:])
    test, _ = photo_crops("test", 200, 32, seed=5)
    assert not {im.tobytes() for im in test} & {im.tobytes() for im in images}
    other, _ = photo_crops("train", 10, 32, seed=6)
    assert not np.array_equal(other, images[:10])
    # natural statistics: a pixel says more about its neighbour below than one 8 rows away
    x = images.astype(float).mean(-1)
    near = np.corrcoef(x[:, :-1].ravel(), x[:, 1:].ravel())[0, 1]
    far = np.corrcoef(x[:, :-8].ravel(), x[:, 8:].ravel())[0, 1]
    assert near > 0.9 and far < near - 0.1


@pytest.mark.parametrize("arm", ARMS)
def test_each_photos_config_trains_on_a_16x16_grid(tmp_path, arm):
    from mutor2d.engine.runlog import read_log
    train = entry("train.py")
    sets = ["data.tokenizer=pixel:16", "data.image_size=16", "data.num_train=64", "data.num_test=16",
            "train.max_steps=3", "train.batch_size=8", "train.sample_every=0", "train.log_every=1",
            "train.ckpt_every=0", *SMALL_MODEL]
    run = train.main(["--config", f"photos_{arm}.yaml", "--out", str(tmp_path / arm),
                      *[a for s in sets for a in ("--set", s)]])
    cfg = yaml.safe_load((Path(run) / "config.yaml").read_text())
    assert cfg["data"]["name"] == "photos" and cfg["objective"]["name"] == {"ntp": "ntp", "mutor1d": "mutor-1d"}.get(
        arm, "mutor-2d")
    from mutor2d.config import load
    data = build(load(Path(run) / "config.yaml").data, "train")
    assert data.grid == (16, 16) and data.num_classes == 10
    log = [r for r in read_log(run) if "loss" in r]
    assert log[-1]["step"] == 3 and all(np.isfinite(r["loss"]) for r in log)
    if arm != "ntp":
        assert any("loss_reg" in r or "loss_aux" in r for r in log), log[-1]


def test_the_tokenizer_config_and_the_codes_path_as_a_user_runs_them(tmp_path):
    """export -> train_vq.py (vq_photos.yaml, two steps) -> extract_codes.py -> train.py on the codes:
    a 16 x 16 grid from 32 px crops."""
    from mutor2d.data.photos import main as photos_main
    from mutor2d.tokenizer.codes import open_store
    photos_main(["export", str(tmp_path / "photos"), "--train", "40", "--test", "20"])
    assert len(list((tmp_path / "photos" / "train").rglob("*.png"))) == 40
    vq = entry("tokenizers/train_vq.py").main(
        ["--config", "vq_photos.yaml", "--out", str(tmp_path / "vq"),
         "--set", f"data.path={tmp_path / 'photos' / 'train'}", "--set", f"data.eval_path={tmp_path / 'photos' / 'test'}",
         "--set", "data.eval_images=8", "--set", "train.max_steps=2", "--set", "train.batch_size=4",
         "--set", "train.eval_every=0", "--set", "train.ckpt_every=2"])
    entry("tokenizers/extract_codes.py").main(
        ["--images", str(tmp_path / "photos" / "train"), "--tokenizer", str(vq), "--out", str(tmp_path / "codes"),
         "--workers", "0", "--no-progress"])
    store = open_store(tmp_path / "codes")
    assert store.header["grid"] == [16, 16] and store.header["classes"] == sorted(CLASSES)
    run = entry("train.py").main(
        ["--config", "photos_mutor2d.yaml", "--out", str(tmp_path / "run"),
         *[a for s in [f"data.path={tmp_path / 'codes'}", f"data.tokenizer={vq}", "train.max_steps=2",
                       "train.batch_size=8", "train.sample_every=0", "train.ckpt_every=0", *SMALL_MODEL]
           for a in ("--set", s)]])
    assert (Path(run) / "log.jsonl").is_file()


@pytest.fixture(autouse=True)
def small_references(monkeypatch):
    """photos:train / photos:test of 600 / 300 crops (the real ones: 10,000 / 5,000)."""
    from mutor2d.evaluation import sources
    monkeypatch.setattr(sources, "PHOTOS_REFERENCE_COUNT", {"train": 600, "test": 300})


@pytest.fixture(scope="module")
def small_classifier(tmp_path_factory):
    from mutor2d.evaluation.photos import PhotosClassifierSettings
    return PhotosClassifierSettings(train_images=3000, epochs=2, width=16), tmp_path_factory.mktemp("cache")


def test_the_evaluator_passes_its_sanity_checks(small_classifier):
    """Real vs real FID near 0 and far below blurred crops; class accuracy high with the true labels
    and near chance with shuffled ones."""
    from mutor2d.evaluation.sanity import sanity_check
    settings, cache = small_classifier
    found = sanity_check(300, settings, cache)
    assert found["fid_real"] < found["fid_blurred"] / 10, found
    assert found["accuracy_real"] > 0.5 and found["accuracy_shuffled"] < 0.25, found      # chance: 0.1


def test_fid_py_scores_against_photos_references_with_the_photos_classifier(tmp_path, small_classifier):
    """eval/fid.py picks the photos features for a photos:* reference and reports the samples' class accuracy."""
    from mutor2d.evaluation import photos
    from mutor2d.evaluation.metrics import compute_metrics
    from mutor2d.evaluation.sources import open_images
    settings, cache = small_classifier
    fid = entry("eval/fid.py")
    assert fid.feature_name(fid.build_parser().parse_args(["x.npz", "--ref", "photos:test"])) == "photos"
    weights = photos.photos_classifier_path(settings, cache)
    images, labels = photo_crops("test", 200, 32)
    wrong = (labels + 1) % 10
    from mutor2d.evaluation.sources import ArrayImages, ImageSource
    res = compute_metrics(ImageSource("s", ArrayImages(images), wrong), open_images("photos:test"), features="photos",
                          weights_path=weights, metrics=("fid", "prc"), use_cache=False)
    assert res.metrics["accuracy"] < 0.2 and res.evaluator["feature_extractor"] == "mutor2d-photos"
    assert 0 <= res.metrics["precision"] <= 1 and torch.isfinite(torch.tensor(res.metrics["fid"]))


def test_the_image_study_runs_on_the_photo_crops(tmp_path, small_classifier, monkeypatch):
    """experiments/compare.py with --config study_photos.yaml (tiny sizes): every run is sampled and scored
    with the photos classifier against photos:train, and its floor is real photos:test crops."""
    from mutor2d.evaluation import metrics
    settings, cache = small_classifier
    monkeypatch.setattr(metrics, "PhotosClassifierSettings", lambda data_seed: settings)
    compare = entry("experiments/compare.py")
    sets = ["data.tokenizer=pixel:16", "data.image_size=16", "data.num_train=64", "data.num_test=16",
            "data.path=null", "data.test_path=null", "train.batch_size=8", "optim.warmup_steps=1",
            "train.log_every=1", *SMALL_MODEL]
    compare.main(["--config", "study_photos.yaml", "--out", str(tmp_path / "s"), "--methods", "next-token,mutor-2d-sparse80",
                  "--seeds", "0", "--steps", "2", "--eval-steps", "2", "--num", "20", "--cfg", "1.0", "--jobs", "1",
                  "--floor-draws", "1", "--compute-matched", "", "--cache-dir", str(cache), *[a for s in sets for a in ("--set", s)]])
    recs = [json.loads(p.read_text()) for p in (tmp_path / "s").glob("*/seed0/eval/*.json")]
    assert len(recs) == 2 and {r["reference"] for r in recs} == {"photos:train"}
    assert all(r["evaluator"]["feature_extractor"] == "mutor2d-photos" and "accuracy" in r["metrics"] for r in recs)
    table = (tmp_path / "s" / "table.md").read_text()
    assert "Paired by seed, FID, cfg 1:" in table and "| mutor-2d-sparse80 | 2 | 1 |" in table
    assert "Paired by seed, class accuracy, cfg 1:" in table and "Paired by seed, test NLL, cfg 1:" in table
    assert "Paired by seed, FID averaged over the last 3 steps scored, cfg 1:" in table
    floor = [json.loads(p.read_text()) for p in (tmp_path / "s" / "floor" / "eval").glob("*.json")]
    assert floor and floor[0]["metrics"]["fid"] < min(r["metrics"]["fid"] for r in recs)


def test_the_gpu_protocol_runs_at_toy_size_and_merges(tmp_path, small_classifier, monkeypatch):
    """experiments/gpu_study.py --toy: one block (next-token to 2T, MuToR-2D to T) on the
    CPU through the GPU protocol's path (in this process); it leaves records with provenance and no checkpoints, two blocks merge
    into one study, and the report holds the pre-registered test over both blocks' seeds."""
    from mutor2d.evaluation import metrics
    settings, cache = small_classifier
    monkeypatch.setattr(metrics, "PhotosClassifierSettings", lambda data_seed: settings)
    gpu = entry("experiments/gpu_study.py")
    sets = ["data.tokenizer=pixel:16", "data.image_size=16", "data.num_train=64", "data.num_test=16",
            "data.path=null", "data.test_path=null"]
    for block in (0, 1):
        gpu.main(["--toy", "--per-block", "1", "--block", str(block), "--out", str(tmp_path / f"b{block}"),
                  "--cache-dir", str(cache), *[a for s in sets for a in ("--set", s)]])
    b0 = tmp_path / "b0"
    assert not list(b0.glob("*/seed*/checkpoints")) and not list(b0.glob("*/seed*/samples"))
    ntp = sorted(json.loads(p.read_text())["step"] for p in (b0 / "next-token" / "seed0" / "eval").glob("*.json"))
    assert ntp == [8, 9, 10, 16, 18, 20]
    recs = [json.loads(p.read_text()) for p in b0.glob("*/seed0/eval/*.json")]
    assert all(r["provenance"]["run"]["code"]["commit"] for r in recs) and all("kid" in r["metrics"] for r in recs)
    gpu.main(["--merge", str(b0), str(tmp_path / "b1"), "--into", str(tmp_path / "all")])
    assert sorted(p.name for p in (tmp_path / "all" / "mutor-2d-D4").iterdir()) == ["seed0", "seed1"]
    flags = gpu.study_flags(0, 1, tmp_path / "all", "toy", ["--cache-dir", str(cache), *[a for s in sets for a in ("--set", s)]])
    flags[flags.index("--seeds") + 1] = "0,1"
    summary = entry("experiments/compare.py").main(flags + ["--report-only"])
    [test] = summary["speedup"]
    assert test["n"] == 2 and test["verdict"] in ("confirmed", "refuted", "not decided")
    assert "The pre-registered test, cfg 2:" in (tmp_path / "all" / "table.md").read_text()


def test_the_convergence_study_report_is_rebuilt_from_its_committed_records_alone(tmp_path, monkeypatch):
    """RESULTS' claim: ``compare.py ... --report-only`` reproduces the study's tables from the records in
    docs/studies/convergence_study/records, with its flags (summary.json) and without the photo data or
    the tokenizer (neither is here: a report reads records only)."""
    import shutil
    done = ROOT / "docs" / "studies" / "convergence_study" / "records"
    settings = json.loads((done / "summary.json").read_text())["settings"]
    out = tmp_path / "records"
    shutil.copytree(done, out)
    monkeypatch.chdir(tmp_path)                                   # no data/photos_codes below here
    skip = {"out", "plot", "report_only", "quick", "overrides", "cache_dir", "fraction_plot"}
    flags = [a for k, v in settings.items() if k not in skip and v is not None
             for a in (f"--{k.replace('_', '-')}", str(v))]
    summary = entry("experiments/compare.py").main(flags + ["--out", str(out), "--report-only"])
    assert (out / "table.md").read_text() == (done / "table.md").read_text()
    [test] = summary["speedup"]
    assert test["n"] == len(settings["seeds"].split(",")) and "The pre-registered test, cfg 2:" in summary["table"]
