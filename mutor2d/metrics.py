"""Image-generation metrics on torch-fidelity: FID, IS, precision/recall and KID of samples against a
reference, with either torch-fidelity's Inception port or the embedded digits classifier.

Image sources (all give uint8 images (3, H, W) to torch-fidelity):
  - a sample file (``sample.py --npz``): ``images`` uint8 (N, H, W, 3), ``labels`` (N,), ``meta`` JSON;
  - any npz with ``images`` or ``arr_0`` (ADM batches), read lazily so 50K images need not fit in RAM;
  - a folder of png/jpg files (torch-fidelity's own folder reader);
  - ``digits:train`` / ``digits:test``, the embedded data set.
An ADM-style reference batch may hold ``mu``/``sigma``: FID then uses those stored statistics (so it is
comparable to published numbers); precision/recall and KID need reference images (``arr_0``) and are
skipped when only statistics are present; IS needs the samples only.

The embedded metric: a small CNN trained on the digits TRAIN split (seconds on CPU, cached under
``$MUTOR2D_CACHE`` or ``~/.cache/mutor2d`` by a hash of its settings) is registered as the
torch-fidelity feature extractor ``mutor2d-digits`` (features: penultimate layer ``feat`` for
FID/KID/PRC, ``logits`` for IS), so digits metrics take the same code path as Inception ones; plus
its accuracy on generated images against the classes asked for.
"""
from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_fidelity
from torch import Tensor
from torch.utils.data import Dataset
from torch_fidelity.feature_extractor_base import FeatureExtractorBase
from torch_fidelity.metric_fid import fid_features_to_statistics
from torch_fidelity.metric_isc import isc_featuresdict_to_metric
from torch_fidelity.metric_kid import kid_featuresdict_to_metric
from torch_fidelity.metric_prc import prc_featuresdict_to_metric
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY, register_feature_extractor
from torch_fidelity.utils import create_feature_extractor, extract_featuresdict_from_input_id_cached

from .data import digits_images

INCEPTION = "inception-v3-compat"
DIGITS = "mutor2d-digits"
FEATURES = {"inception": INCEPTION, "digits": DIGITS}
METRICS = ("fid", "is", "prc", "kid")
DEFAULT_CACHE = Path(os.environ.get("MUTOR2D_CACHE", "~/.cache/mutor2d"))  # classifier, feature caches
DIGITS_DATA_SEED = 1234  # DataConfig.data_seed default: the split the digits runs train on
LAZY_BYTES = 1 << 30     # npz image arrays above this size are streamed, not loaded


class MetricsError(ValueError):
    """Bad evaluation input; the message is one line naming the bad value."""


# ----------------------------------------------------------------------------- image sources

class ArrayImages(Dataset):
    """In-memory uint8 images (N, H, W, 3) -> items uint8 (3, H, W)."""

    def __init__(self, images: np.ndarray, name: str = "images"):
        images = np.asarray(images)
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
            raise MetricsError(f"{name}: expected uint8 (N, H, W, 3), got {images.dtype} {images.shape}")
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> Tensor:
        return torch.from_numpy(np.ascontiguousarray(self.images[i])).permute(2, 0, 1)


class NpzImages(Dataset):
    """One uint8 (N, H, W, 3) array of an npz, read image by image from the zip member (stored or
    compressed) so large sample files stream. Each process opens its own handle."""

    def __init__(self, path: str | os.PathLike, key: str):
        self.path, self.key = str(path), key
        with zipfile.ZipFile(self.path) as z, z.open(f"{key}.npy") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            self.offset = f.tell()
        if dtype != np.uint8 or len(shape) != 4 or shape[-1] != 3 or fortran:
            raise MetricsError(f"{self.path}: '{key}' must be uint8 (N, H, W, 3) in C order, "
                               f"got {dtype} {shape}{' (Fortran order)' if fortran else ''}")
        self.shape = tuple(shape)
        self.item_bytes = int(np.prod(shape[1:]))
        self._handle, self._pid = None, None

    def __getstate__(self):
        return {**self.__dict__, "_handle": None, "_pid": None}

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, i: int) -> Tensor:
        if self._handle is None or self._pid != os.getpid():
            self._handle = zipfile.ZipFile(self.path).open(f"{self.key}.npy")
            self._pid = os.getpid()
        self._handle.seek(self.offset + i * self.item_bytes)
        buf = self._handle.read(self.item_bytes)
        img = np.frombuffer(buf, dtype=np.uint8).reshape(self.shape[1:])
        return torch.from_numpy(img.copy()).permute(2, 0, 1)


