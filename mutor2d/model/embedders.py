"""The class-label embedding of the ``class`` conditioning kind (mutor2d.model.conditioning)."""
from __future__ import annotations

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
