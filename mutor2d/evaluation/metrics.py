"""FID, IS, precision/recall and KID of samples against a reference on torch-fidelity's extractors:
Inception ("inception") or a classifier trained here ("digits", "photos"). A reference's stored
``mu``/``sigma`` serve FID (prc/KID then skipped). No file is unpickled: weights and cached features
are read with ``torch.load(weights_only=True)``, never through torch-fidelity's loaders."""
from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch_fidelity
from torch.utils.data import Dataset
from torch_fidelity import feature_extractor_inceptionv3 as tf_inception
from torch_fidelity.metric_fid import fid_features_to_statistics
from torch_fidelity.metric_isc import isc_featuresdict_to_metric
from torch_fidelity.metric_kid import kid_featuresdict_to_metric
from torch_fidelity.metric_prc import prc_featuresdict_to_metric
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY
from torch_fidelity.utils import create_feature_extractor, extract_featuresdict_from_input_id

from ..io import file_sha256, shown_path, write_atomic
from .digits import DigitsClassifierSettings, digits_classifier_path
from .photos import PhotosClassifierSettings, photos_classifier_path
from .options import DIGITS_DATA_SEED, EMBEDDED, FEATURES, INCEPTION, METRICS, MetricsError
from .sources import ArrayImages, ImageSource, load_tensors
MIN_IMAGES = {"fid": 2, "is": 1, "prc": 5, "kid": 2}   # fewer give no covariance / neighbourhood
MIN_SIDE = 8         # smallest image side scored: the digits' 8x8 (the digits classifier's input)


def check_image_sizes(features: str, *sources: ImageSource) -> None:
    """MetricsError unless each source's images are at least MIN_SIDE pixels a side."""
    for source in sources:
        if (size := source.image_size) is not None and min(size) < MIN_SIDE:
            raise MetricsError(f"{source.name}: images of {size[0]}x{size[1]} pixels; --features {features} "
                               f"needs at least {MIN_SIDE}x{MIN_SIDE}")


def check_comparable(samples: ImageSource, reference: ImageSource) -> None:
    """MetricsError unless samples and reference agree in data set and image size (where both say)."""
    mine, theirs = (samples.data_set, samples.image_size), (reference.data_set, reference.image_size)
    if any(None not in (a, b) and a != b for a, b in zip(mine, theirs)):
        raise MetricsError(f"samples {samples.name} are {_images_text(*mine)}, the reference {reference.name} "
                           f"{_images_text(*theirs)}: expected a reference of the samples' data set and image size")


def _images_text(data_set: str | None, size: tuple[int, int] | None) -> str:
    """"8x8-pixel images of data set 'digits'"; the parts a source does not say left out."""
    pixels = f"{size[0]}x{size[1]}-pixel images" if size else "images"
    return pixels + (f" of data set {data_set!r}" if data_set else "")


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray,
                     features1: np.ndarray | None = None) -> float:
    """|mu1 - mu2|² + tr(S1) + tr(S2) - 2·tr((S1·S2)^½), the trace from the symmetric S1^½·S2·S1^½ (D x D)
    or, given the (n, D) features1 with n < D, Xc·S2·Xcᵀ/(n-1) (n x n). Equals torch-fidelity's (tested)."""
    mu1, mu2, s1, s2 = (np.asarray(a, dtype=np.float64) for a in (mu1, mu2, sigma1, sigma2))
    if features1 is not None and 1 < len(features1) < len(mu1):
        xc = np.asarray(features1, dtype=np.float64)
        xc = (xc - xc.mean(0)) / np.sqrt(len(xc) - 1)
        inner = xc @ s2 @ xc.T
    else:
        lam, u = np.linalg.eigh((s1 + s1.T) / 2)
        half = u * np.sqrt(np.clip(lam, 0, None))              # S1^½ = half·uᵀ
        inner = half.T @ s2 @ half
    tr_covmean = np.sqrt(np.clip(np.linalg.eigvalsh((inner + inner.T) / 2), 0, None)).sum()
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(s1) + np.trace(s2) - 2 * tr_covmean)


