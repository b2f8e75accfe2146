"""Autoregressive decoding with a KV cache.

``generate`` fills a grid token by token in raster order from a prefix (class labels, a prompt, or
whatever the model's conditioning kind takes). The per-token rules (CFG, temperature, top-k, top-p)
are ``SamplingRules`` (``rules``); how tokens are proposed and checked is a decoding mode, a variant
of the ``sample.decode`` config section (``DecodeConfig``, ``config``: settings only), whose image
decoder ``decoding.DECODERS`` names:

* ``plain``: one token per forward pass (``plain.py``);
* ``registers``: speculative decoding with MuToR registers as drafters (``draft=K``; the offsets,
  edge rule and default K come from the checkpoint's objective);
* ``jacobi``: speculative Jacobi decoding, training-free (``window=K``);
* ``auto``: the fastest exact mode for the batch and device (``AutoDecode`` states it for images
  and text).
The speculative modes (``speculative.py``, on the rule of ``speculation.py`` that the language-model
decoder shares) are exact: their samples follow the distribution of plain sampling under the same
settings, and greedy decoding gives plain greedy's tokens. Every decoder counts into a
``DecodeStats`` (``stats``). ``decode_modes(wing)`` lists the modes of the image or text decoder: the
one registry of ``--decode``. A new mode is one dataclass registered with
``@register_variant("sample.decode", NAME)`` and its decoder with ``@register_decoder(NAME)``
(docs/METHOD.md, "A decoding mode"). The settings (``config``) import no torch; ``decoding`` holds
generate and its parts.
"""
