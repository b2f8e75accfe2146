"""Evaluation: FID/IS/precision/recall/KID through torch-fidelity, ADM-style references, the embedded
digits metric, records and the leaderboard; no loader unpickles a file. Offline: Inception runs on a
stand-in weights file the tests write (random weights, loaded by our safe reader and handed to
torch-fidelity's network)."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn as nn

from torch_fidelity.metric_fid import fid_features_to_statistics

from mutor2d.evaluation import digits as D
from mutor2d.evaluation import metrics as M
from mutor2d.evaluation import online as O
from mutor2d.evaluation import records as R
from mutor2d.evaluation import sources as S
from timeouts import limit

ROOT = Path(__file__).resolve().parent.parent


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"eval_{name}", ROOT / "eval" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def classifier(cache):
    """The default digits classifier, trained once into a temp cache."""
    return D.digits_classifier_path(cache_dir=cache)


@pytest.fixture(scope="module")
def standin_inception(tmp_path_factory):
    """A torch-fidelity Inception weights file with random (He-initialised) weights: built by the
    real FeatureExtractorInceptionV3 with its loading switched off, saved as a state dict, and later
    loaded by torch-fidelity through ``feature_extractor_weights_path`` like the real file."""
    import torch_fidelity.feature_extractor_inceptionv3 as fi
    with torch.random.fork_rng(), \
            mock.patch.object(fi, "load_state_dict_from_url", lambda *a, **k: {}), \
            mock.patch.object(fi.FeatureExtractorInceptionV3, "load_state_dict", lambda self, *a, **k: None):
        torch.manual_seed(0)
        net = fi.FeatureExtractorInceptionV3(M.INCEPTION, ["2048"])
        for m in net.modules():
            if isinstance(m, nn.Conv2d):      # keep activations alive through 40+ layers
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    path = tmp_path_factory.mktemp("weights") / "standin-inception.pth"
    torch.save(net.state_dict(), path)
    return path


def source(images, labels=None, name="x"):
    return S.ImageSource(name, S.ArrayImages(images), labels, identity=name)


def save_samples(path, images, labels, meta):
    np.savez(path, images=images, labels=labels, meta=np.array(json.dumps(meta)))
    return path


# ----------------------------------------------------------------------------- FID formula

def test_frechet_distance_equals_torch_fidelity_formula():
    from torch_fidelity.metric_fid import fid_statistics_to_metric
    rng = np.random.default_rng(0)
    for n in (10, 200):                     # singular (n < D) and full-rank covariances
        a, b = rng.normal(size=(n, 64)), rng.normal(1.0, 2.0, size=(n, 64)) @ rng.normal(size=(64, 64))
        s1 = {"mu": a.mean(0), "sigma": np.cov(a, rowvar=False)}
        s2 = {"mu": b.mean(0), "sigma": np.cov(b, rowvar=False)}
        ref = fid_statistics_to_metric(s1, s2, False)["frechet_inception_distance"]
        ours = M.frechet_distance(s1["mu"], s1["sigma"], s2["mu"], s2["sigma"])
        low_rank = M.frechet_distance(s1["mu"], s1["sigma"], s2["mu"], s2["sigma"], features1=a)
        assert ours == pytest.approx(ref, rel=1e-6) and low_rank == pytest.approx(ref, rel=1e-6)
        assert M.frechet_distance(s1["mu"], s1["sigma"], s1["mu"], s1["sigma"]) == pytest.approx(0, abs=1e-6)


# ----------------------------------------------------------------------------- embedded metric

def test_digits_classifier_is_accurate_and_cached(classifier, cache):
    images, labels = S.digits_uint8("test")
    acc = D.classifier_accuracy(torch.from_numpy(images).permute(0, 3, 1, 2), torch.from_numpy(labels), classifier)
    assert acc > 0.9
    with mock.patch.object(D, "train_digits_classifier", side_effect=AssertionError("retrained")):
        assert D.digits_classifier_path(cache_dir=cache) == classifier
    other = D.DigitsClassifierSettings(epochs=1)
    assert D.digits_classifier_path(other, cache_dir=cache) != classifier   # settings key the cache


def test_fid_of_a_set_against_itself_is_zero_and_grows_with_perturbation(classifier):
    images, labels = S.digits_uint8("test")
    real = source(images, labels, "test")
    same = M.compute_metrics(real, real, features="digits", weights_path=classifier, metrics=("fid", "prc"),
                             use_cache=False)
    assert same.metrics["fid"] == pytest.approx(0, abs=1e-3)   # float error on a trace of ~1e3
    assert same.metrics["precision"] == 1 and same.metrics["recall"] == 1
    assert same.metrics["accuracy"] > 0.9
    rng = np.random.default_rng(0)
    fids = []
    for noise in (30, 90):
        noisy = np.clip(images + rng.normal(0, noise, images.shape), 0, 255).astype(np.uint8)
        r = M.compute_metrics(source(noisy, labels, f"noisy{noise}"), real, features="digits",
                              weights_path=classifier, metrics=("fid",), use_cache=False)
        fids.append(r.metrics["fid"])
    assert 1.0 < fids[0] < fids[1]


def test_adm_stats_only_reference_uses_stored_mu_sigma(classifier, tmp_path):
    train = S.open_images("digits:train")
    feats = M.extract_features(train, features="digits", weights_path=classifier)["feat"]
    ref = tmp_path / "ref_stats.npz"
    np.savez(ref, **fid_features_to_statistics(feats))      # what torch-fidelity would compute
    test = S.open_images("digits:test")
    stats = M.compute_metrics(test, S.open_images(ref), features="digits", weights_path=classifier,
                              use_cache=False)  # all four asked for
    direct = M.compute_metrics(test, train, features="digits", weights_path=classifier, metrics=("fid",),
                               use_cache=False)
    assert stats.metrics["fid"] == pytest.approx(direct.metrics["fid"], rel=1e-6)
    assert stats.evaluator["fid_reference"] == "stored mu/sigma"
    assert set(stats.skipped) == {"prc", "kid"} and "is" in stats.metrics   # IS needs no reference
    np.savez(ref, mu=np.zeros(2048), sigma=np.eye(2048))
    with pytest.raises(S.MetricsError, match="dim 2048"):
        M.compute_metrics(test, S.open_images(ref), features="digits", weights_path=classifier, use_cache=False)


def test_digits_floor(classifier, cache):
    floor = O.digits_floor(100, cache_dir=cache)
    assert floor["fid"] > 0 and floor["precision"] > 0.5 and 1 < floor["is"] <= 10


# ----------------------------------------------------------------------------- Inception, offline

def test_inception_offline_whole_path_with_adm_reference(standin_inception, tmp_path):
    """eval/fid.py on a sample file against an ADM batch (arr_0 + mu/sigma) with the stand-in
    weights: FID comes from the stored stats, precision/recall from arr_0, the record lands in the
    run folder named by the sample metadata, and the reference features are cached."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (5, 24, 24, 3), dtype=np.uint8)
    feats = M.extract_features(source(images), features="inception", weights_path=standin_inception, device="cpu")
    stats = fid_features_to_statistics(feats["2048"])
    mu, sigma = stats["mu"].astype(np.float64), stats["sigma"]
    shift = np.zeros_like(mu)
    shift[:4] = 0.5                                            # |shift|² = 1: the FID against these stats
    ref = tmp_path / "VIRTUAL_imagenet_test.npz"
    np.savez(ref, arr_0=images, mu=mu + shift, sigma=sigma)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    objective = {"name": "mutor-2d", "reg_weight": 0.5, "d_max": 4, "placement": "sparse", "num_registers": 80}
    meta = {"checkpoint": str(run / "checkpoints" / "step_00000100.pt"), "step": 100,
            "config": {"objective": objective}, "cfg_scale": 2.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
            "seed": 7, "per_class": 1}
    samples = save_samples(tmp_path / "samples.npz", images, np.arange(5), meta)
    fid = load_script("fid")
    rec = fid.main([str(samples), "--ref", str(ref), "--inception-weights", str(standin_inception),
                    "--device", "cpu", "--cache-dir", str(tmp_path / "c"), "--quiet"])
    m = rec["metrics"]
    assert m["fid"] == pytest.approx(1.0, abs=1e-3)
    assert m["precision"] == 1 and m["recall"] == 1 and "kid" in m and m["is"] >= 1
    assert rec["skipped"] == {} and rec["evaluator"]["fid_reference"] == "stored mu/sigma"
    assert rec["evaluator"]["feature_extractor"] == "inception-v3-compat"
    assert rec["evaluator"]["weights_sha256"] and rec["evaluator"]["version"]
    assert (rec["method"], rec["step"], rec["seed"], rec["n"]) == ("mutor-2d", 100, 7, 5)
    assert rec["sampling"]["cfg_scale"] == 2.0 and "config" not in rec["sampling"]
    written = list((run / "eval").glob("*.json"))
    assert len(written) == 1 and json.loads(written[0].read_text())["metrics"] == m
    assert list((tmp_path / "c" / "fidelity_cache").glob("mutor2d-*-features.pt"))