@dataclass
class Result:
    """metrics: fid, is, is_std, precision, recall, f_score, kid, kid_std, accuracy (those computed);
    skipped: metric -> reason; evaluator: what produced them."""
    metrics: dict
    skipped: dict
    evaluator: dict


# ----------------------------------------------------------------------------- files, never unpickled

def inception_state(weights_path) -> dict:
    """The Inception state dict: ``weights_path``, else torch-fidelity's download (weights_only)."""
    if weights_path is not None:
        state = load_tensors(weights_path, "Inception weights file")
        if not isinstance(state, dict):
            raise MetricsError(f"Inception weights file {str(weights_path)!r}: expected a state dict, "
                               f"got {type(state).__name__}")
        return state
    try:
        return torch.hub.load_state_dict_from_url(tf_inception.URL_INCEPTION_V3, map_location="cpu", progress=False,
                                                  weights_only=True)
    except (OSError, RuntimeError, pickle.UnpicklingError) as e:   # offline, or a foreign file
        first = (str(e).strip().splitlines() or [""])[0]
        raise MetricsError(f"could not load the {INCEPTION} weights ({type(e).__name__}: {first}); "
                           "on an offline machine pass --inception-weights PATH") from None


def build_extractor(features: str, layers, weights_path, cuda: bool, verbose: bool = False):
    """The torch-fidelity feature extractor named by ``features`` producing ``layers``."""
    kwargs = dict(cuda=cuda, verbose=verbose)
    if features in EMBEDDED:
        return create_feature_extractor(FEATURES[features], sorted(layers),
                                        feature_extractor_weights_path=str(weights_path), **kwargs)
    state = inception_state(weights_path)
    try:
        # its extractor fetches weights through its module's load_state_dict_from_url, which would
        # unpickle: for the duration, that name hands over the state already read safely
        with mock.patch.object(tf_inception, "load_state_dict_from_url", lambda *a, **k: state):
            return create_feature_extractor(INCEPTION, sorted(layers), **kwargs)
    except RuntimeError as e:       # a state dict of another network
        first = (str(e).strip().splitlines() or [""])[0]
        raise MetricsError(f"Inception weights {str(weights_path or 'download')!r} do not fit "
                           f"{INCEPTION} ({first})") from None


def features_of(dataset: Dataset, extractor, *, cuda: bool, batch_size: int, verbose: bool = False) -> dict:
    """{layer: float tensor (N, D)} of a dataset of uint8 images (3, H, W)."""
    return extract_featuresdict_from_input_id(
        1, extractor, input1=dataset, cuda=cuda, batch_size=batch_size, verbose=verbose,
        save_cpu_ram=isinstance(dataset, ArrayImages))   # DataLoader workers only for files


def cached_features(key: str | None, cache_root, compute) -> dict:
    """``compute()`` once per ``key``, kept in ``cache_root/KEY-features.pt`` (unreadable: recomputed)."""
    if key is None or cache_root is None:
        return compute()
    path = Path(cache_root) / f"{key}-features.pt"
    with contextlib.suppress(MetricsError):          # none yet, or unreadable: computed
        found = load_tensors(path, "feature cache entry")
        if isinstance(found, dict) and all(isinstance(v, torch.Tensor) for v in found.values()):
            return found
    feats = compute()
    write_atomic(path, lambda f: torch.save(feats, f))
    return feats


# ----------------------------------------------------------------------------- settings

def feature_layers(features: str) -> dict:
    """metric (isc, fid, kid, prc) -> feature layer of the extractor named by ``features``."""
    if features not in FEATURES:
        raise MetricsError(f"features {features!r}: expected one of {sorted(FEATURES)}")
    cls = FEATURE_EXTRACTORS_REGISTRY[FEATURES[features]]
    return {m: cls.get_default_feature_layer_for_metric(m) for m in ("isc", "fid", "kid", "prc")}


