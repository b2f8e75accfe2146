"""Token datasets.

Every dataset yields dicts ``{"body": LongTensor (N,), "prefix": LongTensor ()}`` (class label) and
exposes ``grid`` (H, W), ``vocab_size``, ``num_classes``. ``collate`` stacks them.

Builders (``data.name``):
  digits  scikit-learn's bundled ``load_digits`` (1797 real 8x8 grey images, 10 classes, no
          download). ``data.tokenizer: pixel`` quantises grey levels (grid 8x8); a VQ checkpoint path
          (e.g. one made by tokenizers/train_vq.py on digits) tokenises the digits upsampled to the
          VQ's image size instead.
  codes   a folder written by tokenizers/extract_codes.py (``data.path``; ``data.test_path`` for the
          test split): one random augmentation per sample, drawn from torch's RNG (seeded per
          DataLoader worker).
  stargraph  the 1D path-star task (mutor2d.stargraph).
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
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


def digits_rgb(images: Tensor, size: int) -> Tensor:
    """Grey digits (B, 8, 8) in [0, 1] -> (B, 3, size, size) in [0, 1] (bilinear upsampling)."""
    up = F.interpolate(images[:, None].float(), size=(size, size), mode="bilinear", align_corners=False)
    return up.clamp(0, 1).expand(-1, 3, -1, -1).contiguous()


class CodeDataset(Dataset):
    """Token grids of a codes folder (mutor2d.codes): rows with a readable image only.

    Each item takes augmentation ``torch.randint(num_augs)`` when ``random_aug`` (else the first,
    "center"). The memmap is opened lazily so DataLoader workers each map the file themselves."""

    def __init__(self, path: str | Path, random_aug: bool = True):
        from .codes import open_store
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
            self._codes = np.load(self.path / "codes.npy", mmap_mode="r")
            self._labels = np.load(self.path / "labels.npy", mmap_mode="r")
        row = int(self.rows[i])
        aug = int(torch.randint(self.num_augs, ())) if self.random_aug else 0
        body = torch.from_numpy(self._codes[row, aug].astype(np.int64)).reshape(-1)
        return {"body": body, "prefix": torch.tensor(int(self._labels[row]))}


def build_tokenizer(cfg: DataConfig):
    """The tokenizer that turns this data's tokens into images (``decode``)."""
    if cfg.tokenizer == "pixel":
        if cfg.name == "digits":
            return PixelTokenizer(cfg.levels)
        raise ValueError(f"data.tokenizer='pixel' only works with data.name='digits'; "
                         f"data.name={cfg.name!r} needs data.tokenizer set to a VQ checkpoint path")
    if cfg.name not in ("digits", "codes"):
        raise ValueError(f"data.name={cfg.name!r} has no image tokenizer (data.tokenizer={cfg.tokenizer!r})")
    from .vq import VQTokenizer
    tok = VQTokenizer.from_checkpoint(cfg.tokenizer)
    if cfg.name == "codes" and cfg.path is not None:
        from .codes import open_store
        header = open_store(cfg.path, require_complete=False).header
        if header.get("tokenizer_sha256") != tok.sha256:
            warnings.warn(f"data.tokenizer={cfg.tokenizer!r} is not the checkpoint that made the codes at "
                          f"{cfg.path!r} (that was {header.get('tokenizer')!r}); decoded images may be wrong")
    return tok


def build_dataset(cfg: DataConfig, split: str = "train") -> Dataset:
    if split not in ("train", "test"):
        raise ValueError(f"split {split!r}: expected 'train' or 'test'")
    if cfg.name == "digits":
        tok = build_tokenizer(cfg)
        images, labels = digits_images(split, cfg.data_seed)
        if isinstance(tok, PixelTokenizer):
            codes = tok.encode(images)
        else:
            codes = torch.cat([tok.encode(digits_rgb(x, tok.image_size)).cpu() for x in images.split(256)])
        return TokenGrids(codes, labels, tok.vocab_size, 10)
    if cfg.name == "codes":
        path = cfg.path if split == "train" else cfg.test_path
        if path is None:
            key = "data.path" if split == "train" else "data.test_path"
            raise ValueError(f"data.name='codes' needs {key} (a folder from tokenizers/extract_codes.py) "
                             f"for the {split} split")
        return CodeDataset(path, random_aug=split == "train")
    if cfg.name == "stargraph":
        from .stargraph import build_stargraph
        return build_stargraph(cfg, split)
    raise ValueError(f"data.name={cfg.name!r}: no dataset builder")


def collate(items: list[dict]) -> dict:
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}
