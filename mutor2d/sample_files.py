"""Sample files: class-balanced label plans, PNG grids, and sharded, resumable npz batches.

npz format (what the evaluator reads): ``images`` uint8 (N, H, W, 3), ``labels`` int64 (N,),
``meta`` a 0-d string array holding JSON (checkpoint, step, config, cfg_scale, temperature, top_k,
top_p, seed, per_class, num, classes, batch_size, ema, grid).

Reproducibility rule: the N samples are cut into shards of ``batch_size`` consecutive labels
(class-major order); shard k is one ``generate`` call seeded from (seed, k). Which process makes
a shard does not matter, so the result is the same for any number of processes; it does depend
on batch_size (recorded in meta). Finished shards are kept in ``OUT_shards/`` beside the npz and
skipped on rerun; the npz is assembled from them at the end and the folder removed.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .sampling import generate

Sampler = Callable[[Tensor, int], np.ndarray]  # (labels (n,), seed) -> uint8 images (n, h, w, 3)


class SampleFileError(ValueError):
    """Bad sample request or inconsistent shard folder; one-line message."""


# ----------------------------------------------------------------------------- labels and seeds

def spread_classes(num_classes: int, count: int = 10) -> list[int]:
    """``count`` classes evenly spread over 0..num_classes-1 (all of them if there are fewer)."""
    if num_classes <= count:
        return list(range(num_classes))
    return [round(i * (num_classes - 1) / (count - 1)) for i in range(count)]


def parse_classes(text: str, num_classes: int) -> list[int]:
    """"1,7,9" -> [1, 7, 9], each in 0..num_classes-1."""
    out = []
    for item in text.split(","):
        item = item.strip()
        try:
            c = int(item)
        except ValueError:
            raise SampleFileError(f"--classes {text!r}: {item!r} is not a class index "
                                  f"(expected comma-separated integers in 0..{num_classes - 1})") from None
        if not 0 <= c < num_classes:
            raise SampleFileError(f"--classes {text!r}: class {c} is out of range 0..{num_classes - 1}")
        out.append(c)
    return out


def balanced_labels(num: int, classes: list[int]) -> Tensor:
    """(num,) labels, num / len(classes) of each class, class-major (c0 c0 … c1 c1 …)."""
    if num < 1 or num % len(classes):
        raise SampleFileError(f"--num {num}: must be a positive multiple of the number of classes "
                              f"({len(classes)}) so that every class gets the same count")
    return torch.tensor(classes, dtype=torch.long).repeat_interleave(num // len(classes))


def shard_seed(seed: int, index: int) -> int:
    """The seed of shard (or batch) ``index`` of a run seeded with ``seed``."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0] >> 1)


# ----------------------------------------------------------------------------- images

