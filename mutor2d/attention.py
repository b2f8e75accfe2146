"""Attention backends over a token-visibility rule.

The rule (DESIGN.md 1.4, stated without registers): every token has a *key rank* and a *query
limit*. Query q sees key k iff ``key_rank[k] <= query_limit[q]`` or ``k == q``.

* Main tokens carry their causal index as both rank and limit: plain causal attention.
* Extra tokens carry rank = NEVER (no one else sees them) and limit = the last main index they may
  read (-1: only themselves).

Because the rule names tokens, not places, the physical order of tokens is free. When the first
``num_main`` tokens are the main block in causal order (the appended layout), the SDPA backend
splits the work: a plain causal kernel for the main block, and for the extra tokens a masked
attention over the main keys merged with their own key. No (L x L) mask is built on that path.

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
    """Appended layout: causal main block + extra tokens over (main prefix, self).

    Extra token e's output is softmax over [scores to main keys with rank <= limit[e], own score].
    Both parts are combined exactly through their log-sum-exp.
    """
    T = vis.num_main
    main = F.scaled_dot_product_attention(q[:, :, :T], k[:, :, :T], v[:, :, :T], is_causal=True)
    if q.shape[2] == T:
        return main
    qe, ke, ve = q[:, :, T:], k[:, :, T:], v[:, :, T:]
    scale = q.shape[-1] ** -0.5
    s_main = torch.matmul(qe, k[:, :, :T].transpose(-1, -2)).float() * scale      # (B,h,E,T)
    allowed = vis.key_rank[:, None, :T] <= vis.query_limit[:, T:, None]            # (B,E,T)
    s_main = s_main.masked_fill(~allowed[:, None], float("-inf"))
    s_self = (qe.float() * ke.float()).sum(-1, keepdim=True) * scale               # (B,h,E,1)
    p = torch.softmax(torch.cat([s_main, s_self], dim=-1), dim=-1)
    extra = torch.matmul(p[..., :T].to(v.dtype), v[:, :, :T]) + p[..., T:].to(v.dtype) * ve
    return torch.cat([main, extra], dim=2)
