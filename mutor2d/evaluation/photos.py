"""The photo crops' metric (mutor2d.data.photos): a small CNN trained to tell which photograph a
crop comes from, on crops of the TRAIN split (a minute on one CPU core, cached under
``$MUTOR2D_CACHE`` or ``~/.cache/mutor2d`` by a hash of its settings), registered as the
torch-fidelity feature extractor ``mutor2d-photos`` (``feat``: the pooled penultimate layer, for
FID/KID/precision/recall; ``logits`` for IS and the class accuracy of samples), as the digits
classifier is for digits. References: ``photos:train`` and ``photos:test`` (:func:`photos_uint8`).
Classifier files load with ``weights_only=True``.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch_fidelity.feature_extractor_base import FeatureExtractorBase
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY, register_feature_extractor

from ..data.photos import CLASSES, photo_crops
from ..io import write_atomic
from .options import DEFAULT_CACHE, PHOTOS, MetricsError
from .sources import load_tensors

SIZE = 32                 # the classifier's input side (crops of other sizes are area-resized)
REFERENCE_COUNT = {"train": 10000, "test": 5000}    # images of photos:train / photos:test


@dataclass(frozen=True)
class PhotosClassifierSettings:
    """Everything that determines the classifier; its hash names the cache file."""
    width: int = 32
    feat_dim: int = 128
    train_images: int = 20000
    epochs: int = 4
    lr: float = 2e-3
    batch_size: int = 128
    seed: int = 0
    data_seed: int = 1234
    version: int = 1          # bump when the architecture or training changes

    def key(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


class PhotosNet(nn.Module):
    """RGB 32x32 -> (features (B, feat_dim), logits (B, 10)): three conv stages (32, 16, 8 px), global
    average pooling, a linear layer to the features, one to the classes."""

    def __init__(self, width: int, feat_dim: int):
        super().__init__()
        w = width
        self.stages = nn.ModuleList(nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())
                                    for cin, cout in ((3, w), (w, 2 * w), (2 * w, 4 * w)))
        self.feat = nn.Linear(4 * w, feat_dim)
        self.head = nn.Linear(feat_dim, len(CLASSES))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, 3, 32, 32) float in [0, 1]."""
        h = x - 0.5
        for k, stage in enumerate(self.stages):
            h = stage(h if k == 0 else F.max_pool2d(h, 2))
        feat = F.relu(self.feat(h.mean((2, 3))))
        return feat, self.head(feat)


def photos_input(images: Tensor) -> Tensor:
    """uint8 (B, 3, H, W) -> float (B, 3, 32, 32) in [0, 1] (area-resized when not 32x32)."""
    x = images.float() / 255.0
    return F.interpolate(x, size=(SIZE, SIZE), mode="area") if x.shape[-2:] != (SIZE, SIZE) else x


def photos_uint8(split: str, count: int | None = None, data_seed: int = 1234) -> tuple[np.ndarray, np.ndarray]:
    """The first ``count`` (default REFERENCE_COUNT[split]) crops of ``split`` at 32 px: uint8
    (n, 32, 32, 3) and labels (n,)."""
    if split not in REFERENCE_COUNT:
        raise MetricsError(f"photos:{split}: expected photos:train or photos:test")
    return photo_crops(split, count or REFERENCE_COUNT[split], SIZE, data_seed)


def train_photos_classifier(settings: PhotosClassifierSettings) -> PhotosNet:
    """Train on the first ``train_images`` crops of the train split with random flips. Deterministic
    for given settings; leaves the global RNG untouched; one CPU thread."""
    images, labels = photos_uint8("train", settings.train_images, settings.data_seed)
    x, y = photos_input(torch.from_numpy(images).permute(0, 3, 1, 2)), torch.from_numpy(labels)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed)
            net = PhotosNet(settings.width, settings.feat_dim)
            opt = torch.optim.Adam(net.parameters(), lr=settings.lr)
            gen = torch.Generator().manual_seed(settings.seed)
            steps = settings.epochs * -(-len(y) // settings.batch_size)
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, settings.lr, total_steps=steps)
            net.train()
            for _ in range(settings.epochs):
                for idx in torch.randperm(len(y), generator=gen).split(settings.batch_size):
                    flip = torch.rand(len(idx), generator=gen) < 0.5
                    xb = torch.where(flip[:, None, None, None], x[idx].flip(-1), x[idx])
                    loss = F.cross_entropy(net(xb)[1], y[idx])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    sched.step()
        return net.eval()
    finally:
        torch.set_num_threads(threads)