def to_uint8(images: Tensor) -> np.ndarray:
    """images (B, 3, h, w) float in [0, 1] -> uint8 (B, h, w, 3)."""
    return (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


def make_sampler(model, tokenizer, grid: tuple[int, int], *, cfg_scale: float = 1.0,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 device: torch.device | str = "cpu") -> Sampler:
    """(labels (n,), seed) -> uint8 images (n, h, w, 3): generate codes, decode with ``tokenizer``."""
    device = torch.device(device)

    def sample(labels: Tensor, seed: int) -> np.ndarray:
        gen = torch.Generator(device).manual_seed(seed)
        tokens = generate(model, labels.to(device), grid, cfg_scale=cfg_scale, temperature=temperature,
                          top_k=top_k, top_p=top_p, generator=gen)
        with torch.no_grad():
            images = tokenizer.decode(tokens.view(-1, *grid))
        return to_uint8(images)

    return sample


def sample_batches(sampler: Sampler, labels: Tensor, batch_size: int, seed: int) -> np.ndarray:
    """All ``labels`` in batches; batch k seeded with shard_seed(seed, k)."""
    parts = [sampler(labels[i: i + batch_size], shard_seed(seed, k))
             for k, i in enumerate(range(0, len(labels), batch_size))]
    return np.concatenate(parts)


def save_grid(images: np.ndarray, ncol: int, path: str | os.PathLike, min_side: int = 64, pad: int = 2) -> Path:
    """uint8 images (B, h, w, 3) -> PNG grid with ``ncol`` columns on a white background.
    Images smaller than ``min_side`` are upscaled by an integer factor, nearest-neighbour (8x8
    digits become visible). Size: (pad + ncol·(w·s + pad)) x (pad + rows·(h·s + pad))."""
    from PIL import Image
    B, h, w, _ = images.shape
    s = max(1, math.ceil(min_side / min(h, w)))
    x = images.repeat(s, axis=1).repeat(s, axis=2)
    rows = -(-B // ncol)
    canvas = np.full((pad + rows * (h * s + pad), pad + ncol * (w * s + pad), 3), 255, np.uint8)
    for i in range(B):
        r, c = divmod(i, ncol)
        y0, x0 = pad + r * (h * s + pad), pad + c * (w * s + pad)
        canvas[y0: y0 + h * s, x0: x0 + w * s] = x[i]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(canvas).save(path)
    return path


# ----------------------------------------------------------------------------- npz files

def _write_npz_atomic(path: Path, **arrays) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_npz(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, dict]:
    """(images uint8 (N, H, W, 3), labels int64 (N,), meta dict) of a sample file."""
    with np.load(path, allow_pickle=False) as f:
        return f["images"], f["labels"], json.loads(str(f["meta"]))


def shard_dir(npz_path: str | os.PathLike) -> Path:
    """``out.npz`` -> ``out_shards/`` beside it."""
    p = Path(npz_path)
    return p.with_name(p.stem + "_shards")


def _canon(meta: dict) -> str:
    return json.dumps(meta, sort_keys=True)


def _meta_mismatch(found: dict, meta: dict) -> list[str]:
    keys = sorted(set(found) | set(meta))
    return [k for k in keys if _canon({"v": found.get(k)}) != _canon({"v": meta.get(k)})]


class NpzJob:
    """N class-balanced samples written as shards of ``batch_size`` (see module docstring)."""

    def __init__(self, out: str | os.PathLike, labels: Tensor, batch_size: int, seed: int, meta: dict):
        if batch_size < 1:
            raise SampleFileError(f"--batch-size {batch_size}: expected >= 1")
        self.out, self.labels, self.batch_size, self.seed = Path(out), labels, batch_size, seed
        self.meta = json.loads(_canon(meta))   # plain JSON types, as read back from a file
        self.dir = shard_dir(self.out)

    @property
    def num_shards(self) -> int:
        return -(-len(self.labels) // self.batch_size)

    def shard_path(self, k: int) -> Path:
        return self.dir / f"shard_{k:06d}.npz"

    def is_complete(self) -> bool:
        """True if ``out`` already holds this very job (same meta)."""
        if not self.out.is_file():
            return False
        try:
            _, _, found = read_npz(self.out)
        except Exception:
            return False
        return _canon(found) == _canon(self.meta)

    def _shard_done(self, k: int) -> bool:
        path = self.shard_path(k)
        if not path.is_file():
            return False
        try:
            with np.load(path, allow_pickle=False) as f:
                found = json.loads(str(f["meta"]))
        except Exception:       # truncated or foreign: make it again
            return False
        bad = _meta_mismatch(found, self.meta)
        if bad:
            raise SampleFileError(f"{self.dir} holds shards made with other settings (differs in: "
                                  f"{', '.join(bad)}); delete it or write to another --npz")
        return True

    def missing(self) -> list[int]:
        """Shards not yet made (raises if the folder holds shards of other settings)."""
        return [k for k in range(self.num_shards) if not self._shard_done(k)]

    def make_shard(self, sampler: Sampler, k: int) -> None:
        labels = self.labels[k * self.batch_size: (k + 1) * self.batch_size]
        images = sampler(labels, shard_seed(self.seed, k))
        _write_npz_atomic(self.shard_path(k), images=images, labels=labels.numpy(),
                          meta=np.array(_canon(self.meta)))

    def run(self, sampler: Sampler, shards: list[int], progress: bool = False) -> None:
        """Make the given shards. Processes split ``missing()`` (taken by all of them before any
        starts) as ``missing[rank::world]``."""
        from tqdm import tqdm
        for k in tqdm(shards, desc="shards", disable=not progress, dynamic_ncols=True):
            self.make_shard(sampler, k)

    def assemble(self) -> Path:
        """Join all shards into ``out`` (atomic write) and remove the shard folder."""
        missing = self.missing()
        if missing:
            raise SampleFileError(f"{self.dir}: {len(missing)} of {self.num_shards} shards are missing "
                                  f"(first: {missing[0]}); rerun to finish them")
        images, labels, at = None, np.empty(len(self.labels), np.int64), 0
        for k in range(self.num_shards):        # fill one array: 50K 256px images are ~10 GB
            with np.load(self.shard_path(k), allow_pickle=False) as f:
                part = f["images"]
                if images is None:
                    images = np.empty((len(self.labels), *part.shape[1:]), np.uint8)
                images[at: at + len(part)] = part
                labels[at: at + len(part)] = f["labels"]
                at += len(part)
        if at != len(self.labels):
            raise SampleFileError(f"{self.dir}: shards hold {at} samples, expected {len(self.labels)}")
        _write_npz_atomic(self.out, images=images, labels=labels, meta=np.array(_canon(self.meta)))
        shutil.rmtree(self.dir)
        return self.out
