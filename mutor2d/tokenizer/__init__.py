"""Image tokenizers: images <-> grids of token ids.

The :class:`Tokenizer` protocol (mutor2d.tokenizer.base) lists what a tokenizer exposes: identity and
sha256, vocab_size, grid, image_size, device/to, batch encode and decode. ``TOKENIZERS`` maps a kind
to a builder ``(arg, data=None, image_size=None) -> Tokenizer``; ``data.tokenizer`` (and
tokenizers/extract_codes.py's ``--tokenizer``) picks it: "KIND" (e.g. "pixel"), "KIND:ARGUMENT" (e.g.
"vq:runs/vq_digits", "pixel:17"), or a bare path, which is a VQ checkpoint (kind "vq"); the built-in
kinds are imported on first build. Adding a tokenizer: a module with its class and a builder decorated
``@register_tokenizer("mine")``, imported by MUTOR2D_PLUGINS (mutor2d.plugins).

Modules: base (protocol, registry), config (the settings without torch: VQConfig, presets, pixel
levels), pixel (PixelTokenizer), vq_model (the LlamaGen-layout VQ network), vq (VQ checkpoints and
VQTokenizer), codes (pre-tokenised image stores), image_folder (an ImageFolder tree, augmented
views), extract (images -> a store), lpips (perceptual loss). Weight files are read with mutor2d.io.read_torch_file (weights_only=True: never runs code from a file).
"""
