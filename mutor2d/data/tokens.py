"""Token datasets.

Every dataset yields dicts ``{"body": LongTensor (N,), "prefix": LongTensor}`` (class label, or a
prompt) and exposes ``grid`` (H, W), ``vocab_size``, ``num_classes``. ``collate`` stacks them.

``data.name`` picks a :class:`DataConfig` variant: its fields, and how it builds a split and the
tokenizer that turns its tokens into images:
  digits  scikit-learn's bundled ``load_digits`` (1797 real 8x8 grey images, no download).
          ``data.val_fraction`` holds out a validation split ("val") of the training set and
          ``data.train_fraction`` trains on a nested share of the rest (``digits_indices``).
          ``data.tokenizer: pixel`` quantises grey levels (grid 8x8); a VQ checkpoint path (e.g. one
          made by tokenizers/train_vq.py on digits) tokenises the digits upsampled to the VQ's
          image size instead.
  codes   a folder written by tokenizers/extract_codes.py (``data.path``; ``data.test_path`` for the
          test split): one random augmentation per sample, drawn from torch's RNG (seeded per
          DataLoader worker).
  stargraph  the 1D path-star task (mutor2d.data.stargraph).
Adding a dataset: one DataConfig subclass registered with ``@register_variant("data", NAME)``.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from ..tokenizer import Tokenizer
from ..tokenizer.codes import open_store
from .config import CodesDataConfig, DataConfig, DigitsDataConfig  # noqa: F401 (its configs, importable from here)

DIGITS_MAX = 16.0  # load_digits grey levels are 0..16


@functools.lru_cache(maxsize=1)
def _load_digits():
    from sklearn.datasets import load_digits
    return load_digits()


def digits_num_classes() -> int:
    """Number of digit classes, read from the data (its ``target_names``)."""
    return len(_load_digits().target_names)


def _first(fraction: float, n: int) -> int:
    """ceil(fraction * n), robust to float noise (0.1 * 1440 is 144, not 145)."""
    return math.ceil(fraction * n - 1e-9)


def digits_indices(split: str, seed: int, val_fraction: float = 0.0, train_fraction: float = 1.0) -> np.ndarray:
    """Row indices of a digits split; every split is fixed by ``seed`` alone.

    test: the last 20% of a permutation of all images (seed); train/val: the first 80% ("the training
    set"), split by a second permutation of it (seed, 1): val = its first ceil(val_fraction * n), the
    rest in that order is the training pool, and train = the pool's first ceil(train_fraction * m)
    (so fractions are nested: 25% of the pool is inside 50%). Indices come in the training set's
    order, so val_fraction 0 and train_fraction 1 give the plain 80% split unchanged."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"split {split!r}: expected 'train', 'val' or 'test'")
    d = _load_digits()
    order = np.random.default_rng(seed).permutation(len(d.target))
    cut = int(round(0.8 * len(order)))
    if split == "test":
        return order[cut:]
    n_val = _first(val_fraction, cut)
    if split == "val" and n_val == 0:
        raise ValueError("split 'val': needs data.val_fraction > 0 (no validation images are held out)")
    pool = np.random.default_rng((seed, 1)).permutation(cut)
    val, rest = pool[:n_val], pool[n_val:]
    take = val if split == "val" else rest[:_first(train_fraction, len(rest))]
    if len(take) == 0:
        raise ValueError(f"data.val_fraction={val_fraction}, data.train_fraction={train_fraction}: "
                         f"leave no training images (of {cut})")
    return order[:cut][np.sort(take)]


def digits_images(split: str, seed: int, val_fraction: float = 0.0,
                  train_fraction: float = 1.0) -> tuple[Tensor, Tensor]:
    """The digits split (``digits_indices``): images (n, 8, 8) float in [0, 1], labels (n,)."""
    d = _load_digits()
    idx = digits_indices(split, seed, val_fraction, train_fraction)
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


def digits_rgb(images: Tensor, size: int) -> Tensor:
    """Grey digits (B, 8, 8) in [0, 1] -> (B, 3, size, size) in [0, 1] (bilinear upsampling)."""
    if images.shape[-2:] == (size, size):
        return images[:, None].float().clamp(0, 1).expand(-1, 3, -1, -1).contiguous()
    up = F.interpolate(images[:, None].float(), size=(size, size), mode="bilinear", align_corners=False)
    return up.clamp(0, 1).expand(-1, 3, -1, -1).contiguous()


class CodeDataset(Dataset):
    """Token grids of a codes folder (mutor2d.tokenizer.codes): rows with a readable image only.

    Each item takes augmentation ``torch.randint(num_augs)`` when ``random_aug`` (else the first,
    "center"). The memmap is opened lazily so DataLoader workers each map the file themselves."""

    def __init__(self, path: str | Path, random_aug: bool = True):
        store = open_store(path)
        self.path, self.header, self.random_aug = Path(path), store.header, random_aug
        self.rows = np.flatnonzero(np.asarray(store.labels) >= 0)
        if len(self.rows) == 0:
            raise ValueError(f"data.path={str(path)!r}: the codes folder holds no readable images")
        self.grid = tuple(self.header["grid"])
        self.vocab_size = int(self.header["codebook_size"])
        self.num_classes = len(self.header["classes"])
        self.num_augs = int(self.header["num_augs"])
        self._codes = self._labels = None

    def __getstate__(self):
        return {**self.__dict__, "_codes": None, "_labels": None}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        if self._codes is None:
            self._codes = np.load(self.path / "codes.npy", mmap_mode="r", allow_pickle=False)
            self._labels = np.load(self.path / "labels.npy", mmap_mode="r", allow_pickle=False)
        row = int(self.rows[i])
        aug = int(torch.randint(self.num_augs, ())) if self.random_aug else 0
        body = torch.from_numpy(self._codes[row, aug].astype(np.int64)).reshape(-1)
        return {"body": body, "prefix": torch.tensor(int(self._labels[row]))}


def build_tokenizer(cfg: DataConfig) -> Tokenizer:
    """The tokenizer that turns this data's tokens into images (``decode``)."""
    return cfg.build_tokenizer()


def build_dataset(cfg: DataConfig, split: str = "train") -> Dataset:
    """Split ``split`` ("train", "val" or "test") of the data ``cfg`` describes; a kind without a
    validation split refuses "val"."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"split {split!r}: expected 'train', 'val' or 'test'")
    return cfg.build(split)


def collate(items: list[dict]) -> dict:
    """Items of one dataset -> a batch: each key stacked along a new first dimension."""
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}
