"""Token datasets.

Every dataset yields dicts ``{"body": LongTensor (N,), "prefix": LongTensor}`` (class label, or a
prompt) and exposes ``grid`` (H, W), ``vocab_size``, ``num_classes``. ``collate`` stacks them.

``data.name`` picks a :class:`DataConfig` variant (mutor2d.data.config: its fields and rules), whose
builder here makes a split; ``build_tokenizer`` makes the tokenizer that turns its tokens into images:
  digits  scikit-learn's bundled ``load_digits`` (1797 real 8x8 grey images, no download), split by
          ``digits_indices``; pixel grey levels (grid 8x8), or a VQ checkpoint at its image size.
  codes   a folder written by tokenizers/extract_codes.py: one random augmentation per sample, drawn
          from torch's RNG (seeded per DataLoader worker).
  photos  random crops of ten installed photographs (mutor2d.data.photos), or their codes folders.
  stargraph  the 1D path-star task (mutor2d.data.stargraph).
"""
from __future__ import annotations

import functools
import math
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from ..io import warn
from ..registry import REGISTRY, build, builder
from ..tokenizer import base as tokenizer_base
from ..tokenizer.base import Tokenizer
from ..tokenizer.codes import open_store
from .config import CodesDataConfig, DataConfig, DigitsDataConfig, PhotosDataConfig
from .photos import CLASSES, photo_crops

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
    order = np.random.default_rng(seed).permutation(len(_load_digits().target))
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
    x = images[:, None].float()
    if x.shape[-2:] != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.clamp(0, 1).expand(-1, 3, -1, -1).contiguous()


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


def digits_dataset(cfg: DigitsDataConfig, split: str) -> TokenGrids:
    """The digits of ``split``, tokenised by ``data.tokenizer``."""
    tok = build_tokenizer(cfg)
    images, labels = digits_images(split, cfg.data_seed, cfg.val_fraction, cfg.train_fraction)
    codes = torch.cat([tok.encode(digits_rgb(x, tok.image_size)).cpu() for x in images.split(256)])
    return TokenGrids(codes, labels, tok.vocab_size, digits_num_classes())


def codes_dataset(cfg: CodesDataConfig, split: str) -> CodeDataset:
    """The codes folder of ``split``: ``data.path`` (train) or ``data.test_path`` (test)."""
    if split == "val":
        raise ValueError("split 'val': data.name='codes' has no validation split (data.path, data.test_path)")
    path = cfg.path if split == "train" else cfg.test_path
    if path is None:
        key = "data.path" if split == "train" else "data.test_path"
        raise ValueError(f"data.name='codes' needs {key} (a folder from tokenizers/extract_codes.py) "
                         f"for the {split} split")
    return CodeDataset(path, random_aug=split == "train")


def photos_dataset(cfg: PhotosDataConfig, split: str) -> CodeDataset | TokenGrids:
    """The codes folder of ``split`` when the config names one, else its crops tokenised in memory."""
    if split not in ("train", "test"):
        raise ValueError(f"split {split!r}: data.name='photos' has 'train' and 'test'")
    path = cfg.path if split == "train" else cfg.test_path
    if path:
        return CodeDataset(path, random_aug=split == "train")
    tok = build_tokenizer(cfg)
    images, labels = photo_crops(split, cfg.num_train if split == "train" else cfg.num_test,
                                 tok.image_size, cfg.data_seed)
    x = torch.from_numpy(images).permute(0, 3, 1, 2)
    codes = torch.cat([tok.encode(b.float() / 255.0).cpu() for b in x.split(256)])
    return TokenGrids(codes, torch.from_numpy(labels), tok.vocab_size, len(CLASSES))


def build_tokenizer(cfg: DataConfig) -> Tokenizer:
    """The tokenizer that turns this data's tokens into images (``decode``): its variant's ``tokenizer``
    builder when it registered one, else the one ``data.tokenizer`` names (at ``data.image_size`` where
    the data has one); codes are checked to be its."""
    own = f"{getattr(cfg, 'builds', '')}.tokenizer"
    if own in REGISTRY:
        return builder(own)(cfg)
    if not hasattr(cfg, "tokenizer"):
        raise ValueError(f"data.name={cfg.name!r} has no image tokenizer (no data.tokenizer)")
    tok = tokenizer_base.build_tokenizer(cfg.tokenizer, data=cfg, image_size=getattr(cfg, "image_size", None))
    if isinstance(cfg, CodesDataConfig):
        check_made_by(cfg, tok)
    return tok


def check_made_by(cfg: CodesDataConfig, tok: Tokenizer) -> None:
    """The codes at ``data.path`` come from ``tok``: the same codebook size (else ValueError), the same
    sha256 (else a warning); without the folder here (sampling elsewhere), a warning."""
    if cfg.path is None:
        return
    if not (Path(cfg.path) / "header.json").exists():
        warn(f"no codes folder at data.path={cfg.path!r} here: cannot check that data.tokenizer="
             f"{cfg.tokenizer!r} made those codes (decoding does not need them)", once=True)
        return
    header = open_store(cfg.path, require_complete=False, check_values=False).header
    if header["codebook_size"] != tok.vocab_size:
        raise ValueError(f"data.tokenizer={cfg.tokenizer!r} has {tok.vocab_size} codes but the codes at "
                         f"{cfg.path!r} come from a codebook of {header['codebook_size']}")
    if header.get("tokenizer_sha256") != tok.sha256:
        warnings.warn(f"data.tokenizer={cfg.tokenizer!r} is not the tokenizer that made the codes at "
                      f"{cfg.path!r} (that was {header.get('tokenizer')!r}); decoded images may be wrong")


def build_dataset(cfg: DataConfig, split: str = "train") -> Dataset:
    """Split ``split`` ("train", "val" or "test") of the data ``cfg`` describes, by its builder; a kind
    without a validation split refuses "val"."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"split {split!r}: expected 'train', 'val' or 'test'")
    return build(cfg, split)


def collate(items: list[dict]) -> dict:
    """Items of one dataset -> a batch: each key stacked along a new first dimension."""
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}
