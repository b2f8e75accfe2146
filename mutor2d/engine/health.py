"""Whether an update is healthy, judged before it is applied.

Rule: an update is skipped when its loss, gradient norm or weight norm is not finite ("nonfinite"), or
when one of them exceeds ``train.blowup_factor`` x its median over the last ``train.blowup_window``
healthy updates ("blowup", a finite divergence; judged once ``MIN_HISTORY`` healthy updates are known;
factor 0 = off). A loss under ``LOSS_FLOOR`` nats is a near-perfect fit, never a divergence: such an
update is judged on its weight norm only (a model fine-tuned from a base that already fits its data
sits at losses near 1e-5, where a batch 100x the median, and its gradient, are noise). The weight
norm is the one of the trained parameters the update starts from: it catches an exploded update
whose weights still give a normal loss (a language model blown up by a huge learning rate predicts
uniformly, loss ln V and gradient 0). The loss is the one of the micro-batch
that completes the update, averaged over processes, and the norms are global (gradients before
clipping), so every process decides alike. The history is saved in
checkpoints (``state_dict``), so a resumed run is judged from its first update.
"""
from __future__ import annotations

import math
import statistics
from collections import deque

import torch

MIN_HISTORY = 5
LOSS_FLOOR = 0.05           # nats per token
KEYS = ("loss", "grad_norm", "weight_norm")


class Health:
    """Judge updates by their loss, gradient norm and weight norm against the recent healthy ones."""

    def __init__(self, factor: float, window: int):
        self.factor = factor
        self.history = {k: deque(maxlen=window) for k in KEYS}
        self.last: str | None = None        # why the last update was skipped; None if it was applied

    def judge(self, loss: torch.Tensor, grad_norm: torch.Tensor, acc=None,
              weight_norm: torch.Tensor | None = None) -> str | None:
        """None (apply the update, remember its values) or the reason to skip it: "nonfinite"/"blowup"."""
        if acc is not None and acc.num_processes > 1:
            loss = acc.reduce(loss.detach().float().reshape(1), reduction="mean")
        values = {"loss": float(loss), "grad_norm": float(grad_norm)}
        if weight_norm is not None:
            values["weight_norm"] = float(weight_norm)
        self.last = self._verdict(values)
        if self.last is None:
            for k, v in values.items():
                self.history[k].append(v)
        return self.last

    def _verdict(self, values: dict) -> str | None:
        if not all(math.isfinite(v) for v in values.values()):
            return "nonfinite"
        judged = ("weight_norm",) if values["loss"] < LOSS_FLOOR else KEYS
        for k in judged:
            past, v = self.history[k], values.get(k)
            if v is not None and self.factor and len(past) >= MIN_HISTORY and v > self.factor * statistics.median(past) > 0:
                return "blowup"
        return None

    def state_dict(self) -> dict:
        """The history: a list of values per key (a checkpoint part: mutor2d.checkpoint.state)."""
        return {k: list(v) for k, v in self.history.items()}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's history (its most recent ``window`` values); keys it lacks start empty."""
        self.history = {k: deque(state.get(k, []), maxlen=past.maxlen) for k, past in self.history.items()}


class SkipWatch:
    """Blow-up skips over the last ``window`` updates. A guard that judges against applied updates only
    can starve one kind of batch: when batches differ in kind (mixed data grouped by length), one kind's
    loss can sit above ``factor`` x the median of the other's for good, and every batch of it is skipped
    without ever entering the history; the logged loss (applied updates) hides it."""
    SHARE = 0.2          # warn when at least this share of a full window was skipped as blow-ups

    def __init__(self, factor: float, window: int):
        self.factor, self.recent = factor, deque(maxlen=window)

    def observe(self, skipped_blowup: bool) -> str | None:
        """Record one update; at SHARE of a full window, the one-line warning (and the count starts over)."""
        self.recent.append(skipped_blowup)
        count, window = sum(self.recent), self.recent.maxlen
        if len(self.recent) < window or count < self.SHARE * window:
            return None
        self.recent.clear()
        return (f"the blow-up guard skipped {count} of the last {window} updates (train.blowup_factor="
                f"{self.factor:g}): if batches differ in kind (mixed data, train.group_by_length), one kind may "
                f"never train; raise train.blowup_factor or set it to 0")
