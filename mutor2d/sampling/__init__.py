"""Autoregressive decoding with a KV cache.

``generate`` fills a grid token by token in raster order from a prefix (class labels or a
prompt). The per-token rules (CFG, temperature, top-k, top-p) live in ``rules``; how tokens are
proposed and checked is a decoding mode from ``DECODERS``:

* ``plain``: one token per forward pass (``plain.py``);
* ``registers``: speculative decoding with MuToR registers as drafters (``draft=K``);
* ``jacobi``: speculative Jacobi decoding, training-free (``window=K``).
The speculative modes (``speculative.py``) are exact: their samples follow the distribution of
plain sampling under the same settings, and greedy decoding gives plain greedy's tokens.
A new mode is one function ``(model, prefix, grid, rules, generator, stats, **options) -> body``
plus one line in ``DECODERS``.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from .plain import decode_plain
from .rules import Rules, check_settings, draw, filter_logits, guide, sample_logits
from .speculative import decode_jacobi, decode_registers

DECODERS: dict[str, Callable[..., Tensor]] = {
    "plain": decode_plain,
    "registers": decode_registers,
    "jacobi": decode_jacobi,
}

__all__ = ["DECODERS", "Rules", "check_settings", "compile_decoder", "draw", "filter_logits",
           "generate", "guide", "sample_logits"]


def _unwrap(model):
    """The GPT inside DDP / torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


@torch.no_grad()
def generate(model, prefix: Tensor, grid: tuple[int, int], *, cfg_scale: float = 1.0,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             generator: torch.Generator | None = None, decode: str = "plain",
             stats: dict | None = None, **options) -> Tensor:
    """Sample bodies for ``prefix`` -> LongTensor (B, H*W) in raster order.

    prefix: class labels (B,) (``num_classes`` = the null class, i.e. unconditional) or prompt
    tokens (B, P). cfg_scale != 1 turns on classifier-free guidance (class prefixes only).
    temperature 0 = greedy. ``decode`` names a mode in DECODERS; ``options`` go to it (e.g.
    ``draft=4`` for registers, ``window=4`` for jacobi). ``stats``, if a dict, receives the
    run's counts (forward passes, tokens per forward, acceptance by draft distance). The model
    runs in eval mode (its training flag is restored after).
    """
    model = _unwrap(model)
    check_settings(cfg_scale, temperature, top_k, top_p)
    if decode not in DECODERS:
        raise ValueError(f"decode={decode!r}: expected one of {sorted(DECODERS)}")
    H, W = grid
    if H < 1 or W < 1:
        raise ValueError(f"grid: expected H, W >= 1, got {H}x{W}")
    model.conditioning.check(model.cfg, prefix)
    if cfg_scale != 1.0 and not model.conditioning.guidable:
        raise ValueError(f"cfg_scale={cfg_scale}: classifier-free guidance needs class labels, "
                         f"this model's prefix is {model.cfg.prefix!r}")
    rules = Rules(cfg_scale, temperature, top_k, top_p, guided=cfg_scale != 1.0)
    was_training = model.training
    model.eval()
    try:
        return DECODERS[decode](model, prefix, grid, rules, generator, stats, **options)
    finally:
        model.clear_cache()
        model.train(was_training)


def compile_decoder(model) -> None:
    """Compile ``model.decode`` with torch.compile (dynamic shapes: the cache position changes
    every step). Sampling results are unchanged up to float rounding."""
    model = _unwrap(model)
    model.decode = torch.compile(model.decode, dynamic=True)
