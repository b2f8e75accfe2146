"""Plain decoding: one token per forward pass, in raster order, with a KV cache.

Registers play no part: only the regular next-token pathway runs, so a MuToR checkpoint samples
exactly like an NTP one. Position ids come from ``registers.regular_position_ids`` (the same ids
training uses). The drawn token is fed to both CFG halves.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..registers import regular_position_ids
from .rules import SamplingRules, sample_logits
from .stats import DecodeStats

# a decoder's progress callback: (bodies (B, H*W) being filled, tokens emitted so far: an int for every
# row or (B,) per row); the columns past them hold no tokens yet
Progress = Callable[[Tensor, "int | Tensor"], None]


def with_null_prefix(model, prefix: Tensor, rules: SamplingRules) -> Tensor:
    """[prefix; null prefix] rows when guided, else ``prefix``."""
    if not rules.guided:
        return prefix
    return torch.cat([prefix, model.conditioning.null_prefix(model.cfg, prefix)])


def decode_plain(model, prefix: Tensor, grid: tuple[int, int], rules: SamplingRules, generator,
                 stats: DecodeStats | None = None, progress: Progress | None = None) -> Tensor:
    """Sample bodies (B, H*W) for ``prefix``: one decode call per token; ``progress`` sees each."""
    device = model.output.weight.device
    prefix = prefix.to(device)
    B = prefix.shape[0]
    N = grid[0] * grid[1]
    P = model.prefix_len(prefix)
    prefix = with_null_prefix(model, prefix, rules)
    rows = prefix.shape[0]
    pos = regular_position_ids(grid, P, P + N - 1).to(device)        # (P + N - 1, 2)
    model.setup_cache(rows, P + N - 1)
    out = torch.empty(B, N, dtype=torch.long, device=device)
    logits = model.decode(None, pos[:P].expand(rows, P, 2), 0, prefix)[:, -1]     # (rows, V)
    for t in range(N):
        out[:, t] = sample_logits(rules.combine(logits), rules.temperature, rules.top_k, rules.top_p, generator)
        if progress is not None:
            progress(out, t + 1)
        if t == N - 1:
            break
        tok = out[:, t: t + 1]
        if rules.guided:
            tok = torch.cat([tok, tok])
        logits = model.decode(tok, pos[P + t: P + t + 1].expand(rows, 1, 2), P + t)[:, -1]
    if stats is not None:
        stats.add_plain(B, B * N, N, B * N)
    return out
