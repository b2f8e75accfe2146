"""npz sample files (what the evaluator reads): ``images`` uint8 (N, H, W, 3), the prefixes as the
model's conditioning kind stores them (class labels: ``labels`` int64 (N,); ``npz_arrays``), ``meta``
a 0-d string array holding JSON (``sample_meta``; the assembled file adds ``decode_stats``, the
``DecodeStats`` summary of its decoding). ``NpzJob`` writes them as shards of ``batch_size`` samples,
each one batch of ``images.make_sampler`` seeded like ``images.sample_batches``'s, so the file is the
same for any number of processes (it does depend on batch_size, which meta records). Finished
shards wait in ``OUT_shards/`` beside the npz and are skipped on rerun; the npz is assembled from
them at the end and the folder removed.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from torch import Tensor

from ..io import write_atomic
from ..model.conditioning import Conditioning, conditioning
from .values import SampleFileError
from .images import SETTINGS, Sampler, shard_seed
from .stats import DecodeStats


def sample_meta(*, checkpoint: str, step: int, config: dict, settings: dict, seed: int, classes: list[int],
                num: int, batch_size: int, ema: bool, grid, decode: str = "plain",
                decode_options: dict | None = None) -> dict:
    """The ``meta`` of a sample file: where the samples come from and every setting that made them
    (the assembled file adds ``decode_stats``, measured while sampling)."""
    return dict(checkpoint=str(checkpoint), step=step, config=config, **{k: settings[k] for k in SETTINGS},
                seed=seed, per_class=num // len(classes), num=num, classes=list(classes), batch_size=batch_size,
                ema=ema, grid=list(grid), decode=decode, decode_options=dict(decode_options or {}))


def read_npz(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray | None, dict]:
    """(images uint8 (N, H, W, 3), labels int64 (N,) or None for prefixes that are not class labels,
    meta dict) of a sample file."""
    with np.load(path, allow_pickle=False) as f:
        return f["images"], f["labels"] if "labels" in f.files else None, json.loads(str(f["meta"]))


def read_npz_meta(path: str | os.PathLike) -> dict | None:
    """The meta dict of a sample file (or shard) alone: an npz is read per entry, so the images
    (~10 GB for 50K 256 px samples) stay on disk. None when ``path`` holds no readable sample file
    (missing, truncated or foreign)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            return json.loads(str(f["meta"]))
    except Exception:
        return None


def shard_dir(npz_path: str | os.PathLike) -> Path:
    """``out.npz`` -> ``out_shards/`` beside it."""
    p = Path(npz_path)
    return p.with_name(p.stem + "_shards")


def _canon(value) -> str:
    return json.dumps(value, sort_keys=True)


def _meta_mismatch(found: dict, meta: dict) -> list[str]:
    return [k for k in sorted(set(found) | set(meta)) if _canon(found.get(k)) != _canon(meta.get(k))]