def photos_classifier_path(settings: PhotosClassifierSettings | None = None,
                           cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of the cached classifier for ``settings``, trained and written on first use.
    File: {"settings": dict, "state": state dict}."""
    settings = settings or PhotosClassifierSettings()
    path = Path(cache_dir or DEFAULT_CACHE).expanduser() / f"photos_classifier_{settings.key()}.pt"
    if not path.is_file():
        net = train_photos_classifier(settings)
        write_atomic(path, lambda f: torch.save({"settings": asdict(settings), "state": net.state_dict()}, f))
    return path


def load_photos_classifier(path: str | os.PathLike) -> PhotosNet:
    """The classifier of a file written by ``photos_classifier_path`` (read with weights_only=True)."""
    obj = load_tensors(path, "photos classifier file")
    try:
        settings = obj["settings"]
        net = PhotosNet(settings["width"], settings["feat_dim"])
        net.load_state_dict(obj["state"])
    except (KeyError, RuntimeError, TypeError) as e:
        raise MetricsError(f"{path}: not a photos classifier file ({type(e).__name__}: {e})") from None
    return net.eval()


class PhotosFeatureExtractor(FeatureExtractorBase):
    """torch-fidelity feature extractor over the photos classifier in ``feature_extractor_weights_path``."""

    def __init__(self, name, features_list, feature_extractor_weights_path=None, **kwargs):
        super().__init__(name, features_list)
        if feature_extractor_weights_path is None:
            raise MetricsError(f"feature extractor {PHOTOS}: needs feature_extractor_weights_path "
                               "(see photos_classifier_path)")
        self.net = load_photos_classifier(feature_extractor_weights_path)
        self.requires_grad_(False)

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        feat, logits = self.net(photos_input(x))
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
        return torch.zeros(1, 3, SIZE, SIZE, dtype=torch.uint8)


if PHOTOS not in FEATURE_EXTRACTORS_REGISTRY:
    register_feature_extractor(PHOTOS, PhotosFeatureExtractor)


def sanity_check(n: int = 2000, settings: PhotosClassifierSettings | None = None, cache_dir=None) -> dict:
    """The evaluator against known answers, on ``n`` real test crops scored against photos:train:
    ``fid_real`` (real vs real: near 0), ``fid_blurred`` (the same crops at a quarter of the
    resolution, upsampled: far larger), ``accuracy_real`` (the classes: near 1) and
    ``accuracy_shuffled`` (the same images with their labels permuted: near 1/10)."""
    from .metrics import compute_metrics
    from .sources import ArrayImages, ImageSource, open_images
    settings = settings or PhotosClassifierSettings()
    weights = photos_classifier_path(settings, cache_dir)
    images, labels = photos_uint8("test", n, settings.data_seed)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float()
    blurred = F.interpolate(F.avg_pool2d(x, 4), scale_factor=4, mode="bilinear").round().clamp(0, 255)
    blurred = blurred.to(torch.uint8).permute(0, 2, 3, 1).numpy()
    shuffled = np.random.default_rng(0).permutation(labels)
    reference = open_images("photos:train", settings.data_seed)

    def score(arr, lab):
        res = compute_metrics(ImageSource("check", ArrayImages(arr), lab), reference, features="photos",
                              weights_path=weights, metrics=("fid",), use_cache=False)
        return res.metrics
    real, blur, shuf = score(images, labels), score(blurred, labels), score(images, shuffled)
    return {"fid_real": real["fid"], "fid_blurred": blur["fid"], "accuracy_real": real["accuracy"],
            "accuracy_shuffled": shuf["accuracy"], "n": n}
