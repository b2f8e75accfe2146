"""Attention backends over a token-visibility rule.

The rule: every key has a *rank* and every query a *limit*. Query q sees key k iff
``key_rank[k] <= query_limit[q]`` or k is q's own key.

* Regular tokens carry their causal index as both rank and limit: plain causal attention.
* Extra tokens (registers) carry rank = NEVER (nobody else sees them) and limit = the last
  regular index they may read (-1: only themselves).
* Optionally a second pair, used only among extra tokens: q also sees k iff
  ``extra_rank[k] <= extra_limit[q]`` (regular tokens: extra rank NEVER, extra limit -1). With it a
  register sees the registers anchored before its own (``objective.register_visibility``).

Because the rule names tokens, not places, the physical order of tokens is free. When the first
``num_regular`` tokens are the regular block in causal order (the appended layout), the SDPA
backend splits the work: a plain causal kernel for the regular block, and one SDPA call for the E
extra queries over all keys with a (B, 1, E, L) boolean mask. No (L x L) mask and no float score
tensor is built on that path.

Cached decoding: the new queries are R regular tokens (their keys go to the KV cache) followed by
E extra tokens (their keys never do). The keys are [cache[:end], extra keys]; a Visibility over
them says who sees what, with ``own_key`` giving each query's own key index.

A backend is an object with ``prepare``, ``attend`` (full forward) and ``attend_cached`` (decode
step); ``BACKENDS`` maps names to backends and ``resolve_backend`` turns ``auto`` into one per device.
A backend class registers itself with ``@register_backend(NAME)`` in any module (this one imports no
backend module, so no import order matters); a plugin's module is imported through MUTOR2D_PLUGINS.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

NEVER = 1 << 30  # key rank of tokens nobody else may see


@dataclass
class Visibility:
    """key_rank (B, Lk) and query_limit (B, Lq) long. num_regular: size of a leading causal
    regular block (same sequence for queries and keys), or None. own_key (B, Lq) long: index
    of each query's own key; None = the query's own index (queries and keys are one sequence).
    extra_rank (B, Lk) / extra_limit (B, Lq) long: the optional second pair (module doc), None = none."""
    key_rank: Tensor
    query_limit: Tensor
    num_regular: int | None = None
    own_key: Tensor | None = None
    extra_rank: Tensor | None = None
    extra_limit: Tensor | None = None
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def length(self) -> int:
        return self.key_rank.shape[1]

    def _own(self, device) -> Tensor:
        if self.own_key is not None:
            return self.own_key
        return torch.arange(self.query_limit.shape[1], device=device)[None]

    def _seen(self, rows: slice = slice(None)) -> Tensor:
        """(B, Lq', Lk) bool for the queries ``rows``: key rank <= query limit, or the second pair."""
        m = self.key_rank[:, None, :] <= self.query_limit[:, rows, None]
        if self.extra_rank is not None:
            m = m | (self.extra_rank[:, None, :] <= self.extra_limit[:, rows, None])
        return m

    def dense_mask(self) -> Tensor:
        """(B, 1, Lq, Lk) bool, True = may attend; built once and reused by every layer."""
        if "dense" not in self._cache:
            m = self._seen()
            keys = torch.arange(self.length, device=m.device)
            self._cache["dense"] = (m | (keys == self._own(m.device)[..., None])).unsqueeze(1)
        return self._cache["dense"]

    def mask_mod(self):
        """FlexAttention mask_mod implementing the rule (queries and keys one sequence)."""
        rank, limit = self.key_rank, self.query_limit
        extra_rank, extra_limit = self.extra_rank, self.extra_limit

        def mask_mod(b, h, q, k):
            seen = (rank[b, k] <= limit[b, q]) | (q == k)
            return seen if extra_rank is None else seen | (extra_rank[b, k] <= extra_limit[b, q])
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
        """(B, 1, L - num_regular, L) bool rows of the extra tokens (True = may attend); built
        once and reused by every layer."""
        if "extra_mask" not in self._cache:
            T, L = self.num_regular, self.length
            m = self._seen(slice(T, None))
            own = torch.arange(L, device=m.device) == torch.arange(T, L, device=m.device)[:, None]
            self._cache["extra_mask"] = (m | own).unsqueeze(1)
        return self._cache["extra_mask"]

    def permute(self, order: Tensor) -> "Visibility":
        """The same rule on tokens reordered by ``order`` (B, L); no fast path after it."""
        pair = [None if x is None else x.gather(1, order) for x in (self.extra_rank, self.extra_limit)]
        return Visibility(self.key_rank.gather(1, order), self.query_limit.gather(1, order), None, None, *pair)


def causal_rule(batch: int, length: int, device=None) -> Visibility:
    """Plain causal attention over ``length`` regular tokens, as an explicit rule."""
    i = torch.arange(length, device=device).expand(batch, length)
    return Visibility(i, i)


def open_prefix(vis: Visibility, prefix_len: int | Tensor) -> Visibility:
    """``vis`` with bidirectional attention inside the prefix: a query whose own key has rank < P sees
    every key of rank < P (so a prompt token sees the whole prompt, padding excluded, since padding
    is never seen). Nothing else changes: body tokens stay causal, registers keep their limits (an
    anchor at or after the last prefix token already sees the whole prefix), no one sees a register.
    The rule has no causal block left, so no split fast path. ``prefix_len``: one P for every row, or
    (B,) long, a P per row (right-padded rows of different prompt lengths)."""
    P = prefix_len[:, None] if isinstance(prefix_len, Tensor) else prefix_len
    own = vis.key_rank.gather(1, vis._own(vis.key_rank.device).expand_as(vis.query_limit))
    limit = torch.where(own < P, vis.query_limit.clamp(min=P - 1), vis.query_limit)
    return Visibility(vis.key_rank, limit, None, vis.own_key, vis.extra_rank, vis.extra_limit)


def cached_causal(q: Tensor, keys: Tensor, values: Tensor, start: int) -> Tensor:
    """New regular queries at cache indices start..start+L-1 over the cache ``keys[:start+L]``."""
    L = q.shape[2]
    if L == 1:
        return F.scaled_dot_product_attention(q, keys, values)
    qi = torch.arange(start, start + L, device=q.device)[:, None]
    mask = torch.arange(keys.shape[2], device=q.device)[None, :] <= qi
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


class Backend(Protocol):
    """q, k, v: (B, heads, L, head_dim) -> (B, heads, L, head_dim)."""

    def prepare(self, vis: Visibility | None, dropout_p: float = 0.0) -> None:
        """Build (and cache in ``vis``) the masks ``attend`` will read, before the layers run:
        outside a compiled block, so every block sees the same cache state (one graph)."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, vis: Visibility | None,
               dropout_p: float = 0.0) -> Tensor:
        """Full forward; ``vis`` None = causal."""

    def attend_cached(self, q: Tensor, keys: Tensor, values: Tensor, start: int,
                      vis: Visibility | None) -> Tensor:
        """Decode step: the L new queries over ``keys`` (B, heads, Lk, head_dim) =
        [cache[:end], keys of extra tokens]. ``vis`` None: the new queries are regular tokens at
        cache indices start.. and attend causally (no extra tokens); else ``vis`` decides."""


BACKENDS: dict[str, Backend] = {}


def register_backend(name: str):
    """Class decorator: one instance of the class becomes the backend ``model.attention: NAME``."""
    def add(cls):
        BACKENDS[name] = cls()
        return cls
    return add


@register_backend("sdpa")
class SdpaBackend:
    """torch's scaled_dot_product_attention; split regular/extra fast path (see module doc)."""

    def prepare(self, vis, dropout_p=0.0):
        if vis is None:
            return
        if vis.num_regular is not None and not dropout_p:
            vis.extra_mask()
        else:
            vis.dense_mask()

    def attend(self, q, k, v, vis, dropout_p=0.0):
        if vis is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
        if vis.num_regular is not None and not dropout_p:
            return _split_attend(q, k, v, vis)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=vis.dense_mask(), dropout_p=dropout_p)

    def attend_cached(self, q, keys, values, start, vis):
        if vis is None:
            return cached_causal(q, keys, values, start)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=vis.dense_mask())


