"""The visibility of extra (register) tokens, the one rule that training (mutor2d.objectives.layout), the
KV-cached decoder (model.cache) and the text decoder (mutor2d.lm.speculative) attend under: E extra
tokens after the regular ones, each reading the keys ranked up to its limit and itself; no query
sees an extra token."""
from __future__ import annotations

import torch
from torch import Tensor

from .attention import NEVER, Visibility


def register_visibility(key_rank: Tensor, query_limit: Tensor, register_limit: Tensor,
                        own_key: Tensor | None = None, num_regular: int | None = None,
                        earlier_registers: bool = False) -> Visibility:
    """The rule over regular keys ranked ``key_rank`` (B, Lk), regular queries limited by ``query_limit``
    (B, Lq), then E registers (keys and queries): register e sees the keys ranked <= ``register_limit``
    (B, E) (-1: none) and itself, and ranks NEVER. ``earlier_registers``: it also sees the registers
    with a smaller limit (the second pair; padding, limit -1, is seen by none). ``own_key`` (B, Lq + E):
    each query's own key in a cached step; ``num_regular``: the leading causal block (attention.Visibility)."""
    B, E = register_limit.shape
    never = torch.full((B, E), NEVER, device=register_limit.device)
    vis = Visibility(torch.cat([key_rank, never], 1), torch.cat([query_limit, register_limit], 1), num_regular, own_key)
    if earlier_registers:
        real = register_limit >= 0
        vis.extra_rank = torch.cat([torch.full_like(key_rank, NEVER), torch.where(real, register_limit, NEVER)], 1)
        vis.extra_limit = torch.cat([torch.full_like(query_limit, -1),
                                     torch.where(real, register_limit - 1, -1)], 1)
    return vis