def evaluator_info(features: str, weights_path) -> dict:
    """What the record says produced the numbers: torch-fidelity version, extractor, weights file."""
    info = {"name": "torch-fidelity", "version": torch_fidelity.__version__, "feature_extractor": FEATURES[features]}
    if weights_path is None and features == "inception":
        return {**info, "weights": f"torch-fidelity download: {tf_inception.URL_INCEPTION_V3.rsplit('/', 1)[-1]}"}
    p = Path(weights_path)
    if not p.is_file():
        raise MetricsError(f"weights file {shown_path(weights_path)} does not exist")
    return {**info, "weights": str(p), "weights_sha256": file_sha256(p)[:16]}


def use_cuda(device) -> bool:
    """torch-fidelity's ``cuda`` flag from a device name: auto/None (CUDA when present), cpu, cuda."""
    if device is None or device == "auto":
        return torch.cuda.is_available()
    if str(device).startswith("cuda"):
        if not torch.cuda.is_available():
            raise MetricsError(f"device {device!r}: CUDA is not available")
        return True
    if str(device) != "cpu":
        raise MetricsError(f"device {device!r}: expected auto, cpu or cuda")
    return False


def embedded_weights(features: str, data_seed: int = DIGITS_DATA_SEED, cache_dir=None) -> Path:
    """The embedded classifier's file for that data seed (trained and cached on first use)."""
    if features == "digits":
        return digits_classifier_path(DigitsClassifierSettings(data_seed=data_seed), cache_dir)
    if features == "photos":
        return photos_classifier_path(PhotosClassifierSettings(data_seed=data_seed), cache_dir)
    raise MetricsError(f"features {features!r}: expected one of {list(EMBEDDED)} (a classifier trained here)")


def default_weights(features: str, weights_path):
    """The embedded classifier's default cached file when none is given; Inception's as given."""
    return embedded_weights(features) if features in EMBEDDED and weights_path is None else weights_path


def extract_features(source: ImageSource, *, features: str = "inception", weights_path=None, layers=None,
                     device=None, batch_size: int = 64, verbose: bool = False) -> dict:
    """Features of ``source``'s images: {layer: float tensor (N, D)}; ``layers`` defaults to FID's."""
    weights_path = default_weights(features, weights_path)
    layers = layers or [feature_layers(features)["fid"]]
    cuda = use_cuda(device)
    fe = build_extractor(features, layers, weights_path, cuda, verbose)
    return features_of(source.dataset, fe, cuda=cuda, batch_size=batch_size, verbose=verbose)


# ----------------------------------------------------------------------------- metrics

def plan_metrics(samples: ImageSource, reference: ImageSource, metrics) -> tuple[set, dict]:
    """(metrics to compute, {metric: why skipped}); too few samples is an error."""
    if unknown := sorted(set(metrics) - set(METRICS)):
        raise MetricsError(f"metric {unknown[0]!r}: expected some of {list(METRICS)}")
    n1, n2 = samples.n or 0, reference.n or 0
    if n1 == 0:
        raise MetricsError(f"{samples.name}: holds no images to score")
    need = max((MIN_IMAGES[m] for m in metrics if m in ("fid", "kid")), default=1)
    if n1 < need:
        raise MetricsError(f"{samples.name}: too few samples ({n1}); FID/KID need at least {need}")
    skipped = {}
    if "fid" in metrics and reference.mu is None and n2 < 2:
        skipped["fid"] = "reference has no images and no mu/sigma"
    for m in ("prc", "kid"):
        if m in metrics and reference.dataset is None:
            skipped[m] = "reference has only mu/sigma (needs reference images)"
        elif m in metrics and min(n1, n2) < MIN_IMAGES[m]:
            skipped[m] = f"too few images ({n1} samples, {n2} reference; needs {MIN_IMAGES[m]})"
    return set(metrics) - set(skipped), skipped


def fid_of(f1: dict, layer: str, reference: ImageSource, f2: dict | None, evaluator: dict) -> float:
    """FID of sample features against the reference's stored mu/sigma, else its features."""
    s1 = fid_features_to_statistics(f1[layer])
    s2 = ({"mu": reference.mu, "sigma": reference.sigma} if reference.mu is not None
          else fid_features_to_statistics(f2[layer]))
    if s2["mu"].shape != s1["mu"].shape:
        raise MetricsError(f"{reference.name}: stored mu has dim {s2['mu'].shape[0]}, but "
                           f"{evaluator['feature_extractor']} features have dim {s1['mu'].shape[0]}")
    evaluator["fid_reference"] = "stored mu/sigma" if reference.mu is not None else "reference images"
    return frechet_distance(s1["mu"], s1["sigma"], s2["mu"], s2["sigma"], f1[layer].numpy())


