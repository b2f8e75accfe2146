"""The photo crops' metric (mutor2d.data.photos): a small CNN trained to tell which photograph a
crop comes from, on crops of the TRAIN split (two minutes on one CPU core, cached under
``$MUTOR2D_CACHE`` or ``~/.cache/mutor2d`` by a hash of its settings; mutor2d.evaluation.classifier),
registered as the torch-fidelity feature extractor ``mutor2d-photos`` (``feat``: the pooled penultimate layer, for
FID/KID/precision/recall; ``logits`` for IS and the class accuracy of samples), as the digits
classifier is for digits. References: ``photos:train`` and ``photos:test`` (:func:`photos_uint8`).
Classifier files load with ``weights_only=True``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..data.photos import CLASSES, photo_crops
from . import classifier
from .options import PHOTOS, MetricsError

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
    version: int = 2          # bump when the architecture or training changes

    def key(self) -> str:
        return classifier.settings_key(self)


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
    """Train on the first ``train_images`` crops of the train split, mirrored at random (classifier.fit)."""
    images, labels = photos_uint8("train", settings.train_images, settings.data_seed)
    x = photos_input(torch.from_numpy(images).permute(0, 3, 1, 2))
    return classifier.fit(lambda: PhotosNet(settings.width, settings.feat_dim), x, torch.from_numpy(labels),
                          settings, flip=True)


def photos_classifier_path(settings: PhotosClassifierSettings | None = None,
                           cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of the cached classifier for ``settings``, trained and written on first use."""
    settings = settings or PhotosClassifierSettings()
    return classifier.cached("photos", settings, lambda: train_photos_classifier(settings), cache_dir)


def load_photos_classifier(path: str | os.PathLike) -> PhotosNet:
    """The classifier of a file written by ``photos_classifier_path`` (read with weights_only=True)."""
    return classifier.load(path, "photos", lambda s: PhotosNet(s["width"], s["feat_dim"]))


class PhotosFeatureExtractor(classifier.ClassifierFeatures):
    """torch-fidelity feature extractor over the photos classifier (``feature_extractor_weights_path``)."""
    load, prepare, side = load_photos_classifier, photos_input, SIZE


classifier.register(PHOTOS, PhotosFeatureExtractor)


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