@register_backend("flex")
class FlexBackend(SdpaBackend):
    """FlexAttention with a block mask built once per forward pass (compiled on CUDA). Decode
    steps are a few queries: they use the SDPA path."""

    def prepare(self, vis, dropout_p=0.0):
        if vis is not None:
            vis.block_mask()

    def attend(self, q, k, v, vis, dropout_p=0.0):
        if dropout_p:
            raise ValueError("model.attention=flex does not support attention dropout; use sdpa")
        if q.device.type == "cpu" and torch.is_grad_enabled() and q.requires_grad:
            raise ValueError("model.attention=flex has no backward pass on CPU (a torch limit); "
                             "train with model.attention=sdpa on CPU")
        if vis is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return _flex(q.is_cuda)(q, k, v, block_mask=vis.block_mask())


def resolve_backend(name: str, device: torch.device) -> str:
    """``auto`` -> flex on CUDA, sdpa elsewhere; any other name must be in BACKENDS."""
    if name == "auto":
        return "flex" if device.type == "cuda" else "sdpa"
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r}: expected 'auto' or one of {sorted(BACKENDS)} (a plugin's "
                         f"backend needs its module in MUTOR2D_PLUGINS)")
    return name


def get_backend(name: str, device: torch.device) -> Backend:
    return BACKENDS[resolve_backend(name, device)]


# Off CUDA, flex_attention runs eager even inside a compiled block (a graph break around it):
# inductor's CPU FlexAttention kernel (torch 2.14.1, found on AVX2) gives wrong outputs, often NaN,
# when the last key block is 8 (mod 16) keys long, e.g. L=24 or 200. Its micro-GEMM for that tail
# of q @ k.T computes a full 16 columns: it reads keys past the block and writes past each row of
# the score buffer, the last row into the running row maxima. tests/test_compile.py checks
# compiled against eager blocks, and that the bare compiled kernel is still wrong.
@functools.lru_cache(maxsize=None)
def _flex(compiled: bool):
    """flex_attention compiled on its own (CUDA), or eager and never compiled (other devices)."""
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention, dynamic=False) if compiled else torch.compiler.disable(flex_attention)


def _split_attend(q: Tensor, k: Tensor, v: Tensor, vis: Visibility) -> Tensor:
    """Appended layout: causal regular block, then the extra queries over (regular prefix, self)."""
    T = vis.num_regular
    main = F.scaled_dot_product_attention(q[:, :, :T], k[:, :, :T], v[:, :, :T], is_causal=True)
    if q.shape[2] == T:
        return main
    extra = F.scaled_dot_product_attention(q[:, :, T:], k, v, attn_mask=vis.extra_mask())
    return torch.cat([main, extra], dim=2)