def test_inception_without_weights_offline_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", mock.Mock(side_effect=OSError("no network")))
    images = np.zeros((4, 8, 8, 3), np.uint8)
    with pytest.raises(S.MetricsError, match="--inception-weights"):
        M.compute_metrics(source(images), source(images, name="y"), metrics=("fid",), device="cpu", use_cache=False)


# ----------------------------------------------------------------------------- image sources

def test_npz_images_stream_stored_and_compressed(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (7, 5, 6, 3), dtype=np.uint8)
    for save in (np.savez, np.savez_compressed):
        path = tmp_path / f"{save.__name__}.npz"
        save(path, arr_0=images, arr_1=np.arange(7))
        src = S.open_images(path, lazy_bytes=0)
        assert isinstance(src.dataset, S.NpzImages) and src.n == 7
        for i in (0, 6, 3):                                      # backwards seek too
            assert torch.equal(src.dataset[i], torch.from_numpy(images[i]).permute(2, 0, 1))
        assert src.labels.tolist() == list(range(7))
        assert isinstance(S.open_images(path).dataset, S.ArrayImages)   # small: read into memory


def test_image_folder_source(tmp_path):
    from PIL import Image
    images = np.random.default_rng(0).integers(0, 256, (3, 6, 6, 3), dtype=np.uint8)
    for i, im in enumerate(images):
        Image.fromarray(im).save(tmp_path / f"{i}.png")
    src = S.open_images(tmp_path)
    assert src.n == 3 and torch.equal(src.dataset[1], torch.from_numpy(images[1]).permute(2, 0, 1))


