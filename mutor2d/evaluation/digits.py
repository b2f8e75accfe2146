"""The embedded digits metric: a small CNN trained on the digits TRAIN split (seconds on CPU, cached
under ``$MUTOR2D_CACHE`` or ``~/.cache/mutor2d`` by a hash of its settings), registered as the
torch-fidelity feature extractor ``mutor2d-digits`` (features: penultimate layer ``feat`` for
FID/KID/PRC, ``logits`` for IS), so digits metrics take the same code path as Inception ones; plus
its accuracy on generated images against the classes asked for. Classifier files load with
``weights_only=True``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..data.tokens import digits_num_classes
from . import classifier
from .options import DIGITS, DIGITS_DATA_SEED
from .sources import digits_uint8


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
        return classifier.settings_key(self)


class DigitsNet(nn.Module):
    """8x8 grey digits -> (features (B, feat_dim), logits (B, number of digit classes)). Two 3x3 convs, a 2x2
    pool, an MLP."""

    def __init__(self, width: int, feat_dim: int):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc1 = nn.Linear(2 * width * 16, feat_dim)
        self.fc2 = nn.Linear(feat_dim, digits_num_classes())

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, 1, 8, 8) float in [0, 1]."""
        h = F.relu(self.conv1(x))
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        feat = F.relu(self.fc1(h.flatten(1)))
        return feat, self.fc2(feat)


def digits_input(images: Tensor) -> Tensor:
    """uint8 (B, 3, H, W) -> grey float (B, 1, 8, 8) in [0, 1] (area-resized when not 8x8)."""
    x = images.float().mean(1, keepdim=True) / 255.0
    return F.interpolate(x, size=(8, 8), mode="area") if x.shape[-2:] != (8, 8) else x


def train_digits_classifier(settings: DigitsClassifierSettings) -> DigitsNet:
    """Train on the digits train split (inputs through the same uint8 path as samples); deterministic
    for given settings (classifier.fit)."""
    images, labels = digits_uint8("train", settings.data_seed)
    x = digits_input(torch.from_numpy(images).permute(0, 3, 1, 2))
    return classifier.fit(DigitsNet, x, torch.from_numpy(labels), settings)


def digits_classifier_path(settings: DigitsClassifierSettings | None = None,
                           cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of the cached classifier for ``settings``, training and writing it on first use."""
    return classifier.cached("digits", settings or DigitsClassifierSettings(), train_digits_classifier,
                             cache_dir)


def load_digits_classifier(path: str | os.PathLike) -> DigitsNet:
    """The classifier of a file written by ``digits_classifier_path`` (read with weights_only=True)."""
    return classifier.load(path, "digits", DigitsNet)


class DigitsFeatureExtractor(classifier.ClassifierFeatures):
    """torch-fidelity feature extractor over the digits classifier (``feature_extractor_weights_path``)."""
    load, prepare, side = load_digits_classifier, digits_input, 8


classifier.register(DIGITS, DigitsFeatureExtractor)


def classifier_accuracy(images: Tensor, labels: Tensor, weights_path=None) -> float:
    """Digits classifier accuracy of uint8 images (B, 3, H, W) against ``labels`` (B,)."""
    net = load_digits_classifier(weights_path or digits_classifier_path())
    with torch.no_grad():
        pred = net(digits_input(images.cpu()))[1].argmax(1)
    return float((pred == labels.cpu()).float().mean())
