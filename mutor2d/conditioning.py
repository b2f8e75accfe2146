"""What a sample is conditioned on: the prefix kinds, in one registry.

A conditioning kind (``CONDITIONING[cfg.conditioning]``) says how the prefix is embedded, how many
prefix tokens it makes, which prefixes are valid, and which prefix is the "null" one for
classifier-free guidance (CFG).

* ``class``: labels (B,) in 0..num_classes; label ``num_classes`` is the null class. One prefix
  token, embedded by ``GPT.cls_embedding`` (a LabelEmbedder; the name is LlamaGen's, so its
  checkpoints load with strict keys).
* ``prompt``: tokens (B, P), P >= 1, from the body vocabulary, embedded by the token embedding.
  No null prompt: CFG is refused.
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn as nn
from torch import Tensor


class LabelEmbedder(nn.Module):
    """Class embedding with one extra "null" row (index num_classes) for CFG."""

    def __init__(self, num_classes: int, dim: int, dropout: float):
        super().__init__()
        self.num_classes, self.dropout = num_classes, dropout
        self.embedding_table = nn.Embedding(num_classes + 1, dim)

    def forward(self, labels: Tensor) -> Tensor:
        """labels (B,) in 0..num_classes (num_classes = null) -> (B, 1, dim). In training mode a
        label is replaced by the null class with probability ``dropout``."""
        if self.training and self.dropout > 0:
            drop = torch.rand(labels.shape, device=labels.device) < self.dropout
            labels = torch.where(drop, torch.full_like(labels, self.num_classes), labels)
        return self.embedding_table(labels).unsqueeze(1)


class Conditioning(Protocol):
    name: str
    guidable: bool      # has a null prefix (CFG possible)
    per_class: bool     # prefixes are class labels: num_classes comes from the data, grids have a row per class

    def build(self, model: nn.Module) -> None:
        """Add the prefix embedder (if any) to ``model`` under its state-dict name."""

    def embed(self, model: nn.Module, prefix: Tensor) -> Tensor:
        """prefix -> (B, P, dim) embeddings."""

    def prefix_len(self, prefix: Tensor) -> int:
        """P, the number of prefix tokens."""

    def check(self, cfg, prefix: Tensor) -> None:
        """Raise ValueError (one line) for a prefix this model cannot take."""

    def null_prefix(self, cfg, prefix: Tensor) -> Tensor:
        """The unconditional prefix of the same shape, for CFG (ValueError if there is none)."""


def _check_integer(prefix: Tensor) -> None:
    if prefix.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"prefix: expected integer tokens, got dtype {prefix.dtype}")


class ClassLabel:
    name, guidable, per_class = "class", True, True

    def build(self, model):
        cfg = model.cfg
        model.cls_embedding = LabelEmbedder(cfg.num_classes, model.shape.dim, cfg.class_dropout)

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
        return torch.full_like(prefix, cfg.num_classes)


class Prompt:
    name, guidable, per_class = "prompt", False, False

    def build(self, model):
        pass

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

    def null_prefix(self, cfg, prefix):
        raise ValueError(f"classifier-free guidance needs class labels, this model's prefix is {self.name!r}")


CONDITIONING: dict[str, Conditioning] = {"class": ClassLabel(), "prompt": Prompt()}


def conditioning(name: str) -> Conditioning:
    if name not in CONDITIONING:
        raise ValueError(f"model.conditioning={name!r}: expected one of {sorted(CONDITIONING)}")
    return CONDITIONING[name]
