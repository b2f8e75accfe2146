"""The per-token sampling rules, on float32 logits of one position.

  1. classifier-free guidance (class prefixes only): one forward over [cond; uncond] rows where
     the uncond half uses the null prefix, logits = u + s·(c − u);
  2. temperature: logits / T; T == 0 means greedy decoding (argmax; top-k/top-p are moot);
  3. top-k: keep the k largest logits (0 = off);
  4. top-p: keep the smallest set of most likely tokens whose probability mass reaches p (1 = off);
  5. draw one token from the softmax with ``generator`` (the only source of randomness).
Every decoding mode applies the same rules (speculative modes to draft and target alike). The
settings are checked where they enter (``config.check_sampling``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def guide(cond: Tensor, uncond: Tensor, scale: float) -> Tensor:
    """Classifier-free guidance on logits: u + s·(c − u)."""
    return uncond + scale * (cond - uncond)


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """logits (..., V) -> copy with the tokens outside top-k / the top-p nucleus set to -inf.

    top-p keeps, in order of decreasing probability, every token whose predecessors' mass is
    still below p (so the most likely token always survives and the kept mass is >= p)."""
    out = logits
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def draw(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One token per row of ``probs`` (..., V) -> (...,) long, drawn with ``generator``."""
    flat = probs.reshape(-1, probs.shape[-1])
    at = generator.device if generator is not None else flat.device      # drawn where the generator lives
    return torch.multinomial(flat.to(at), 1, generator=generator).to(flat.device).view(probs.shape[:-1])


def sample_logits(logits: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  generator: torch.Generator | None = None) -> Tensor:
    """logits (B, V) -> tokens (B,). temperature 0 = greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = filter_logits(logits.float() / temperature, top_k, top_p).softmax(-1)
    return draw(probs, generator)


@dataclass(frozen=True)
class SamplingRules:
    """The per-token rules of one run (checked settings). ``guided``: the model runs [cond; uncond]
    rows (CFG)."""
    cfg_scale: float = 1.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    guided: bool = False

    @classmethod
    def of(cls, cfg_scale: float = 1.0, temperature: float = 1.0, top_k: int = 0,
           top_p: float = 1.0) -> "SamplingRules":
        """The rules of checked settings; guidance is on when the scale is not 1."""
        return cls(cfg_scale, temperature, top_k, top_p, guided=cfg_scale != 1.0)

    @property
    def greedy(self) -> bool:
        """Temperature 0: every token is the argmax."""
        return self.temperature == 0

    def combine(self, logits: Tensor) -> Tensor:
        """Model logits (rows, ..., V) -> the logits the rules sample from (B, ..., V)."""
        if not self.guided:
            return logits
        B = logits.shape[0] // 2
        return guide(logits[:B], logits[B:], self.cfg_scale)

    def probs(self, logits: Tensor) -> Tensor:
        """Combined logits (..., V) -> the distribution each token is drawn from (..., V);
        greedy: one-hot at the argmax."""
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        return filter_logits(logits.float() / self.temperature, self.top_k, self.top_p).softmax(-1)
