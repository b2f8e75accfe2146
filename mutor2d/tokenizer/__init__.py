"""Image tokenizers: images <-> grids of token ids.

The :class:`Tokenizer` protocol (mutor2d.tokenizer.base) lists what a tokenizer exposes: identity and
sha256, vocab_size, grid, image_size, device/to, batch encode and decode. ``TOKENIZERS`` maps a kind
to a builder ``(arg, data=None, image_size=None) -> Tokenizer``; ``data.tokenizer`` (and
tokenizers/extract_codes.py's ``--tokenizer``) picks it: "KIND" (e.g. "pixel"), "KIND:ARGUMENT" (e.g.
"vq:runs/vq_digits", "pixel:17"), or a bare path, which is a VQ checkpoint (kind "vq"). Adding a
tokenizer: a module with its class and a builder decorated ``@register_tokenizer("mine")``, imported
by mutor2d (below) or by MUTOR2D_PLUGINS (mutor2d.plugins).

Modules: base (protocol, registry), config (the settings without torch: VQConfig, presets, pixel
levels), pixel (PixelTokenizer), vq_model (the LlamaGen-layout VQ network), vq (VQ checkpoints and
VQTokenizer), codes (pre-tokenised image stores), image_folder (an ImageFolder tree, augmented
views), extract (images -> a store), lpips (perceptual loss). The names below are
imported on first use (torch), with the built-in kinds, which register themselves. Weight files are
read with mutor2d.io.read_torch_file (weights_only=True: never runs code from a file).
"""
from __future__ import annotations

import importlib

EXPORTS = {"TOKENIZERS": "base", "Tokenizer": "base", "build_tokenizer": "base", "parse_tokenizer": "base",
           "register_tokenizer": "base", "settings_sha256": "base", "tokenizer_kind": "base",
           "PixelTokenizer": "pixel"}
__all__ = list(EXPORTS)


def __getattr__(name: str):
    """The names of EXPORTS, imported on first use with the built-in kinds (pixel, vq)."""
    if name not in EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import pixel, vq  # noqa: F401 (the built-in kinds register themselves)
    return getattr(importlib.import_module(f"{__name__}.{EXPORTS[name]}"), name)
