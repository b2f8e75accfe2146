"""The embedded digits metric: a small CNN trained on the digits TRAIN split (seconds on CPU, cached
under ``$MUTOR2D_CACHE`` or ``~/.cache/mutor2d`` by a hash of its settings), registered as the
torch-fidelity feature extractor ``mutor2d-digits`` (features: penultimate layer ``feat`` for
FID/KID/PRC, ``logits`` for IS), so digits metrics take the same code path as Inception ones; plus
its accuracy on generated images against the classes asked for. Classifier files load with
``weights_only=True``.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch_fidelity.feature_extractor_base import FeatureExtractorBase
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY, register_feature_extractor

from ..data.tokens import digits_num_classes
from ..io import write_atomic
from .options import DEFAULT_CACHE, DIGITS, DIGITS_DATA_SEED, MetricsError
from .sources import digits_uint8, load_tensors


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
        write_atomic(path, lambda f: torch.save({"settings": asdict(settings), "state": net.state_dict()}, f))
    return path


def load_digits_classifier(path: str | os.PathLike) -> DigitsNet:
    """The classifier of a file written by ``digits_classifier_path`` (read with weights_only=True)."""
    obj = load_tensors(path, "digits classifier file")
    try:
        settings = obj["settings"]
        net = DigitsNet(settings["width"], settings["feat_dim"])
        net.load_state_dict(obj["state"])
    except (KeyError, RuntimeError, TypeError) as e:
        raise MetricsError(f"{path}: not a digits classifier file ({type(e).__name__}: {e})") from None
    return net.eval()


class DigitsFeatureExtractor(FeatureExtractorBase):
    """torch-fidelity feature extractor over the digits classifier whose file is
    ``feature_extractor_weights_path``. Features: 'feat' (penultimate), 'logits' (one per class)."""

    def __init__(self, name, features_list, feature_extractor_weights_path=None, **kwargs):
        super().__init__(name, features_list)
        if feature_extractor_weights_path is None:
            raise MetricsError(f"feature extractor {DIGITS}: needs feature_extractor_weights_path "
                               "(see digits_classifier_path)")
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


def classifier_accuracy(images: Tensor, labels: Tensor, weights_path=None) -> float:
    """Digits classifier accuracy of uint8 images (B, 3, H, W) against ``labels`` (B,)."""
    net = load_digits_classifier(weights_path or digits_classifier_path())
    with torch.no_grad():
        pred = net(digits_input(images.cpu()))[1].argmax(1)
    return float((pred == labels.cpu()).float().mean())
