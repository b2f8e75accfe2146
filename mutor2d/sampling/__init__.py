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

import functools
import types
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

__all__ = ["CPU_DECODE_INDUCTOR", "DECODERS", "Rules", "check_settings", "compile_decoder", "draw", "filter_logits",
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
                         f"this model is conditioned on {model.cfg.conditioning!r}")
    rules = Rules(cfg_scale, temperature, top_k, top_p, guided=cfg_scale != 1.0)
    was_training = model.training
    model.eval()
    try:
        return DECODERS[decode](model, prefix, grid, rules, generator, stats, **options)
    finally:
        model.clear_cache()
        model.train(was_training)


# inductor settings of a compiled decode step on CPU: weights frozen into the graph as constants
# and prepacked for inductor's C++ GEMM template (chosen over ATen's by benchmarking at compile
# time). A GPT-B decode step of 4 rows: 1.98x its weight-bandwidth floor against 2.85x without
# (docs/BENCHMARKS.md).
CPU_DECODE_INDUCTOR = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}


def compile_decoder(model, inductor: dict | None = None) -> None:
    """Compile ``model.decode`` with torch.compile (dynamic shapes: the cache position changes
    every step). Sampling results are unchanged up to float rounding.

    ``inductor``: torch._inductor.config settings in force whenever the compiled function runs
    (and so whenever it compiles); default ``CPU_DECODE_INDUCTOR`` for a model on the CPU, none
    elsewhere. With ``freezing`` the weights are constants of the compiled code (a prepacked
    copy: one more copy of the weights in memory): compile again after changing them.

    The KV cache goes into the compiled function as arguments, not as module attributes: dynamo
    treats a module's tensor attributes as static (under ``freezing`` even as constants, guarded
    by identity, so every ``setup_cache`` would recompile). Tensor arguments are passed as fresh
    contiguous copies (a few integers each): callers pass slices such as
    ``pos[t:t + 1].expand(...)`` whose storage offset changes every step, and dynamo would guard
    on it and recompile until its recompile limit, then fall back to eager."""
    model = _unwrap(model)
    layers = [layer.attention for layer in model.layers]
    eager_decode = type(model).decode.__get__(model)     # the eager method, even if compiled before
    if inductor is None:
        inductor = CPU_DECODE_INDUCTOR if model.output.weight.device.type == "cpu" else {}
    settings = dict(inductor)
    from torch._inductor import config as inductor_config

    def step(caches, args, kwargs):
        for attention, cache in zip(layers, caches):
            attention.cache = cache
        return eager_decode(*args, **kwargs)
    # a code object of its own: dynamo's graphs and recompile budget are per code object
    step = types.FunctionType(step.__code__.replace(), step.__globals__, step.__name__,
                              step.__defaults__, step.__closure__)
    compiled = torch.compile(step, dynamic=True)

    def fresh(x):
        return x.clone(memory_format=torch.contiguous_format) if isinstance(x, Tensor) else x

    @functools.wraps(eager_decode)
    def decode(*args, **kwargs):
        inputs = ([a.cache for a in layers], tuple(map(fresh, args)), {k: fresh(v) for k, v in kwargs.items()})
        if not settings:
            return compiled(*inputs)
        with inductor_config.patch(settings):
            return compiled(*inputs)
    model.decode = decode
