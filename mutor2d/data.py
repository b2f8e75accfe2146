"""Token datasets.

Every dataset yields dicts ``{"body": LongTensor (N,), "prefix": LongTensor ()}`` (class label) and
exposes ``grid`` (H, W), ``vocab_size``, ``num_classes``. ``collate`` stacks them.

The embedded default is scikit-learn's bundled ``load_digits`` (1797 real 8x8 grey images, 10
classes, no download), tokenised by the pixel tokenizer: grey level -> token, grid 8x8.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .config import DataConfig

DIGITS_MAX = 16.0  # load_digits grey levels are 0..16


class PixelTokenizer:
    """Quantise grey levels in [0, 1] to ``levels`` tokens and back. Grid = image size."""

    def __init__(self, levels: int):
        if levels < 2:
            raise ValueError(f"data.levels: need at least 2 grey levels, got {levels}")
        self.levels = levels
        self.vocab_size = levels

    def encode(self, images: Tensor) -> Tensor:
        """images (B, H, W) float in [0, 1] -> codes (B, H, W) long."""
        return (images.clamp(0, 1) * (self.levels - 1)).round().long()

    def decode(self, codes: Tensor) -> Tensor:
        """codes (B, H, W) long -> images (B, 3, H, W) float in [0, 1]."""
        img = codes.float() / (self.levels - 1)
        return img.unsqueeze(1).expand(-1, 3, -1, -1)


def digits_images(split: str, seed: int) -> tuple[Tensor, Tensor]:
    """The digits split: images (n, 8, 8) float in [0, 1], labels (n,). 80/20 split by ``seed``."""
    from sklearn.datasets import load_digits
    d = load_digits()
    order = np.random.default_rng(seed).permutation(len(d.target))
    cut = int(round(0.8 * len(order)))
    idx = {"train": order[:cut], "test": order[cut:]}.get(split)
    if idx is None:
        raise ValueError(f"split {split!r}: expected 'train' or 'test'")
    images = torch.from_numpy(d.images[idx] / DIGITS_MAX).float()
    return images, torch.from_numpy(d.target[idx]).long()


class TokenGrids(Dataset):
    """In-memory token grids: codes (n, H, W) and labels (n,)."""

    def __init__(self, codes: Tensor, labels: Tensor, vocab_size: int, num_classes: int):
        self.codes, self.labels = codes.long(), labels.long()
        self.grid = tuple(codes.shape[1:3])
        self.vocab_size, self.num_classes = vocab_size, num_classes

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"body": self.codes[i].reshape(-1), "prefix": self.labels[i]}


def build_tokenizer(cfg: DataConfig):
    """The tokenizer that turns this data's tokens into images (``decode``)."""
    if cfg.name == "digits" and cfg.tokenizer == "pixel":
        return PixelTokenizer(cfg.levels)
    raise ValueError(f"data.tokenizer={cfg.tokenizer!r} for data.name={cfg.name!r}: not available")


def build_dataset(cfg: DataConfig, split: str = "train") -> Dataset:
    if cfg.name == "digits":
        tok = build_tokenizer(cfg)
        images, labels = digits_images(split, cfg.data_seed)
        return TokenGrids(tok.encode(images), labels, tok.vocab_size, 10)
    raise ValueError(f"data.name={cfg.name!r}: no dataset builder")


def collate(items: list[dict]) -> dict:
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}