def scores(want: set, layer: dict, f1: dict, f2: dict | None, kwargs: dict) -> dict:
    """IS, precision/recall/F and KID from features (torch-fidelity's formulas)."""
    out = {}
    if "is" in want:
        r = isc_featuresdict_to_metric(f1, layer["isc"], **kwargs)
        out["is"], out["is_std"] = r[torch_fidelity.KEY_METRIC_ISC_MEAN], r[torch_fidelity.KEY_METRIC_ISC_STD]
    if "prc" in want:
        r = prc_featuresdict_to_metric(f1, f2, layer["prc"], **kwargs)
        out.update(precision=r[torch_fidelity.KEY_METRIC_PRECISION], recall=r[torch_fidelity.KEY_METRIC_RECALL],
                   f_score=r[torch_fidelity.KEY_METRIC_F_SCORE])
    if "kid" in want:
        r = kid_featuresdict_to_metric(f1, f2, layer["kid"], **kwargs)
        out["kid"], out["kid_std"] = r[torch_fidelity.KEY_METRIC_KID_MEAN], r[torch_fidelity.KEY_METRIC_KID_STD]
    return out


def compute_metrics(samples: ImageSource, reference: ImageSource, *, features: str = "inception",
                    weights_path: str | os.PathLike | None = None, metrics=METRICS,
                    device=None, batch_size: int = 64, cache_root: str | os.PathLike | None = None,
                    use_cache: bool = True, verbose: bool = False, rng_seed: int = 2020) -> Result:
    """Score ``samples`` against ``reference``: metrics a subset of fid, is, prc, kid; reference features
    cached in ``cache_root`` by identity, extractor, weights and layers; embedded features add
    ``accuracy`` when the samples carry labels."""

    layer = feature_layers(features)
    want, skipped = plan_metrics(samples, reference, metrics)
    check_image_sizes(features, samples, reference)
    weights_path = default_weights(features, weights_path)
    evaluator = evaluator_info(features, weights_path)
    labels = features in EMBEDDED and samples.labels is not None
    if labels and len(samples.labels) != samples.n:
        raise MetricsError(f"{samples.name}: {len(samples.labels)} labels for {samples.n} images")
    layers = {layer["isc" if m == "is" else m] for m in want} | ({"logits"} if labels else set())
    if not layers:
        raise MetricsError(f"nothing to compute: {'; '.join(f'{k}: {v}' for k, v in skipped.items())}")

    cuda = use_cuda(device)
    fe = build_extractor(features, layers, weights_path, cuda, verbose)
    f1 = features_of(samples.dataset, fe, cuda=cuda, batch_size=batch_size, verbose=verbose)
    f2 = None
    if want & {"prc", "kid"} or ("fid" in want and reference.mu is None):      # reference features needed
        key = "mutor2d-" + hashlib.sha1(f"{reference.identity}|{evaluator['feature_extractor']}|"
                                        f"{evaluator.get('weights_sha256', '')}|{'+'.join(sorted(layers))}"
                                        .encode()).hexdigest()[:16]
        f2 = cached_features(key if use_cache and reference.identity else None, cache_root,
                             lambda: features_of(reference.dataset, fe, cuda=cuda, batch_size=batch_size,
                                                 verbose=verbose))
    out = {"fid": fid_of(f1, layer["fid"], reference, f2, evaluator)} if "fid" in want else {}
    kwargs = dict(cuda=cuda, verbose=verbose, rng_seed=rng_seed, isc_splits=min(10, samples.n),
                  kid_subset_size=min(1000, samples.n, reference.n or samples.n))
    out.update(scores(want, layer, f1, f2, kwargs))
    if labels:
        out["accuracy"] = (f1["logits"].argmax(1).numpy() == samples.labels).mean()
    return Result({k: float(v) for k, v in out.items()}, skipped, evaluator)