@dataclass
class ImageSource:
    """Images to score: ``dataset`` of uint8 (3, H, W); ``labels`` (N,) when known; ``meta`` from a
    sample file; ``mu``/``sigma`` stored FID statistics (ADM reference batches); ``identity`` keys the
    feature cache (changes when the file does)."""
    name: str
    dataset: Dataset | None
    labels: np.ndarray | None = None
    meta: dict = field(default_factory=dict)
    mu: np.ndarray | None = None
    sigma: np.ndarray | None = None
    identity: str = ""

    @property
    def n(self) -> int | None:
        return len(self.dataset) if self.dataset is not None else None


def _file_identity(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def digits_uint8(split: str, data_seed: int = DIGITS_DATA_SEED) -> tuple[np.ndarray, np.ndarray]:
    """The digits split as sample images: uint8 (n, 8, 8, 3) and labels (n,)."""
    images, labels = digits_images(split, data_seed)
    u8 = to_uint8(images.unsqueeze(1).expand(-1, 3, -1, -1))
    return u8.permute(0, 2, 3, 1).numpy(), labels.numpy()


def to_uint8(images: Tensor) -> Tensor:
    """float images in [0, 1] (any shape) -> uint8, rounded."""
    return (images.clamp(0, 1) * 255).round().to(torch.uint8)


def open_images(spec: str | os.PathLike, data_seed: int = DIGITS_DATA_SEED,
                lazy_bytes: int = LAZY_BYTES) -> ImageSource:
    """A sample file, an npz (images/arr_0 and/or mu/sigma), a folder of images, or digits:SPLIT.
    npz image arrays larger than ``lazy_bytes`` are streamed from the file (NpzImages), smaller
    ones are read into memory."""
    spec = str(spec)
    if spec.startswith("digits:"):
        split = spec.split(":", 1)[1]
        if split not in ("train", "test"):
            raise MetricsError(f"{spec!r}: expected digits:train or digits:test")
        images, labels = digits_uint8(split, data_seed)
        return ImageSource(spec, ArrayImages(images), labels, identity=f"{spec}|seed{data_seed}")
    path = Path(spec)
    if path.is_dir():
        from torch_fidelity.datasets import ImagesPathDataset
        from torch_fidelity.utils import glob_samples_paths
        files = glob_samples_paths(str(path), False, "png,jpg,jpeg", verbose=False)
        if not files:
            raise MetricsError(f"{spec}: folder holds no png/jpg/jpeg images")
        latest = max(os.stat(f).st_mtime_ns for f in files)
        return ImageSource(spec, ImagesPathDataset(files), identity=f"{path.resolve()}|{len(files)}|{latest}")
    if not path.is_file():
        raise MetricsError(f"{spec}: no such file or folder (expected an npz, an image folder or digits:train/test)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return _open_npz(spec, path, npz, lazy_bytes)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        if isinstance(e, MetricsError):
            raise
        raise MetricsError(f"{spec}: not a readable npz ({type(e).__name__}: {e})") from None


def _open_npz(spec: str, path: Path, npz, lazy_bytes: int) -> ImageSource:
    keys = set(npz.files)
    key = "images" if "images" in keys else "arr_0" if "arr_0" in keys else None
    has_stats = {"mu", "sigma"} <= keys
    if key is None and not has_stats:
        raise MetricsError(f"{spec}: npz has neither images ('images' or 'arr_0') nor 'mu'/'sigma' "
                           f"(keys: {sorted(keys)})")
    images = None
    if key:
        with zipfile.ZipFile(path) as z:
            big = z.getinfo(f"{key}.npy").file_size > lazy_bytes
        images = NpzImages(path, key) if big else ArrayImages(npz[key], f"{spec}: '{key}'")
    src = ImageSource(spec, images, identity=_file_identity(path))
    if has_stats:
        src.mu, src.sigma = npz["mu"].astype(np.float64), npz["sigma"].astype(np.float64)
        if src.mu.ndim != 1 or src.sigma.shape != (len(src.mu), len(src.mu)):
            raise MetricsError(f"{spec}: mu {src.mu.shape} / sigma {src.sigma.shape} are not (D,) / (D, D)")
    label_key = "labels" if "labels" in keys else "arr_1" if "arr_1" in keys else None
    if label_key and key:
        src.labels = npz[label_key].astype(np.int64)
        if src.labels.shape != (src.n,):
            raise MetricsError(f"{spec}: labels of shape {src.labels.shape} for {src.n} images")
    if "meta" in keys:
        try:
            src.meta = json.loads(str(npz["meta"]))
        except json.JSONDecodeError as e:
            raise MetricsError(f"{spec}: 'meta' is not JSON ({e})") from None
        if not isinstance(src.meta, dict):
            raise MetricsError(f"{spec}: 'meta' is JSON but not an object")
    return src


# ----------------------------------------------------------------------------- digits classifier

@dataclass(frozen=True)
class DigitsClassifierSettings:
    """Everything that determines the embedded classifier; its hash names the cache file."""
    width: int = 16
    feat_dim: int = 128
    epochs: int = 30
    lr: float = 2e-3
    batch_size: int = 64
    seed: int = 0
    data_seed: int = DIGITS_DATA_SEED
    version: int = 1  # bump when the architecture or training changes

    def key(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


class DigitsNet(nn.Module):
    """8x8 grey digits -> (features (B, feat_dim), logits (B, 10)). Two 3x3 convs, a 2x2 pool, an MLP."""

    def __init__(self, width: int, feat_dim: int):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc1 = nn.Linear(2 * width * 16, feat_dim)
        self.fc2 = nn.Linear(feat_dim, 10)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, 1, 8, 8) float in [0, 1]."""
        h = F.relu(self.conv1(x))
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        feat = F.relu(self.fc1(h.flatten(1)))
        return feat, self.fc2(feat)


def digits_input(images: Tensor) -> Tensor:
    """uint8 (B, 3, H, W) -> grey float (B, 1, 8, 8) in [0, 1] (area-resized when not 8x8)."""
    x = images.float().mean(1, keepdim=True) / 255.0
    if x.shape[-2:] != (8, 8):
        x = F.interpolate(x, size=(8, 8), mode="area")
    return x


def train_digits_classifier(settings: DigitsClassifierSettings) -> DigitsNet:
    """Train on the digits train split (inputs through the same uint8 path as samples). Deterministic
    for given settings; leaves the global RNG untouched. One CPU thread: these ops are too small to
    gain from more, and lose a lot on a busy machine."""
    images, labels = digits_uint8("train", settings.data_seed)
    x = digits_input(torch.from_numpy(images).permute(0, 3, 1, 2))
    y = torch.from_numpy(labels)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(settings, x, y)
    finally:
        torch.set_num_threads(threads)


def _train(settings: DigitsClassifierSettings, x: Tensor, y: Tensor) -> DigitsNet:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        net = DigitsNet(settings.width, settings.feat_dim)
        opt = torch.optim.Adam(net.parameters(), lr=settings.lr)
        gen = torch.Generator().manual_seed(settings.seed)
        steps = settings.epochs * -(-len(y) // settings.batch_size)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
        net.train()
        for _ in range(settings.epochs):
            for idx in torch.randperm(len(y), generator=gen).split(settings.batch_size):
                loss = F.cross_entropy(net(x[idx])[1], y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
    return net.eval()


def digits_classifier_path(settings: DigitsClassifierSettings | None = None,
                           cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of the cached classifier for ``settings``, training and writing it on first use.
    File: {"settings": dict, "state": state dict}."""
    settings = settings or DigitsClassifierSettings()
    folder = Path(cache_dir or DEFAULT_CACHE).expanduser()
    path = folder / f"digits_classifier_{settings.key()}.pt"
    if not path.is_file():
        net = train_digits_classifier(settings)
        folder.mkdir(parents=True, exist_ok=True)
        from torch_fidelity.utils_torch import torch_atomic_save
        torch_atomic_save({"settings": asdict(settings), "state": net.state_dict()}, str(path))
    return path


def load_digits_classifier(path: str | os.PathLike) -> DigitsNet:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
        settings = obj["settings"]
        net = DigitsNet(settings["width"], settings["feat_dim"])
        net.load_state_dict(obj["state"])
    except (OSError, KeyError, RuntimeError, TypeError) as e:
        raise MetricsError(f"{path}: not a digits classifier file ({type(e).__name__}: {e})") from None
    return net.eval()


class DigitsFeatureExtractor(FeatureExtractorBase):
    """torch-fidelity feature extractor over the digits classifier whose file is
    ``feature_extractor_weights_path``. Features: 'feat' (penultimate), 'logits' (10 classes)."""

    def __init__(self, name, features_list, feature_extractor_weights_path=None, **kwargs):
        super().__init__(name, features_list)
        if feature_extractor_weights_path is None:
            raise MetricsError(f"feature extractor {DIGITS}: needs feature_extractor_weights_path "
                               "(see metrics.digits_classifier_path)")
        self.net = load_digits_classifier(feature_extractor_weights_path)
        self.requires_grad_(False)

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        feat, logits = self.net(digits_input(x))
        out = {"feat": feat, "logits": logits}
        return tuple(out[name].float() for name in self.features_list)

    @staticmethod
    def get_provided_features_list():
        return "feat", "logits"

    @staticmethod
    def get_default_feature_layer_for_metric(metric):
        return {"isc": "logits", "fid": "feat", "kid": "feat", "prc": "feat"}[metric]

    @staticmethod
    def can_be_compiled():
        return False

    @staticmethod
    def get_dummy_input_for_compile():
        return torch.zeros(1, 3, 8, 8, dtype=torch.uint8)


if DIGITS not in FEATURE_EXTRACTORS_REGISTRY:
    register_feature_extractor(DIGITS, DigitsFeatureExtractor)


# ----------------------------------------------------------------------------- metrics

def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray,
                     features1: np.ndarray | None = None) -> float:
    """torch-fidelity's FID formula |mu1 - mu2|² + tr(S1) + tr(S2) - 2·tr((S1·S2)^½), with the trace
    term from symmetric eigenproblems of the same nonzero eigenvalues as S1·S2:
    S1^½·S2·S1^½ (D x D), or, given the (n, D) features behind mu1/sigma1 with n < D,
    Xc·S2·Xcᵀ/(n-1) (n x n; Xc = centred features, S1 = Xcᵀ·Xc/(n-1)). Equals
    ``torch_fidelity.metric_fid.fid_statistics_to_metric`` (negative eigenvalues count as 0 in both;
    tested) while avoiding its general D x D ``eigvals``, ~20x slower at D = 2048."""
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
        from torch_fidelity.feature_extractor_inceptionv3 import URL_INCEPTION_V3
        return {**info, "weights": f"torch-fidelity download: {URL_INCEPTION_V3.rsplit('/', 1)[-1]}"}
    p = Path(weights_path)
    if not p.is_file():
        raise MetricsError(f"weights file {str(weights_path)!r} does not exist")
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {**info, "weights": str(p), "weights_sha256": h.hexdigest()[:16]}


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


def _extractor(features: str, layers, kwargs: dict):
    try:
        return create_feature_extractor(FEATURES[features], sorted(layers), **kwargs)
    except (OSError, RuntimeError) as e:  # no network for the default download, or a foreign file
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        hint = "; on an offline machine pass --inception-weights PATH" if features == "inception" else ""
        raise MetricsError(f"could not load the {FEATURES[features]} weights "
                           f"({type(e).__name__}: {msg}){hint}") from None


def _tf_kwargs(samples: Dataset, weights_path, cuda: bool, batch_size: int, verbose: bool, **extra) -> dict:
    return dict(input1=samples, cuda=cuda, batch_size=batch_size, verbose=verbose,
                feature_extractor_weights_path=None if weights_path is None else str(weights_path),
                save_cpu_ram=isinstance(samples, ArrayImages), **extra)  # DataLoader workers only for files


def extract_features(source: ImageSource, *, features: str = "inception", weights_path=None, layers=None,
                     device=None, batch_size: int = 64, verbose: bool = False) -> dict:
    """Features of ``source``'s images through torch-fidelity: {layer: float tensor (N, D)}.
    ``layers`` defaults to the FID layer."""
    if features == "digits" and weights_path is None:
        weights_path = digits_classifier_path()
    layers = layers or [feature_layers(features)["fid"]]
    kwargs = _tf_kwargs(source.dataset, weights_path, use_cuda(device), batch_size, verbose, cache=False)
    return extract_featuresdict_from_input_id_cached(1, _extractor(features, layers, kwargs), **kwargs)


def compute_metrics(samples: ImageSource, reference: ImageSource, *, features: str = "inception",
                    weights_path: str | os.PathLike | None = None, metrics=METRICS,
                    device=None, batch_size: int = 64, cache_root: str | os.PathLike | None = None,
                    use_cache: bool = True, verbose: bool = False, rng_seed: int = 2020) -> Result:
    """Score ``samples`` (generated: torch-fidelity's input1) against ``reference`` (real: input2).

    features: "inception" (torch-fidelity's Inception port; ``weights_path`` = its .pth file, for
    offline machines) or "digits" (the embedded classifier; ``weights_path`` defaults to the cached
    default one). metrics: a subset of fid, is, prc (precision/recall), kid. Reference features are
    cached by torch-fidelity (``cache_root``) under a name made of the reference file's identity, the
    extractor and its weights. FID uses the reference's stored mu/sigma when it has them; metrics that
    cannot be computed are listed in ``skipped`` with the reason. The digits features add
    ``accuracy`` (classifier vs the samples' labels) when the samples carry labels.
    """
    layer = feature_layers(features)
    unknown = sorted(set(metrics) - set(METRICS))
    if unknown:
        raise MetricsError(f"metric {unknown[0]!r}: expected some of {list(METRICS)}")
    if samples.dataset is None or len(samples.dataset) == 0:
        raise MetricsError(f"{samples.name}: holds no images to score")
    if features == "digits" and weights_path is None:
        weights_path = digits_classifier_path()
    evaluator = evaluator_info(features, weights_path)

    n1, n2 = samples.n, reference.n or 0
    skipped, want = {}, set(metrics)
    if "fid" in want and reference.mu is None and n2 < 2:
        skipped["fid"] = "reference has no images and no mu/sigma"
    for m in ("prc", "kid"):
        if m in want and reference.dataset is None:
            skipped[m] = "reference has only mu/sigma (needs reference images)"
        elif m in want and min(n1, n2) < (5 if m == "prc" else 2):
            skipped[m] = f"too few images ({n1} samples, {n2} reference)"
    want -= set(skipped)
    need_ref = bool(want & {"prc", "kid"}) or ("fid" in want and reference.mu is None)
    labels = features == "digits" and samples.labels is not None
    if labels and len(samples.labels) != n1:
        raise MetricsError(f"{samples.name}: {len(samples.labels)} labels for {n1} images")
    layers = ({layer[m] for m in ("fid", "kid", "prc") if m in want} | ({layer["isc"]} if "is" in want else set())
              | ({"logits"} if labels else set()))
    if not layers:
        raise MetricsError(f"nothing to compute: {'; '.join(f'{k}: {v}' for k, v in skipped.items())}")

    ref_key = None
    if use_cache and need_ref:
        ref_key = "mutor2d-" + hashlib.sha1(f"{reference.identity}|{evaluator['feature_extractor']}|"
                                            f"{evaluator.get('weights_sha256', '')}|{'+'.join(sorted(layers))}"
                                            .encode()).hexdigest()[:16]
    kwargs = _tf_kwargs(samples.dataset, weights_path, use_cuda(device), batch_size, verbose,
                        input2=reference.dataset if need_ref else None, input2_cache_name=ref_key, cache=use_cache,
                        cache_root=None if cache_root is None else str(cache_root), rng_seed=rng_seed,
                        isc_splits=min(10, n1), kid_subset_size=min(1000, n1, n2))
    fe = _extractor(features, layers, kwargs)
    f1 = extract_featuresdict_from_input_id_cached(1, fe, **kwargs)
    f2 = extract_featuresdict_from_input_id_cached(2, fe, **kwargs) if need_ref else None

    out = {}
    if "fid" in want:
        s1 = fid_features_to_statistics(f1[layer["fid"]])
        s2 = ({"mu": reference.mu, "sigma": reference.sigma} if reference.mu is not None
              else fid_features_to_statistics(f2[layer["fid"]]))
        if s2["mu"].shape != s1["mu"].shape:
            raise MetricsError(f"{reference.name}: stored mu has dim {s2['mu'].shape[0]}, but "
                               f"{evaluator['feature_extractor']} features have dim {s1['mu'].shape[0]}")
        out["fid"] = frechet_distance(s1["mu"], s1["sigma"], s2["mu"], s2["sigma"], f1[layer["fid"]].numpy())
        evaluator["fid_reference"] = "stored mu/sigma" if reference.mu is not None else "reference images"
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
    if labels:
        out["accuracy"] = (f1["logits"].argmax(1).numpy() == samples.labels).mean()
    return Result({k: float(v) for k, v in out.items()}, skipped, evaluator)


def classifier_accuracy(images: Tensor, labels: Tensor, weights_path=None) -> float:
    """Digits classifier accuracy of uint8 images (B, 3, H, W) against ``labels`` (B,)."""
    net = load_digits_classifier(weights_path or digits_classifier_path())
    with torch.no_grad():
        pred = net(digits_input(images.cpu()))[1].argmax(1)
    return float((pred == labels.cpu()).float().mean())


# ----------------------------------------------------------------------------- online evaluation

def online_digits_eval(model, data_cfg, num_per_class: int, generator: torch.Generator | None = None, *,
                       tokenizer=None, cfg_scale: float = 1.0, temperature: float = 1.0, top_k: int = 0,
                       top_p: float = 1.0, cache_dir: str | os.PathLike | None = None) -> dict:
    """Sample ``num_per_class`` images of each digit class with ``sampling.generate`` and score them
    with the embedded metric against the digits train split (the classifier's training data; real
    held-out images against it give the floor, see ``digits_floor``).

    tokenizer: the data's tokenizer (built from ``data_cfg`` when None; pass it to avoid reloading a
    VQ each time); its ``grid`` (VQ) or 8x8 (pixel tokenizer) is the sampled grid.
    Returns {fid, is, precision, recall, accuracy} (floats); ``model`` keeps its train/eval mode."""
    from .data import build_tokenizer
    from .sampling import generate

    if data_cfg.name != "digits":
        raise MetricsError(f"online evaluation: data.name={data_cfg.name!r}, the embedded metric needs 'digits'")
    if num_per_class < 1:
        raise MetricsError(f"online evaluation: num_per_class must be >= 1, got {num_per_class}")
    tokenizer = tokenizer or build_tokenizer(data_cfg)
    grid = tuple(getattr(tokenizer, "grid", (8, 8)))
    device = next(model.parameters()).device
    labels = torch.arange(10, device=device).repeat_interleave(num_per_class)
    codes = generate(model, labels, grid, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k, top_p=top_p,
                     generator=generator)
    with torch.no_grad():
        images = tokenizer.decode(codes.view(-1, *grid).to(getattr(tokenizer, "device", "cpu"))).cpu()
    samples = ImageSource("online", ArrayImages(to_uint8(images).permute(0, 2, 3, 1).numpy()), labels.cpu().numpy())
    weights = digits_classifier_path(DigitsClassifierSettings(data_seed=data_cfg.data_seed), cache_dir)
    res = compute_metrics(samples, open_images("digits:train", data_cfg.data_seed), features="digits",
                          weights_path=weights, metrics=("fid", "is", "prc"), device=device.type, use_cache=False)
    return {k: res.metrics[k] for k in ("fid", "is", "precision", "recall", "accuracy") if k in res.metrics}


def digits_floor(n: int | None = None, data_seed: int = DIGITS_DATA_SEED, cache_dir=None) -> dict:
    """The embedded metric of real held-out digits (test split, or its first ``n`` images after a
    fixed shuffle) against the train split: the best a generator can expect at that sample count."""
    test = open_images("digits:test", data_seed)
    if n is not None:
        if not 5 <= n <= len(test.dataset):
            raise MetricsError(f"n={n}: expected 5..{len(test.dataset)} (the size of the digits test split)")
        idx = np.random.default_rng(0).permutation(len(test.dataset))[:n]
        test = ImageSource(test.name, ArrayImages(test.dataset.images[idx]), test.labels[idx])
    weights = digits_classifier_path(DigitsClassifierSettings(data_seed=data_seed), cache_dir)
    res = compute_metrics(test, open_images("digits:train", data_seed), features="digits", weights_path=weights,
                          metrics=("fid", "is", "prc"), use_cache=False)
    return res.metrics
