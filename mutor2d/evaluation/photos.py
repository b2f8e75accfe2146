"""The photo crops' metric (mutor2d.data.photos): a small CNN trained to tell which photograph a
crop comes from, on crops of the TRAIN split (two minutes on one CPU core, cached under
``$MUTOR2D_CACHE`` or ``~/.cache/mutor2d`` by a hash of its settings; mutor2d.evaluation.classifier),
registered as the torch-fidelity feature extractor ``mutor2d-photos`` (``feat``: the pooled penultimate layer, for
FID/KID/precision/recall; ``logits`` for IS and the class accuracy of samples), as the digits
classifier is for digits. References: ``photos:train`` and ``photos:test`` (``sources.photos_uint8``).
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

from ..data.photos import CLASSES
from . import classifier
from .options import PHOTOS
from .sources import PHOTOS_SIDE, photos_uint8

SIZE = PHOTOS_SIDE        # the classifier's input side (crops of other sizes are area-resized)


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


def train_photos_classifier(settings: PhotosClassifierSettings) -> PhotosNet:
    """Train on the first ``train_images`` crops of the train split, mirrored at random (classifier.fit)."""
    images, labels = photos_uint8("train", settings.train_images, settings.data_seed)
    x = photos_input(torch.from_numpy(images).permute(0, 3, 1, 2))
    return classifier.fit(PhotosNet, x, torch.from_numpy(labels), settings, flip=True)


def photos_classifier_path(settings: PhotosClassifierSettings | None = None,
                           cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of the cached classifier for ``settings``, trained and written on first use."""
    return classifier.cached("photos", settings or PhotosClassifierSettings(), train_photos_classifier,
                             cache_dir)


def load_photos_classifier(path: str | os.PathLike) -> PhotosNet:
    """The classifier of a file written by ``photos_classifier_path`` (read with weights_only=True)."""
    return classifier.load(path, "photos", PhotosNet)


class PhotosFeatureExtractor(classifier.ClassifierFeatures):
    """torch-fidelity feature extractor over the photos classifier (``feature_extractor_weights_path``)."""
    load, prepare, side = load_photos_classifier, photos_input, SIZE


classifier.register(PHOTOS, PhotosFeatureExtractor)

