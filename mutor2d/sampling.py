"""Autoregressive decoding with a KV cache (DESIGN.md 1.5 "Inference", 2 "Sampling").

``generate`` fills a grid token by token in raster order from a prefix (class labels or a prompt).
Registers play no part: only the regular next-token pathway runs, so a MuToR checkpoint samples
exactly like an NTP one. Position ids come from ``registers.regular_position_ids`` (the same ids
training uses).

Rules, per step, on the float32 logits of the next token:
  1. classifier-free guidance (class prefixes only): one forward over [cond; uncond] where the
     uncond half uses the null class (label ``num_classes``), logits = u + s·(c − u);
  2. temperature: logits / T; T == 0 means greedy decoding (argmax; top-k/top-p are moot);
  3. top-k: keep the k largest logits (0 = off);
  4. top-p: keep the smallest set of most likely tokens whose probability mass reaches p (1 = off);
  5. draw one token from the softmax with ``generator`` (the only source of randomness).
The drawn token is fed to both CFG halves.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .registers import regular_position_ids


def check_settings(cfg_scale: float, temperature: float, top_k: int, top_p: float) -> None:
    """Raise ValueError (one line) for impossible sampling settings."""
    if not math.isfinite(cfg_scale) or cfg_scale < 0:
        raise ValueError(f"cfg_scale: expected a finite number >= 0, got {cfg_scale!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature: expected a number >= 0 (0 = greedy), got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k: expected an integer >= 0 (0 = off), got {top_k!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p: expected a number in (0, 1] (1 = off), got {top_p!r}")


def guide(cond: Tensor, uncond: Tensor, scale: float) -> Tensor:
    """Classifier-free guidance on logits: u + s·(c − u)."""
    return uncond + scale * (cond - uncond)


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """logits (B, V) -> copy with the tokens outside top-k / the top-p nucleus set to -inf.

    top-p keeps, in order of decreasing probability, every token whose predecessors' mass is
    still below p (so the most likely token always survives and the kept mass is >= p)."""
    out = logits
    V = logits.shape[-1]
    if 0 < top_k < V:
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


def sample_logits(logits: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  generator: torch.Generator | None = None) -> Tensor:
    """logits (B, V) -> tokens (B,). temperature 0 = greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = filter_logits(logits.float() / temperature, top_k, top_p).softmax(-1)
    if generator is not None and generator.device != probs.device:
        return torch.multinomial(probs.to(generator.device), 1, generator=generator)[:, 0].to(probs.device)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def _unwrap(model):
    """The GPT inside DDP / torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def _check_prefix(model, prefix: Tensor) -> None:
    kind = model.cfg.prefix
    if prefix.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"prefix: expected integer tokens, got dtype {prefix.dtype}")
    if kind == "class":
        n = model.cfg.num_classes
        if prefix.dim() != 1:
            raise ValueError(f"prefix: a class-conditional model takes labels (B,), got shape {tuple(prefix.shape)}")
        if prefix.numel() and (prefix.min() < 0 or prefix.max() > n):
            raise ValueError(f"prefix: class labels must lie in 0..{n} ({n} = unconditional), "
                             f"got {prefix.min().item()}..{prefix.max().item()}")
    else:
        V = model.cfg.vocab_size
        if prefix.dim() != 2 or prefix.shape[1] < 1:
            raise ValueError(f"prefix: a prompt model takes tokens (B, P) with P >= 1, got shape {tuple(prefix.shape)}")
        if prefix.min() < 0 or prefix.max() >= V:
            raise ValueError(f"prefix: prompt tokens must lie in 0..{V - 1}, "
                             f"got {prefix.min().item()}..{prefix.max().item()}")


@torch.no_grad()
def generate(model, prefix: Tensor, grid: tuple[int, int], *, cfg_scale: float = 1.0,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             generator: torch.Generator | None = None) -> Tensor:
    """Sample bodies for ``prefix`` -> LongTensor (B, H*W) in raster order.

    prefix: class labels (B,) (``num_classes`` = the null class, i.e. unconditional) or prompt
    tokens (B, P). cfg_scale != 1 turns on classifier-free guidance (class prefixes only).
    temperature 0 = greedy. The model runs in eval mode (its training flag is restored after).
    """
    model = _unwrap(model)
    check_settings(cfg_scale, temperature, top_k, top_p)
    H, W = grid
    if H < 1 or W < 1:
        raise ValueError(f"grid: expected H, W >= 1, got {H}x{W}")
    _check_prefix(model, prefix)
    if cfg_scale != 1.0 and model.cfg.prefix != "class":
        raise ValueError(f"cfg_scale={cfg_scale}: classifier-free guidance needs class labels, "
                         f"this model's prefix is {model.cfg.prefix!r}")
    was_training = model.training
    model.eval()
    try:
        return _decode(model, prefix, grid, cfg_scale, cfg_scale != 1.0, temperature, top_k, top_p, generator)
    finally:
        model.clear_cache()
        model.train(was_training)


def _decode(model, prefix: Tensor, grid: tuple[int, int], cfg_scale: float, guided: bool,
            temperature: float, top_k: int, top_p: float, generator) -> Tensor:
    """The decoding loop. ``guided`` runs the batched [cond; uncond] forward (tests force it at
    scale 1 to check it reduces to plain conditional sampling)."""
    device = model.output.weight.device
    prefix = prefix.to(device)
    B = prefix.shape[0]
    N = grid[0] * grid[1]
    P = model.prefix_len(prefix)
    if guided:
        prefix = torch.cat([prefix, torch.full_like(prefix, model.cfg.num_classes)])
    rows = prefix.shape[0]
    pos = regular_position_ids(grid, P, P + N - 1).to(device)        # (P + N - 1, 2)
    model.setup_cache(rows, P + N - 1)

    def pick(logits: Tensor) -> Tensor:                               # logits (rows, V)
        if guided:
            logits = guide(logits[:B], logits[B:], cfg_scale)
        return sample_logits(logits, temperature, top_k, top_p, generator)

    out = torch.empty(B, N, dtype=torch.long, device=device)
    logits = model.decode(None, pos[:P].expand(rows, P, 2), 0, prefix)[:, -1]
    for t in range(N):
        out[:, t] = pick(logits)
        if t == N - 1:
            break
        tok = out[:, t: t + 1]
        if guided:
            tok = torch.cat([tok, tok])
        logits = model.decode(tok, pos[P + t: P + t + 1].expand(rows, 1, 2), P + t)[:, -1]
    return out


def compile_decoder(model) -> None:
    """Compile ``model.decode`` with torch.compile (dynamic shapes: the cache position changes
    every step). Sampling results are unchanged up to float rounding."""
    model = _unwrap(model)
    model.decode = torch.compile(model.decode, dynamic=True)
