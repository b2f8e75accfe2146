"""The decode cache's steps: which cache entries a cached decode step (GPT.decode) writes and reads;
its extra (register) tokens read the cache under the training rule (extras.register_visibility) and
are never written to it."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .attention import Visibility
from .extras import register_visibility


@dataclass
class CacheStep:
    """One cached decode step. ``start``: cache index of the first new regular token (int, (B,) long
    per row, or a 0-dim long tensor: one index on the device, see ``fixed_step``); ``num_regular``: R new regular tokens, written to the cache; ``end``: how
    many cache entries the step reads (start + R, the largest over rows); ``vis``: the rule over
    the keys [cache[:end], keys of the extra tokens], or None (no extra tokens, one int start:
    causal attention of the new tokens)."""
    start: int | Tensor
    num_regular: int
    end: int
    vis: Visibility | None = None

    def write(self, cache: Tensor, new: Tensor) -> Tensor:
        """Write ``new[:, :, :R]`` (B, heads, L, head_dim) into ``cache`` at ``start``; return
        the keys (or values) the step reads: [cache[:end], new[:, :, R:]]."""
        B, R = new.shape[0], self.num_regular
        if isinstance(self.start, int):
            cache[:B, :, self.start:self.start + R] = new[:, :, :R]
        elif self.start.dim() == 0:                # one start for every row, held on the device (fixed_step)
            cache[:B].index_copy_(2, self.start + torch.arange(R, device=new.device), new[:, :, :R])
        else:
            idx = (self.start[:, None] + torch.arange(R, device=new.device))[:, None, :, None]
            cache[:B].scatter_(2, idx.expand(-1, new.shape[1], -1, new.shape[3]), new[:, :, :R])
        read = cache[:B, :, :self.end]
        return read if new.shape[2] == R else torch.cat([read, new[:, :, R:]], dim=2)


def extra_step(B: int, R: int, start: int | Tensor, extra_limit: Tensor | None, device) -> CacheStep:
    """The CacheStep of a decode with per-row starts and/or extra tokens."""
    start = torch.as_tensor(start, dtype=torch.long, device=device).expand(B).contiguous()
    end = int(start.max()) + R
    limit = torch.zeros(B, 0, dtype=torch.long, device=device) if extra_limit is None else extra_limit
    E = limit.shape[1]
    regular = start[:, None] + torch.arange(R, device=device)                   # (B, R)
    own = torch.cat([regular, (end + torch.arange(E, device=device)).expand(B, E)], dim=1)
    vis = register_visibility(torch.arange(end, device=device).expand(B, end), regular, limit, own, R)
    return CacheStep(start, R, end, vis)


def fixed_step(B: int, length: int, index: Tensor) -> CacheStep:
    """A step of fixed shapes (what a CUDA graph replays): one new regular token per row, written at cache
    index ``index`` (0-dim long, on the device), reading the whole cache of ``length`` entries under the
    rule "keys 0..index" (the entries after it, stale or zero, are masked)."""
    limit = index.view(1, 1).expand(B, 1)
    return CacheStep(index, 1, length, Visibility(torch.arange(length, device=index.device).expand(B, length),
                                                  limit, None, limit))
