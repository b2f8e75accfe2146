"""What every objective shares: the batch it reads, the result it returns, the masked loss."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


@dataclass
class Batch:
    """body (B, N) tokens in raster order of ``grid``; prefix: labels (B,) or prompt (B, P);
    lengths (B,) real body lengths for padded 1D data, else None."""
    body: Tensor
    prefix: Tensor
    grid: tuple[int, int]
    lengths: Tensor | None = None


@dataclass
class ObjectiveResult:
    """What one forward of an objective declares.

    loss: scalar to backpropagate. logs: scalar losses worth logging, by name (e.g. "loss_ntp",
    "loss_reg"; the multi-head baseline logs "loss_heads"). counts: valid targets per loss term
    (e.g. "ntp", "reg"), 0-d long tensors. tokens: 0-d tensor, tokens the trunk processed
    (B x (regular + register slots)), for FLOP estimates.
    """
    loss: Tensor
    logs: dict[str, Tensor]
    counts: dict[str, Tensor]
    tokens: Tensor

    def as_dict(self) -> dict[str, Tensor]:
        """The flat view older callers read: "loss", the log names, and "n_<term>" per count."""
        return {"loss": self.loss, **self.logs, **{f"n_{k}": v for k, v in self.counts.items()}}

    def __getitem__(self, key: str) -> Tensor:
        return self.as_dict()[key]

    def __contains__(self, key: str) -> bool:
        return key in self.as_dict()

    def get(self, key: str, default=None):
        return self.as_dict().get(key, default)


class Objective(Protocol):
    """An nn.Module computing the training loss of ``model`` on a batch."""

    def forward(self, model: nn.Module, batch: Batch, generator: torch.Generator | None = None
                ) -> ObjectiveResult: ...

    def blocks(self) -> list[nn.Module]:
        """Transformer blocks this objective owns (compiled like the model's); usually []."""
        ...


def masked_ce(logits: Tensor, targets: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Mean cross-entropy over valid positions (0 if none) and the count of valid positions.
    logits (..., V), targets and valid of the same leading shape."""
    n = valid.sum()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return (ce * valid.reshape(-1)).sum() / n.clamp(min=1), n
