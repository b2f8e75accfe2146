"""What the classifiers trained here (digits, photos) share: one-thread training with the global RNG
untouched, a cache file named by the settings' hash, and the torch-fidelity extractor (``feat``, ``logits``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_fidelity.feature_extractor_base import FeatureExtractorBase
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY, register_feature_extractor

from ..io import write_atomic
from .options import DEFAULT_CACHE, MetricsError
from .sources import load_tensors


def settings_key(settings) -> str:
    """12 hex digits of the sha1 of a settings dataclass (JSON, sorted keys): the cache file's name."""
    return hashlib.sha1(json.dumps(asdict(settings), sort_keys=True).encode()).hexdigest()[:12]


def fit(net_class: type, x: Tensor, y: Tensor, settings, flip: bool = False) -> nn.Module:
    """``net_class(settings.width, settings.feat_dim)`` trained with Adam (``settings.lr``, cosine to 0) for
    ``settings.epochs`` epochs of batches of ``settings.batch_size`` (seeded by ``settings.seed``; ``flip``:
    each image mirrored with probability 1/2). Deterministic; the global RNG untouched; one CPU thread
    (these ops are too small to gain from more, and lose a lot on a busy machine)."""
    with contextlib.ExitStack() as stack:
        stack.callback(torch.set_num_threads, torch.get_num_threads())     # restored on the way out
        torch.set_num_threads(1)
        stack.enter_context(torch.random.fork_rng(devices=[]))
        torch.manual_seed(settings.seed)
        net = net_class(settings.width, settings.feat_dim)
        opt = torch.optim.Adam(net.parameters(), lr=settings.lr)
        gen = torch.Generator().manual_seed(settings.seed)
        steps = settings.epochs * -(-len(y) // settings.batch_size)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
        net.train()
        for _ in range(settings.epochs):
            for idx in torch.randperm(len(y), generator=gen).split(settings.batch_size):
                xb = x[idx]
                if flip:
                    mirror = torch.rand(len(idx), generator=gen) < 0.5
                    xb = torch.where(mirror[:, None, None, None], xb.flip(-1), xb)
                loss = F.cross_entropy(net(xb)[1], y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
        return net.eval()


def cached(name: str, settings, train: Callable, cache_dir: str | os.PathLike | None = None) -> Path:
    """CACHE/NAME_classifier_KEY.pt for ``settings``, trained with ``train(settings)`` and written on first
    use. File: {"settings": dict, "state": state dict}."""
    path = Path(cache_dir or DEFAULT_CACHE).expanduser() / f"{name}_classifier_{settings_key(settings)}.pt"
    if not path.is_file():
        net = train(settings)
        write_atomic(path, lambda f: torch.save({"settings": asdict(settings), "state": net.state_dict()}, f))
    return path


def load(path: str | os.PathLike, name: str, net_class: type) -> nn.Module:
    """The classifier of a file written by :func:`cached` (read with weights_only=True): a ``net_class``
    of the file's settings' width and feat_dim."""
    obj = load_tensors(path, f"{name} classifier file")
    try:
        net = net_class(obj["settings"]["width"], obj["settings"]["feat_dim"])
        net.load_state_dict(obj["state"])
    except (KeyError, RuntimeError, TypeError) as e:
        raise MetricsError(f"{path}: not a {name} classifier file ({type(e).__name__}: {e})") from None
    return net.eval()


class ClassifierFeatures(FeatureExtractorBase):
    """torch-fidelity feature extractor over a classifier file (``feature_extractor_weights_path``).
    Subclasses set ``load`` (path -> network), ``prepare`` (uint8 (B, 3, H, W) -> the network's input)
    and ``side`` (the input side, for torch-fidelity's dummy input)."""
    load: Callable = None
    prepare: Callable = None
    side: int = 32

    def __init__(self, name, features_list, feature_extractor_weights_path=None, **kwargs):
        super().__init__(name, features_list)
        if feature_extractor_weights_path is None:
            raise MetricsError(f"feature extractor {name}: needs feature_extractor_weights_path (a classifier file)")
        self.net = type(self).load(feature_extractor_weights_path)
        self.requires_grad_(False)

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        out = dict(zip(("feat", "logits"), self.net(type(self).prepare(x))))
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

    @classmethod
    def get_dummy_input_for_compile(cls):
        return torch.zeros(1, 3, cls.side, cls.side, dtype=torch.uint8)


def register(name: str, extractor: type) -> None:
    """Register ``extractor`` with torch-fidelity under ``name`` (once per process)."""
    if name not in FEATURE_EXTRACTORS_REGISTRY:
        register_feature_extractor(name, extractor)
