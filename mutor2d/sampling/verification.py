"""The speculative rule: drafts and their verification, for the one round loop (``rounds``) that
decodes images and text.

One round: the forward after the last emitted token gives the target distributions p_0..p_K of the
next K+1 tokens; drafts d_i ~ q_i are verified left to right: d_i is kept with probability
min(1, p_i(d)/q_i(d)); at the first rejection the token is drawn from normalise(max(p_i - q_i, 0))
and the round ends; if every draft is kept (or none is left) one more token is drawn from the next
p. Each emitted token thus follows p given the tokens before it. Greedy decoding (p and q one-hot)
is the same rule without randomness: a draft is kept while it is p's argmax, and the token after
them is the argmax. Without drafts (K = 0, plain decoding) the token is drawn from p_0.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from .rules import draw


@dataclass
class Drafts:
    """tokens (B, K) long; probs (B, K, V) the distributions q they were drawn from, None for greedy
    drafts (q one-hot at the tokens); valid (B, K) bool (an invalid draft is absent: verification
    stops there); register (B, K) bool (drawn from a register; None = none was)."""
    tokens: Tensor
    probs: Tensor | None
    valid: Tensor
    register: Tensor | None = None

    @classmethod
    def drawn(cls, q: Tensor, valid: Tensor, greedy: bool, generator, register: Tensor | None = None) -> "Drafts":
        """Drafts from the distributions q (B, K, V): their argmaxes when ``greedy``, else draws."""
        return cls(pick(q, greedy, generator), None if greedy else q, valid, register)

    @classmethod
    def none(cls, B: int, K: int, V: int, greedy: bool, device) -> "Drafts":
        """K absent drafts per row (the first round of a decoder whose prefill drafts nothing)."""
        probs = None if greedy else torch.full((B, K, V), 1.0 / V, device=device)
        return cls(torch.zeros(B, K, dtype=torch.long, device=device), probs,
                   torch.zeros(B, K, dtype=torch.bool, device=device))

    def select(self, index: Tensor) -> "Drafts":
        """The drafts of the rows ``index`` (b',)."""
        return Drafts(*(None if (t := getattr(self, f.name)) is None else t[index] for f in fields(self)))


def pick(p: Tensor, greedy: bool, generator) -> Tensor:
    """One token per row of the distributions p (..., V): the argmax when ``greedy``, else a draw."""
    return p.argmax(-1) if greedy else draw(p, generator)


def _uniform(shape, generator, device) -> Tensor:
    gen_device = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=gen_device).to(device)


def verify(p: Tensor, drafts: Drafts, generator) -> tuple[Tensor, Tensor, Tensor]:
    """One round of the rule (module doc): p (B, K+1, V) target distributions, ``drafts`` of K
    (greedy when ``drafts.probs`` is None) -> (kept (B,) drafts kept, token (B,) the token after
    them, lead (B, K) bool which drafts were kept)."""
    B, K1, V = p.shape
    K = K1 - 1
    if K == 0:
        return torch.zeros(B, dtype=torch.long, device=p.device), pick(p[:, 0], drafts.probs is None, generator), \
            drafts.valid
    if drafts.probs is None:
        target = p.argmax(-1)
        lead = (drafts.valid & (drafts.tokens == target[:, :K])).long().cumprod(1).bool()
        kept = lead.sum(1)
        return kept, target.gather(1, kept[:, None])[:, 0], lead
    d = drafts.tokens[..., None]
    p_d = p[:, :K].gather(-1, d)[..., 0]
    q_d = drafts.probs.gather(-1, d)[..., 0]
    ok = drafts.valid & (_uniform((B, K), generator, p.device) * q_d < p_d)   # u < p/q
    lead = ok.long().cumprod(1).bool()
    kept = lead.sum(1)
    at = kept[:, None, None].expand(B, 1, V)
    p_at = p.gather(1, at)[:, 0]
    q_at = torch.cat([drafts.probs, torch.zeros_like(p[:, :1])], 1).gather(1, at)[:, 0]
    rejected = torch.cat([drafts.valid, torch.zeros_like(drafts.valid[:, :1])], 1).gather(1, kept[:, None])
    residual = (p_at - q_at).clamp(min=0)
    mass = residual.sum(-1, keepdim=True)
    dist = torch.where(rejected & (mass > 0), residual / mass.clamp(min=1e-30), p_at)
    return kept, draw(dist, generator), lead


def reached(lead: Tensor, valid: Tensor) -> Tensor:
    """Which drafts verification looked at (B, K) bool: present ones whose predecessors were all kept
    (``lead`` (B, K) from ``verify``)."""
    return torch.cat([torch.ones_like(lead[:, :1]), lead[:, :-1]], 1) & valid


def emitted(tokens: Tensor, kept: Tensor, token: Tensor) -> Tensor:
    """A round's tokens (B, K+1): the drafts ``tokens`` (B, K) with ``token`` (B,) written at column
    ``kept`` (B,); a row emits its first kept + 1."""
    return torch.cat([tokens, token[:, None]], 1).scatter(1, kept[:, None], token[:, None])
