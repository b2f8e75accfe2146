"""Whether an update is healthy, judged before it is applied.

Rule: an update is skipped when its loss or gradient norm is not finite ("nonfinite"), or when either
exceeds ``train.blowup_factor`` x its median over the last ``train.blowup_window`` healthy updates
("blowup", a finite divergence; judged once ``MIN_HISTORY`` healthy updates are known; factor 0 = off).
The loss is the one of the micro-batch that completes the update, averaged over processes, and the
gradient norm the global one before clipping, so every process decides alike. The history is saved in
checkpoints (``state_dict``), so a resumed run is judged from its first update.
"""
from __future__ import annotations

import math
import statistics
from collections import deque

import torch

MIN_HISTORY = 5


class Health:
    """Judge updates by their loss and gradient norm against the recent healthy ones."""

    def __init__(self, factor: float, window: int, state: dict | None = None):
        self.factor = factor
        self.history = {k: deque((state or {}).get(k, []), maxlen=window) for k in ("loss", "grad_norm")}
        self.last: str | None = None        # why the last update was skipped; None if it was applied

    def judge(self, loss: torch.Tensor, grad_norm: torch.Tensor, acc=None) -> str | None:
        """None (apply the update, remember its values) or the reason to skip it: "nonfinite"/"blowup"."""
        if acc is not None and acc.num_processes > 1:
            loss = acc.reduce(loss.detach().float().reshape(1), reduction="mean")
        values = {"loss": float(loss), "grad_norm": float(grad_norm)}
        self.last = self._verdict(values)
        if self.last is None:
            for k, v in values.items():
                self.history[k].append(v)
        return self.last

    def _verdict(self, values: dict) -> str | None:
        if not all(math.isfinite(v) for v in values.values()):
            return "nonfinite"
        for k, v in values.items():
            past = self.history[k]
            if self.factor and len(past) >= MIN_HISTORY and v > self.factor * statistics.median(past) > 0:
                return "blowup"
        return None

    def state_dict(self) -> dict:
        return {k: list(v) for k, v in self.history.items()}
