"""Autoregressive decoding with a KV cache.

``decoding.generate`` fills a grid token by token in raster order from a prefix (class labels, a
prompt, or whatever the model's conditioning kind takes). The per-token rules (CFG, temperature,
top-k, top-p) are ``rules.SamplingRules``; how tokens are proposed and checked is a decoding mode, a
variant of the ``sample.decode`` config section (``config``: settings only, no torch) whose image
decoder ``decoding.DECODERS`` names: ``plain`` (one token per forward pass), ``registers``
(speculative decoding with MuToR registers as drafters), ``jacobi`` (speculative Jacobi decoding,
training-free) and ``auto`` (the fastest exact mode for the batch and device). The speculative modes
are exact: their samples follow the distribution of plain sampling under the same settings, and
greedy decoding gives plain greedy's tokens. Every decoder counts into a ``stats.DecodeStats``.
A new mode: docs/EXTENDING.md, "A decoding mode".
"""