@pytest.mark.parametrize("make, match", [
    (lambda p: np.savez(p, foo=np.zeros(3)), "neither images"),
    (lambda p: np.savez(p, images=np.zeros((2, 4, 4, 3), np.float32)), "uint8"),
    (lambda p: np.savez(p, mu=np.zeros(3), sigma=np.zeros(3)), "sigma"),
    (lambda p: p.write_text("not a zip"), "not a readable npz"),
    (lambda p: None, "no such file"),
])
def test_bad_inputs_give_one_line_errors(tmp_path, make, match):
    path = tmp_path / "x.npz"
    make(path)
    with pytest.raises(S.MetricsError, match=match) as e:
        S.open_images(path)
    assert "\n" not in str(e.value)


def test_fid_script_reports_errors_in_one_line(tmp_path):
    samples = save_samples(tmp_path / "s.npz", np.zeros((4, 8, 8, 3), np.uint8), np.zeros(4, np.int64), {})
    out = subprocess.run([sys.executable, "eval/fid.py", str(samples), "--ref", "digits:valid"], cwd=ROOT,
                         capture_output=True, text=True, timeout=limit(120))
    assert out.returncode == 2 and out.stderr.strip() == "error: 'digits:valid': expected digits:train or digits:test"


# ----------------------------------------------------------------------------- records, leaderboard

