"""Whether an update is healthy, judged before it is applied; the same rule for every objective.

Each quantity is judged on its own, against its own recent history (``train.blowup_window`` values,
judged once ``MIN_HISTORY`` are known; ``train.blowup_factor`` 0 turns the finite rules off):

* **nonfinite**: the loss, the gradient norm or the weight norm is not finite. Skipped; counts
  towards the stop (``train.max_nonfinite`` in a row).
* **blowup of the gradient norm** (a spike): the pre-clip gradient norm is above ``factor`` x the
  larger of the ``SPIKE_QUANTILE`` quantile (lower rank) of the last judged gradient norms, applied
  *or skipped*, and ``optim.grad_clip`` (the clip already bounds the step of a gradient up to
  ``factor`` x its norm: the user's scale, the same for every objective). Skipped,
  never a reason to stop: a skipped norm enters the history, so a level the run stays at (a model state
  whose gradients are high for every batch, a kind of batch that is 1 in 10 of the data or more) sets
  the scale within a tenth of the window and trains again; only outliers rarer than that are dropped.
* **blowup of the weight norm** (a divergence): the norm of the trained weights the update starts
  from is above ``factor`` x its median over the last applied updates (only applied updates move
  it). Exploded weights can give a normal loss (a language model blown up by a huge learning rate
  predicts uniformly: loss ln V, gradient 0); skipping keeps them as they are, so the skips go on and
  the run stops naming its last good checkpoint.

The loss is judged for finiteness only: a high loss is information, and judging the total loss
would drop next-token's hard batches and almost never a register arm's (whose total is dominated by
its steadier register term). The loss is the one of the micro-batch that completes the update,
averaged over processes, and the norms are global, so every process decides alike. The histories
are saved in checkpoints (``state_dict``), so a resumed run is judged from its first update.
"""
from __future__ import annotations

import math
import statistics
from collections import deque

import torch

MIN_HISTORY = 5
SPIKE_QUANTILE = 0.9


class Health:
    """Judge updates by their loss, gradient norm and weight norm (see the module's rule)."""

    def __init__(self, factor: float, window: int, clip: float = 0.0):
        self.factor, self.clip = factor, max(clip, 0.0)      # clip: optim.grad_clip (0: no clipping)
        self.history = {k: deque(maxlen=window) for k in ("grad_norm", "weight_norm")}
        self.last: str | None = None        # why the last update was skipped; None if it was applied
        self.fatal = False                  # the last skip counts towards the stop (nonfinite, weights)
        self.judged: dict = {}              # the last verdict's values, limits and quantity (the skip record)

    def judge(self, loss: torch.Tensor, grad_norm: torch.Tensor, acc=None,
              weight_norm: torch.Tensor | None = None) -> str | None:
        """None (apply the update) or the reason to skip it: "nonfinite" / "blowup"."""
        if acc is not None and acc.num_processes > 1:
            loss = acc.reduce(loss.detach().float().reshape(1), reduction="mean")
        values = {"loss": float(loss), "grad_norm": float(grad_norm)}
        if weight_norm is not None:
            values["weight_norm"] = float(weight_norm)
        limits = self.limits()
        bad = [k for k, v in values.items() if not math.isfinite(v)]
        over = [k for k in ("weight_norm", "grad_norm")
                if k in values and k in limits and values[k] > limits[k]]
        quantity = next(iter(bad + over), None)             # the quantity judged unhealthy, if any
        self.last = "nonfinite" if bad else "blowup" if over else None
        self.fatal = self.last == "nonfinite" or quantity == "weight_norm"
        self.judged = {"values": values, "limits": limits, "quantity": quantity}
        if not bad:
            self.history["grad_norm"].append(values["grad_norm"])
            if self.last is None and "weight_norm" in values:
                self.history["weight_norm"].append(values["weight_norm"])
        return self.last

    def limits(self) -> dict:
        """The largest healthy value of each judged quantity now (absent: not judged yet, or off)."""
        out = {}
        grads, weights = sorted(self.history["grad_norm"]), self.history["weight_norm"]
        if self.factor and len(grads) >= MIN_HISTORY:
            out["grad_norm"] = self.factor * max(grads[int(SPIKE_QUANTILE * (len(grads) - 1))], self.clip)
        if self.factor and len(weights) >= MIN_HISTORY and statistics.median(weights) > 0:
            out["weight_norm"] = self.factor * statistics.median(weights)
        return out

    def state_dict(self) -> dict:
        """The histories: a list of values per quantity (a checkpoint part: mutor2d.checkpoint.state)."""
        return {k: list(v) for k, v in self.history.items()}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's histories (their most recent ``window`` values); quantities it lacks start empty."""
        self.history = {k: deque(state.get(k, []), maxlen=past.maxlen) for k, past in self.history.items()}