class NpzJob:
    """N balanced samples of ``prefixes`` (the model's conditioning ``kind``; default class labels)
    written as shards of ``batch_size`` (see module docstring)."""

    def __init__(self, out: str | os.PathLike, prefixes: Tensor, batch_size: int, seed: int, meta: dict,
                 kind: Conditioning | None = None):
        if batch_size < 1:
            raise SampleFileError(f"--batch-size {batch_size}: expected >= 1")
        self.out, self.prefixes, self.batch_size, self.seed = Path(out), prefixes, batch_size, seed
        self.kind = kind or conditioning("class")
        self.meta = json.loads(_canon(meta))   # plain JSON types, as read back from a file
        self.dir = shard_dir(self.out)

    @property
    def num_shards(self) -> int:
        return -(-len(self.prefixes) // self.batch_size)

    def shard_path(self, k: int) -> Path:
        return self.dir / f"shard_{k:06d}.npz"

    def is_complete(self) -> bool:
        """True if ``out`` already holds this very job (same meta; only the meta entry is read)."""
        return self.differing_settings() == []

    def differing_settings(self) -> list[str] | None:
        """The meta keys in which the file at ``out`` differs from this job ([]: this very job); None
        when there is no readable sample file there."""
        found = read_npz_meta(self.out)
        if found is None:
            return None
        found.pop("decode_stats", None)             # measured while sampling: not a setting
        return _meta_mismatch(found, self.meta)

    def _shard_done(self, k: int) -> bool:
        found = read_npz_meta(self.shard_path(k))
        if found is None:       # missing, truncated or foreign: make it again
            return False
        if bad := _meta_mismatch(found, self.meta):
            raise SampleFileError(f"{self.dir} holds shards made with other settings (differs in: "
                                  f"{', '.join(bad)}); delete it or write to another --npz")
        return True

    def missing(self) -> list[int]:
        """Shards not yet made (raises if the folder holds shards of other settings)."""
        return [k for k in range(self.num_shards) if not self._shard_done(k)]

    def make_shard(self, sampler: Sampler, k: int) -> None:
        prefixes = self.kind.batch(self.prefixes, k * self.batch_size, (k + 1) * self.batch_size)
        images = sampler(prefixes, shard_seed(self.seed, k))
        arrays = dict(images=images, **self.kind.npz_arrays(prefixes), meta=np.array(_canon(self.meta)),
                      stats=np.array(json.dumps(getattr(sampler, "last", DecodeStats()).state())))
        write_atomic(self.shard_path(k), lambda f: np.savez(f, **arrays))

    def run(self, sampler: Sampler, shards: list[int], progress: bool = False) -> None:
        """Make the given shards. Processes split ``missing()`` (taken by all of them before any
        starts) as ``missing[rank::world]``. ``progress``: a bar on a terminal; where stderr is not one
        (a log file), a line at about every tenth of the shards instead."""
        from tqdm import tqdm
        lines = progress and not sys.stderr.isatty()
        start, every = time.monotonic(), max(1, len(shards) // 10)
        for i, k in enumerate(tqdm(shards, desc="shards", disable=not progress or lines, dynamic_ncols=True), 1):
            self.make_shard(sampler, k)
            if lines and (i % every == 0 or i == len(shards)):
                spent = time.monotonic() - start
                print(f"shards {i}/{len(shards)}: {spent:.0f} s so far, about {spent / i * (len(shards) - i):.0f} s "
                      "left", file=sys.stderr, flush=True)

    def complete(self, sampler: Sampler) -> Path:
        """One process: make the missing shards (none if ``out`` already holds this job) and assemble."""
        if not self.is_complete():
            self.run(sampler, self.missing())
            self.assemble()
        return self.out

    def assemble(self) -> Path:
        """Join all shards into ``out`` (atomic write) and remove the shard folder."""
        if missing := self.missing():
            raise SampleFileError(f"{self.dir}: {len(missing)} of {self.num_shards} shards are missing "
                                  f"(first: {missing[0]}); rerun to finish them")
        n, images, prefixes, at, stats = len(self.prefixes), None, {}, 0, DecodeStats()
        for k in range(self.num_shards):        # fill one array: 50K 256px images are ~10 GB
            with np.load(self.shard_path(k), allow_pickle=False) as f:
                part = f["images"]
                stats.merge(DecodeStats.from_state(json.loads(str(f["stats"]))))
                if images is None:
                    images = np.empty((n, *part.shape[1:]), np.uint8)
                images[at: at + len(part)] = part
                for key in f.files:
                    if key not in ("images", "meta", "stats"):     # the prefixes, as the kind stores them
                        prefixes.setdefault(key, []).append(f[key])
                at += len(part)
        if at != n:
            raise SampleFileError(f"{self.dir}: shards hold {at} samples, expected {n}")
        meta = {**self.meta, "decode_stats": stats.summary()}
        arrays = {k: np.concatenate(v) for k, v in prefixes.items()}
        write_atomic(self.out, lambda f: np.savez(f, images=images, **arrays, meta=np.array(_canon(meta))))
        shutil.rmtree(self.dir)
        return self.out