def fake_record(method, step, fid, reference, objective):
    return {"method": method, "objective": objective, "step": step,
            "metrics": {"fid": fid, "is": 100.0 + step / 1000, "precision": 0.7, "recall": 0.6},
            "skipped": {}, "evaluator": {"name": "torch-fidelity", "version": "0.4.0",
                                         "feature_extractor": "inception-v3-compat"},
            "reference": reference, "n": 50000, "sampling": {"cfg_scale": 2.0}, "seed": 0, "samples": f"s{step}.npz"}


def test_leaderboard_on_two_fake_records(tmp_path):
    ref = "/data/VIRTUAL_imagenet256_labeled.npz"
    mutor = {"name": "mutor-2d", "reg_weight": 0.5, "d_max": 4, "placement": "sparse", "num_registers": 80}
    R.write_record(fake_record("mutor-2d", 100000, 6.5, ref, mutor), tmp_path / "a" / "eval")
    R.write_record(fake_record("ntp", 100000, 7.9, ref, {"name": "ntp"}), tmp_path / "b" / "eval" / "r.json")
    board = load_script("leaderboard")
    png = tmp_path / "fid.png"
    table = board.main([str(tmp_path / "a"), str(tmp_path / "b"), "--plot", str(png)])
    lines = table.splitlines()
    assert lines[0].split("|")[1:-1] == [f" {h} " for h in ("run", "method", "objective", "step", "FID", "IS",
                                                             "precision", "recall", "commit", "evaluator", "reference",
                                                             "n", "decoding", "skipped")]
    ours = [line for line in lines if "VIRTUAL_imagenet256_labeled.npz" in line]
    assert len(ours) == 2
    assert "| mutor-2d | a=0.5, D=4, sparse K=80 | 100000 | 6.50 | 200.0 | 0.700 | 0.600 |" in ours[0]
    assert "| ntp |  | 100000 | 7.90 |" in ours[1]
    assert any("| next-token | paper | 100000 | 7.71 | 146.5 |" in line for line in lines)   # paper rows: ImageNet
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    digits = [fake_record("ntp", 500, 9.0, "digits:train", {"name": "ntp"})]
    assert "paper" not in R.markdown_table(digits) and "paper" in R.markdown_table(digits, paper=True)
    assert all(line.endswith("| ? |") for line in ours)                    # no log.jsonl at hand


def test_the_leaderboard_marks_an_old_record_scored_against_another_data_set(tmp_path, capsys):
    """Such a pair is refused now (metrics.check_comparable); a record written before was a plain row."""
    def record(data, reference, step):
        return {**fake_record("ntp", step, 9.0, reference, {"name": "ntp"}), "run_config": {"data": {"name": data}}}
    R.write_record(record("digits", "photos:train", 1), tmp_path / "old.json")   # digits against photos: FID 654
    R.write_record(record("digits", "digits:train", 2), tmp_path / "fine.json")
    R.write_record(record("photos", "/refs/own.npz", 3), tmp_path / "file_ref.json")   # a file says no data set
    table = load_script("leaderboard").main([str(tmp_path / f) for f in ("old.json", "fine.json", "file_ref.json")])
    rows = {line.split("|")[4].strip(): line for line in table.splitlines()[2:]}
    assert "photos:train (other data set: samples of digits)" in rows["1"]
    assert "other data set" not in rows["2"] + rows["3"]
    assert capsys.readouterr().err.splitlines()[-1] == (
        "warning: 1 record(s) scored samples against a reference of another data set, their rows marked 'other "
        "data set' (the metrics measure how the data differ, not the model): old.json (digits against photos)")
    assert R.data_set_warning([record("photos", "photos:test", 4)]) is None


