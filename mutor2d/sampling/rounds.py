"""The decode round and its loop: one decoder for images and text, plain and speculative alike.

A ``Step`` is a model over a batch with its KV cache (``decoding.GPTStep``, ``lm.speculative.HFStep``);
a drafter proposes each round's drafts (``drafters``; plain decoding: none, K = 0). One round, per row
with n body tokens emitted: regular inputs [x_{n-1}, d_n, ..., d_{n+K-1}] from regular index P+n-1,
then the drafter's registers (``Extras``); regular output j gives the target distribution p_j of body
token n+j; the speculative rule (``verification``) verifies the drafts, the step keeps the kept inputs
(``commit``) and the drafter proposes from the same forward. Every token follows plain sampling's
distribution and greedy decoding gives plain greedy's tokens. A row is done at N tokens (``Ends``;
text: also EOS, stop strings) and then repeats its last input, ignored, or leaves the batch.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from ..objectives.layout import position_at
from . import verification
from .rules import SamplingRules
from .stats import DecodeStats
from .verification import emitted, pick, reached

# a decoder's progress callback: (bodies (B, N) being filled, tokens emitted so far (B,))
Progress = Callable[[Tensor, Tensor], None]


@dataclass
class Frame:
    """Where a batch's tokens sit: regular inputs 0..P-1 are the prefix, P + t body token x_t of the
    ``grid`` (H, W) (text: (1, max_new_tokens)); ``positions`` the id of every regular input, (L, 2) or
    (B, L, 2) per row, L >= P + N + K; ``room`` (B,): body tokens with a position (None: all N)."""
    grid: tuple[int, int]
    P: int
    positions: Tensor
    room: Tensor | None = None

    @property
    def N(self) -> int:
        return self.grid[0] * self.grid[1]

    def holds(self, target: Tensor) -> Tensor:
        """(B, ...) bool: body indices ``target`` (B, ...) that a row can emit."""
        ok = target < self.N
        return ok if self.room is None else ok & (target < self.room.view(-1, *[1] * (target.dim() - 1)))

    def select(self, index: Tensor) -> "Frame":
        """The rows ``index`` (b',) (only a frame with positions and room per row has rows to leave)."""
        return Frame(self.grid, self.P, self.positions[index], self.room[index])


@dataclass
class Extras:
    """The registers a forward adds after its regular inputs, A inputs carrying K each (E = A·K,
    input-major): ``positions`` (B, E, 2) their position ids, ``reads`` (B, E) the regular input of
    this forward each one reads up to (its anchor; it also sees itself), ``valid`` (B, A, K) which
    of them have a target."""
    positions: Tensor
    reads: Tensor
    valid: Tensor


@dataclass
class Round:
    """A forward as a drafter reads it: the ``step``'s outputs ``out`` (B, R + E, ·) (R regular inputs,
    then the registers of ``extras``), p (B, R, V) the regular outputs' target distributions, ``kept``
    (B,), ``n`` (B,) tokens each row holds now, ``bodies`` (B, N + K + 1) the tokens emitted. The
    prefill's round: its last prefix input (R = 1), nothing kept."""
    step: "Step"
    out: Tensor
    p: Tensor
    kept: Tensor
    n: Tensor
    bodies: Tensor
    extras: Extras | None
    frame: Frame
    rules: SamplingRules
    generator: torch.Generator | None = None


class Step(Protocol):
    """A model over a batch of ``batch`` rows being decoded, with its KV cache."""
    batch: int

    def prefill(self, extras: Extras | None) -> Tensor:
        """The prefix it was made with, then ``extras`` -> outputs (B, P + E, ·)."""

    def forward(self, tokens: Tensor, index: int | Tensor, positions: Tensor, extras: Extras | None) -> Tensor:
        """Regular inputs ``tokens`` (B, R) from regular index ``index`` (int or (B,)) at ``positions``
        (B, R, 2), then ``extras`` -> outputs (B, R + E, ·)."""

    def logits(self, out: Tensor) -> Tensor:
        """Outputs (..., ·) -> logits (..., V)."""

    def commit(self, kept: Tensor, active: Tensor) -> None:
        """Each row keeps its first kept + 1 (B,) regular inputs of the forward (none if not ``active``)."""

    def select(self, index: Tensor) -> None:
        """Only the rows ``index`` (b',) stay (only where rows leave the batch)."""


class Ends:
    """When a row is done: at N body tokens (images). The text decoder's adds EOS, stop strings, done
    rows leaving the batch and processes decoding together (mutor2d.lm.speculative.TextEnds)."""
    leaves = False        # done rows leave the batch (else they stay, repeating their last input)

    def __init__(self, N: int, K: int):
        self.N, self.sure = N, math.ceil((N - 1) / (K + 1))   # before round ``sure`` no row can be done

    def emit(self, rows: Tensor, tokens: Tensor, count: Tensor, n: Tensor) -> Tensor:
        """The first ``count`` (b,) ``tokens`` (b, ·) of batch rows ``rows``, now ``n`` long -> which go on."""
        return n < self.N

    def more(self, active: Tensor, rounds: int) -> bool:
        """Whether a round follows ``rounds`` of them (surely, with no host sync, before round ``sure``)."""
        return rounds < self.sure or bool(active.any())


@torch.no_grad()
def decode(step: Step, drafter, frame: Frame, rules: SamplingRules, generator=None, stats: DecodeStats | None = None,
           ends: Ends | None = None, progress: Progress | None = None) -> Tensor:
    """Decode the batch of ``step`` until every row is done -> bodies (B, N), the tokens each row
    emitted (the rows still in the batch); ``stats`` receives the counts but the tokens (the caller's)."""
    B, K, P, N = step.batch, drafter.K, frame.P, frame.N
    ends, dev = ends or Ends(N, K), frame.positions.device
    out = torch.zeros(B, N + K + 1, dtype=torch.long, device=dev)
    n, rows = torch.ones(B, dtype=torch.long, device=dev), torch.arange(B, device=dev)
    extras = drafter.prefix_extras(frame, B)
    logits = step.prefill(extras)[:, P - 1:]
    p = rules.probs(step.logits(logits[:, :1]))
    out[:, 0] = pick(p[:, 0], rules.greedy, generator)
    drafts = drafter.first(Round(step, logits, p, n - 1, n, out, extras, frame, rules, generator))
    stats, j = stats if stats is not None else DecodeStats(), torch.arange(K + 1, device=dev)
    stats.add_plain(B, 0, 1, B)
    active, r = ends.emit(rows, out[:, :1], n, n), 0
    while ends.more(active, r):
        if ends.leaves and not bool(active.all()):
            keep = active.nonzero()[:, 0]
            step.select(keep)
            frame, drafts = frame.select(keep), drafts.select(keep)
            out, n, rows, active = out[keep], n[keep], rows[keep], active[keep]
        cur = n.clamp(max=N - 1)                           # done rows repeat their last input
        index = P + cur - 1                                # the regular index of x_{cur-1}
        tokens = torch.cat([out.gather(1, (cur - 1)[:, None]), drafts.tokens], 1)
        extras = drafter.extras(frame, cur)
        at = P + r if K == 0 else index                    # no drafts: the rows advance together (no host sync)
        logits = step.forward(tokens, at, position_at(frame.positions, index[:, None] + j), extras)
        p = rules.probs(step.logits(logits[:, :K + 1]))
        kept, token, lead = verification.verify(p, drafts, generator)
        step.commit(kept, active)
        stats.add_round(active, reached(lead, drafts.valid), lead, drafts.register)
        count, new = torch.where(active, kept + 1, 0), emitted(drafts.tokens, kept, token)
        out.scatter_(1, torch.where(j < count[:, None], n[:, None] + j, N + K), new)
        n = torch.where(active, (n + count).clamp(max=N), n)
        active = ends.emit(rows, new, count, n)
        drafts = drafter.propose(Round(step, logits, p, kept, n, out, extras, frame, rules, generator))
        r += 1
        if progress is not None:
            progress(out[:, :N], n)
    return out[:, :N]
