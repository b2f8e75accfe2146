"""What a sample is conditioned on: the prefix kinds, in one registry.

A conditioning kind (``CONDITIONING[cfg.conditioning]``, a ``Conditioning``) says everything the
code needs to know about its prefixes: how the prefix is embedded, how many prefix tokens it makes,
which prefixes are valid, which prefix is the "null" one for classifier-free guidance (CFG), and for
sampling: which prefixes a grid or sample file picks from (``choices``; ``num_choices`` counts them,
None without a fixed set), how a balanced set is made (``balanced``) and cut into batches (``batch``),
how a grid row is named (``row_label``) and how the prefixes are stored in an npz sample file
(``npz_arrays``). Prefixes are one tensor whose first dimension is the sample.

* ``class``: labels (B,) in 0..num_classes; label ``num_classes`` is the null class. One prefix
  token, embedded by ``GPT.cls_embedding`` (a LabelEmbedder; the name is LlamaGen's, so its
  checkpoints load with strict keys). Stored as ``labels`` int64 (N,) in npz files.
* ``prompt``: tokens (B, P), P >= 1, from the body vocabulary, embedded by the token embedding.
  No null prompt: CFG is refused; no fixed choices: training writes no sample grids (a note at
  start-up says so) and sample.py refuses the run.

The kinds import torch only inside their methods, so a config names and checks its kind before
torch is imported (mutor2d.model.config). A new kind is one module: a ``Conditioning`` subclass
registered with ``@register_conditioning`` (docs/METHOD.md, "Datasets and conditioning"); a plugin module is imported through MUTOR2D_PLUGINS.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor, nn


IMAGENET_NAMES = Path(__file__).with_name("imagenet_classes.txt")


def class_names(num_classes: int) -> list[str]:
    """Names of the classes: ImageNet's 1000 (imagenet_classes.txt, in index order), else the indices
    ("0".."9" for digits)."""
    return list(imagenet_names()) if num_classes == 1000 else [str(i) for i in range(num_classes)]


@functools.cache
def imagenet_names() -> tuple[str, ...]:
    return tuple(IMAGENET_NAMES.read_text().splitlines())


class Conditioning:
    """A conditioning kind; the defaults suit any prefix tensor indexed by sample first."""
    name: str = ""
    guidable: bool = False   # has a null prefix (CFG possible)
    per_class: bool = False  # prefixes are class labels: num_classes comes from the data

    def build(self, model: nn.Module) -> None:
        """Add the prefix embedder (if any) to ``model`` under its state-dict name."""

    def embed(self, model: nn.Module, prefix: Tensor) -> Tensor:
        """prefix -> (B, P, dim) embeddings."""
        raise NotImplementedError

    def prefix_len(self, prefix: Tensor) -> int:
        """P, the number of prefix tokens."""
        raise NotImplementedError

    def check(self, cfg, prefix: Tensor) -> None:
        """Raise ValueError (one line) for a prefix this model cannot take."""

    def null_prefix(self, cfg, prefix: Tensor) -> Tensor:
        """The unconditional prefix of the same shape, for CFG (ValueError if there is none)."""
        raise ValueError(f"classifier-free guidance needs a null prefix, this model's prefix is {self.name!r}")

    def choices(self, cfg) -> Tensor:
        """The prefixes (C, ...) that sample grids (one row each) and sample files pick from by index;
        ValueError (one line) if the kind has no fixed set."""
        raise ValueError(f"model.conditioning={self.name!r} has no fixed set of prefixes to sample grids "
                         f"or sample files from")

    def num_choices(self, cfg) -> int | None:
        """C, the number of ``choices(cfg)`` (what ``sample.classes`` / ``--classes`` index: 0..C-1);
        None for a kind without a fixed set."""
        try:
            return len(self.choices(cfg))
        except ValueError:
            return None

    def balanced(self, cfg, each: int, picks: list[int]) -> Tensor:
        """``each`` copies of every choice in ``picks``, pick-major: (len(picks) * each, ...)."""
        import torch
        return self.choices(cfg)[torch.tensor(picks, dtype=torch.long)].repeat_interleave(each, dim=0)

    def batch(self, prefixes: Tensor, start: int, stop: int) -> Tensor:
        """Samples start..stop-1 of ``prefixes``."""
        return prefixes[start:stop]

    def row_label(self, cfg, pick: int) -> str:
        """The name of choice ``pick`` as a grid row."""
        return f"{self.name} {pick}"

    def npz_arrays(self, prefixes: Tensor) -> dict[str, np.ndarray]:
        """How a sample file stores ``prefixes`` (N, ...): name -> array with N rows."""
        return {"prefixes": prefixes.cpu().numpy()}


CONDITIONING: dict[str, Conditioning] = {}


def register_conditioning(cls: type) -> type:
    """Class decorator: add an instance of a ``Conditioning`` subclass under its ``name``."""
    CONDITIONING[cls.name] = cls()
    return cls


def _check_integer(prefix: Tensor) -> None:
    import torch
    if prefix.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"prefix: expected integer tokens, got dtype {prefix.dtype}")


@register_conditioning
class ClassLabel(Conditioning):
    name, guidable, per_class = "class", True, True

    def build(self, model):
        from .embedders import LabelEmbedder
        model.cls_embedding = LabelEmbedder(model.cfg.num_classes, model.shape.dim, model.cfg.class_dropout)

    def embed(self, model, prefix):
        return model.cls_embedding(prefix)

    def prefix_len(self, prefix):
        return 1

    def check(self, cfg, prefix):
        _check_integer(prefix)
        n = cfg.num_classes
        if prefix.dim() != 1:
            raise ValueError(f"prefix: a class-conditional model takes labels (B,), got shape {tuple(prefix.shape)}")
        if prefix.numel() and (prefix.min() < 0 or prefix.max() > n):
            raise ValueError(f"prefix: class labels must lie in 0..{n} ({n} = unconditional), "
                             f"got {prefix.min().item()}..{prefix.max().item()}")

    def null_prefix(self, cfg, prefix):
        import torch
        return torch.full_like(prefix, cfg.num_classes)

    def choices(self, cfg):
        import torch
        return torch.arange(cfg.num_classes)

    def balanced(self, cfg, each, picks):        # no model config needed: the labels are the picks
        import torch
        return torch.tensor(picks, dtype=torch.long).repeat_interleave(each)

    def row_label(self, cfg, pick):            # "7" (digits), "207: golden retriever" (ImageNet)
        name = class_names(cfg.num_classes)[pick]
        return name if name == str(pick) else f"{pick}: {name}"

    def npz_arrays(self, prefixes):
        return {"labels": prefixes.cpu().numpy().astype(np.int64)}


@register_conditioning
class Prompt(Conditioning):
    name, guidable, per_class = "prompt", False, False

    def embed(self, model, prefix):
        return model.tok_embeddings(prefix)

    def prefix_len(self, prefix):
        return prefix.shape[1]

    def check(self, cfg, prefix):
        _check_integer(prefix)
        V = cfg.vocab_size
        if prefix.dim() != 2 or prefix.shape[1] < 1:
            raise ValueError(f"prefix: a prompt model takes tokens (B, P) with P >= 1, got shape {tuple(prefix.shape)}")
        if prefix.min() < 0 or prefix.max() >= V:
            raise ValueError(f"prefix: prompt tokens must lie in 0..{V - 1}, "
                             f"got {prefix.min().item()}..{prefix.max().item()}")


def conditioning(name: str) -> Conditioning:
    if name not in CONDITIONING:
        raise ValueError(f"model.conditioning={name!r}: expected one of {sorted(CONDITIONING)}")
    return CONDITIONING[name]
