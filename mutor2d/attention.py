"""Attention backends over a token-visibility rule.

The rule (DESIGN.md 1.4, stated without registers): every token has a *key rank* and a *query
limit*. Query q sees key k iff ``key_rank[k] <= query_limit[q]`` or ``k == q``.

* Main tokens carry their causal index as both rank and limit: plain causal attention.
* Extra tokens carry rank = NEVER (no one else sees them) and limit = the last main index they may
  read (-1: only themselves).

Because the rule names tokens, not places, the physical order of tokens is free. When the first
``num_main`` tokens are the main block in causal order (the appended layout), the SDPA backend
splits the work: a plain causal kernel for the main block, and one SDPA call for the E extra
queries over all keys with a (B, 1, E, L) boolean mask (main keys up to the limit, plus the
diagonal). No (L x L) mask and no float score tensor is ever built on that path, and backward
keeps only the fused kernel's O(E) statistics.

Backends: "sdpa" (torch's scaled_dot_product_attention) and "flex" (FlexAttention with a block mask
built once per forward pass; compiled on CUDA).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

NEVER = 1 << 30  # key rank of tokens nobody else may see


@dataclass
class Visibility:
    """key_rank, query_limit: (B, L) long. num_main: size of a leading causal main block, or None."""
    key_rank: Tensor
    query_limit: Tensor
    num_main: int | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def length(self) -> int:
        return self.key_rank.shape[1]

    def dense_mask(self) -> Tensor:
        """(B, 1, L, L) bool, True = may attend."""
        m = self.key_rank[:, None, :] <= self.query_limit[:, :, None]
        eye = torch.eye(self.length, dtype=torch.bool, device=m.device)
        return (m | eye).unsqueeze(1)

    def mask_mod(self):
        """FlexAttention mask_mod implementing the rule."""
        rank, limit = self.key_rank, self.query_limit

        def mask_mod(b, h, q, k):
            return (rank[b, k] <= limit[b, q]) | (q == k)
        return mask_mod

    def block_mask(self):
        """FlexAttention BlockMask, built once and reused by every layer."""
        if "block_mask" not in self._cache:
            from torch.nn.attention.flex_attention import create_block_mask
            B, L = self.key_rank.shape
            self._cache["block_mask"] = create_block_mask(
                self.mask_mod(), B, None, L, L, device=self.key_rank.device)
        return self._cache["block_mask"]

    def extra_mask(self) -> Tensor:
        """(B, 1, L - num_main, L) bool rows of the extra tokens (True = may attend); built once
        and reused by every layer."""
        if "extra_mask" not in self._cache:
            T, L = self.num_main, self.length
            m = self.key_rank[:, None, :] <= self.query_limit[:, T:, None]
            own = torch.arange(L, device=m.device) == torch.arange(T, L, device=m.device)[:, None]
            self._cache["extra_mask"] = (m | own).unsqueeze(1)
        return self._cache["extra_mask"]

    def permute(self, order: Tensor) -> "Visibility":
        """The same rule on tokens reordered by ``order`` (B, L); no fast path after it."""
        return Visibility(self.key_rank.gather(1, order), self.query_limit.gather(1, order), None)


def resolve_backend(name: str, device: torch.device) -> str:
    if name == "auto":
        return "flex" if device.type == "cuda" else "sdpa"
    if name not in ("sdpa", "flex"):
        raise ValueError(f"attention backend {name!r}: expected 'auto', 'sdpa' or 'flex'")
    return name


@functools.lru_cache(maxsize=None)
def _flex(compiled: bool):
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention, dynamic=False) if compiled else flex_attention


def attend(q: Tensor, k: Tensor, v: Tensor, vis: Visibility | None, backend: str,
           dropout_p: float = 0.0) -> Tensor:
    """q, k, v: (B, heads, L, head_dim) -> (B, heads, L, head_dim). ``vis`` None = causal."""
    if backend == "flex":
        if dropout_p:
            raise ValueError("model.attention=flex does not support attention dropout; use sdpa")
        if q.device.type == "cpu" and torch.is_grad_enabled() and q.requires_grad:
            raise ValueError("model.attention=flex has no backward pass on CPU (a torch limit); "
                             "train with model.attention=sdpa on CPU")
        if vis is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return _flex(q.is_cuda)(q, k, v, block_mask=vis.block_mask())
    if vis is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    if vis.num_main is not None and not dropout_p:
        return _split_attend(q, k, v, vis)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=vis.dense_mask(), dropout_p=dropout_p)


def _split_attend(q: Tensor, k: Tensor, v: Tensor, vis: Visibility) -> Tensor:
    """Appended layout: causal main block, then the extra queries over (main prefix, self)."""
    T = vis.num_main
    main = F.scaled_dot_product_attention(q[:, :, :T], k[:, :, :T], v[:, :, :T], is_causal=True)
    if q.shape[2] == T:
        return main
    extra = F.scaled_dot_product_attention(q[:, :, T:], k, v, attn_mask=vis.extra_mask())
    return torch.cat([main, extra], dim=2)
