"""Image tokenizers: images <-> grids of token ids.

The :class:`Tokenizer` protocol and the ``TOKENIZERS`` registry are in base; ``data.tokenizer`` (and
tokenizers/extract_codes.py's ``--tokenizer``) picks a kind: "KIND" (e.g. "pixel"), "KIND:ARGUMENT"
(e.g. "vq:runs/vq_digits", "pixel:17"), or a bare path, which is a VQ checkpoint. Adding a tokenizer:
a module with its class and a builder decorated ``@register_tokenizer("mine")``, imported by
MUTOR2D_PLUGINS (mutor2d.plugins).

Modules: base (protocol, registry), config (the settings without torch: VQConfig, presets, pixel
levels), pixel (PixelTokenizer), vq_model (the LlamaGen-layout VQ network), vq (VQ checkpoints and
VQTokenizer), codes (pre-tokenised image stores), image_folder (an ImageFolder tree, augmented
views), extract (images -> a store), lpips (perceptual loss). Weight files are read with
mutor2d.io.read_torch_file (weights_only=True: never runs code from a file).
"""