def test_the_leaderboard_counts_each_runs_skipped_updates_up_to_the_records_step(tmp_path):
    import json
    for name, skips in (("a", [(3, "nonfinite"), (70, "blowup"), (120, "blowup")]), ("b", [])):
        R.write_record(fake_record("ntp", 100, 9.0, "digits:train", {"name": "ntp"}), tmp_path / name / "eval")
        lines = [{"step": 10, "loss": 1.0}] + [{"event": "skip", "step": s, "reason": r} for s, r in skips]
        (tmp_path / name / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows = R.markdown_table(R.read_records([tmp_path / "a", tmp_path / "b"])[0]).splitlines()[2:]
    assert {row.split(" | ")[0][2:]: row.split(" | ")[-1] for row in rows} == \
        {"a": "2 (1 blowup, 1 nonfinite) |", "b": "0 |"}


@pytest.mark.parametrize("objective, text", [
    ({}, ""),                                                               # no config: plain NTP
    ({"name": "ntp"}, ""),
    ({"name": "mutor-2d", "reg_weight": 0.5, "d_max": 3}, "a=0.5, D=3, dense"),
    ({"name": "mutor-1d", "d_min": 2, "d_max": 4, "edge": "raster", "per_register_offsets": True},
     "a=0.5, d=2..4, dense, raster, per-register offsets"),
    ({"name": "multihead", "layout": "1d", "d_max": 4, "num_heads": 2}, "a=0.5, heads=2, 1d d=2..4"),
    ({"name": "not-loaded", "smoothing": 0.1}, "smoothing=0.1"),           # a plugin's objective, not imported
])
def test_objective_description_comes_from_its_config(objective, text):
    assert R.objective_summary(objective) == text


def test_leaderboard_errors(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(R.RecordError, match="no such run folder"):
        R.read_records([tmp_path / "missing"])
    recs, notes = R.read_records([tmp_path / "run"])
    assert recs == [] and "no eval/*.json" in notes[0]
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(R.RecordError, match="not an evaluation record"):
        R.read_records([tmp_path / "bad.json"])


# ----------------------------------------------------------------------------- online evaluation

def test_online_digits_eval(classifier, cache, monkeypatch):
    """A generator that returns real test digits of the asked classes scores near the floor with
    high accuracy; an untrained model runs through the real sampler and keeps its training mode."""
    from mutor2d import config as C
    from mutor2d.sampling import images as generation
    from mutor2d.data.tokens import build_dataset, build_tokenizer
    from mutor2d.model.gpt import GPT

    cfg = C.load(None, ["data.name=digits", "model.preset=tiny", "model.vocab_size=17", "model.num_classes=10"])
    test = build_dataset(cfg.data, "test")
    tokenizer = build_tokenizer(cfg.data)

    def real_digits(model, labels, grid, rules, mode, objective, generator, stats, progress=None):
        assert grid == (8, 8) and generator is not None
        picks = [torch.nonzero(test.labels == c).flatten() for c in range(10)]
        seen = [0] * 10
        rows = []
        for c in labels.tolist():
            rows.append(picks[c][seen[c]])
            seen[c] += 1
        return test.codes[torch.stack(rows)].reshape(len(labels), -1)

    with monkeypatch.context() as m:
        m.setattr(generation, "run_decoder", real_digits)
        good = O.online_digits_eval(GPT(cfg.model), cfg.data, 10, cfg.sample, tokenizer, 0, cache_dir=cache)
    assert set(good) == {"fid", "is", "precision", "recall", "accuracy"}
    assert good["accuracy"] > 0.9 and good["is"] > 5

    model = GPT(cfg.model).train()
    bad = O.online_digits_eval(model, cfg.data, 2, cfg.sample, tokenizer, 0, cache_dir=cache)
    assert model.training and bad["fid"] > good["fid"] and 0 <= bad["accuracy"] <= 1
    again = O.online_digits_eval(model, cfg.data, 2, cfg.sample, tokenizer, 0, cache_dir=cache)
    assert again == bad                                       # seeded: the same samples, the same numbers
    with pytest.raises(S.MetricsError, match="needs 'digits'"):
        O.online_digits_eval(model, C.load("stargraph_ntp.yaml").data, 2, cfg.sample, tokenizer, 0)


def test_training_logs_online_eval_to_jsonl_and_tensorboard(classifier, cache, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mutor2d import config as C
    from mutor2d.engine.runlog import read_log
    from mutor2d.engine.loop import train

    from mutor2d.evaluation import classifier as trained_here
    monkeypatch.setattr(trained_here, "DEFAULT_CACHE", cache)   # the classifier trained by the fixture
    cfg = C.from_dict({
        "model": {"preset": "tiny", "attention": "sdpa"}, "data": {"name": "digits", "levels": 5},
        "objective": {"name": "mutor-2d", "d_max": 3},
        "train": {"batch_size": 8, "max_steps": 2, "log_every": 1, "ckpt_every": 0, "keep_ckpts": 0,
                  "eval_every": 2, "eval_per_class": 1, "tracker": "tensorboard", "seed": 3},
        "sample": {"classes": [0], "per_class": 1}})
    with mock.patch.object(D, "train_digits_classifier", side_effect=AssertionError("retrained")):
        run = train(cfg, tmp_path / "run")
    evals = [r for r in read_log(run) if "eval_fid" in r]
    assert len(evals) == 1 and evals[0]["step"] == 2
    assert {"eval_fid", "eval_is", "eval_precision", "eval_recall", "eval_accuracy"} <= set(evals[0])
    tags = set()
    for events in (run / "tb").rglob("events.out.tfevents.*"):
        tags |= set(EventAccumulator(str(events)).Reload().Tags()["scalars"])
    assert {"eval/fid", "eval/accuracy"} <= tags


# ----------------------------------------------------------------------------- no file is unpickled

class Payload:
    """Pickles as a call of ``exec`` that writes ``marker``: loading it unpickled runs code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def payload_file(path, marker, wrap=lambda p: p):
    torch.save(wrap(Payload(marker)), path)
    return path


def test_payload_files_are_refused_and_never_run(tmp_path, classifier, standin_inception):
    """A torch.save file holding a pickle payload, given where the evaluation reads weights or
    features: a one-line error naming the file (or a recomputed cache entry), and the payload's code
    never runs. The control at the end shows the payload does run when unpickled."""
    marker = tmp_path / "marker"
    weights = payload_file(tmp_path / "inception.pth", marker, lambda p: {"Conv2d_1a_3x3.conv.weight": p})
    images = np.random.default_rng(0).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    samples = save_samples(tmp_path / "s.npz", images, np.zeros(4, np.int64), {})
    fid = load_script("fid")
    with pytest.raises(S.MetricsError, match="inception.pth") as e:
        fid.main([str(samples), "--ref", str(samples), "--inception-weights", str(weights), "--device", "cpu",
                  "--json", str(tmp_path / "r.json"), "--quiet", "--no-cache"])
    assert "\n" not in str(e.value) and "refused" in str(e.value)
    with pytest.raises(S.MetricsError, match="digits.pt"):
        D.load_digits_classifier(payload_file(tmp_path / "digits.pt", marker, lambda p: {"settings": p}))
    r = subprocess.run([sys.executable, "eval/fid.py", str(samples), "--ref", str(samples), "--device", "cpu",
                        "--inception-weights", str(weights), "--quiet"], cwd=ROOT, capture_output=True, text=True,
                       timeout=limit(300))
    assert r.returncode == 2 and r.stderr.startswith("error: Inception weights file") and str(weights) in r.stderr

    # a poisoned feature-cache entry is recomputed, not loaded
    src = S.ImageSource("x", S.ArrayImages(images), identity="x")
    first = M.compute_metrics(src, src, features="inception", weights_path=standin_inception, metrics=("fid",),
                              device="cpu", cache_root=tmp_path / "cache")
    (entry,) = (tmp_path / "cache").glob("*-features.pt")
    payload_file(entry, marker)
    second = M.compute_metrics(src, src, features="inception", weights_path=standin_inception, metrics=("fid",),
                               device="cpu", cache_root=tmp_path / "cache")
    assert second.metrics == first.metrics and not marker.exists()

    assert torch.serialization.get_unsafe_globals_in_checkpoint(weights)   # control: it is a real payload


def test_fid_of_one_sample_says_too_few_samples(classifier):
    one = source(S.digits_uint8("test")[0][:1], name="one")
    with pytest.raises(S.MetricsError, match=r"too few samples \(1\); FID/KID need at least 2"):
        M.compute_metrics(one, S.open_images("digits:train"), features="digits", weights_path=classifier,
                          use_cache=False)
    only_is = M.compute_metrics(one, one, features="digits", weights_path=classifier, metrics=("is",),
                                use_cache=False)
    assert "is" in only_is.metrics
