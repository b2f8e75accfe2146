"""Image tokenizers: images <-> grids of token ids.

A tokenizer (the :class:`Tokenizer` protocol) exposes
  vocab_size   number of token ids (codebook size);
  grid         (H, W) code grid of one image;
  image_size   side of the square images it encodes;
  encode       images (B, 3, S, S) float in [0, 1] -> codes (B, H, W) long;
  decode       codes (B, H, W) long -> images (B, 3, h, w) float in [0, 1];
  device       where its weights live (None: no weights); ``to(device)`` moves them, returns self.

``TOKENIZERS`` maps a kind to a builder(argument, data config). ``data.tokenizer`` picks it:
"KIND" (e.g. "pixel"), "KIND:ARGUMENT" (e.g. "vq:runs/vq_digits"), or a bare path, which is a VQ
checkpoint (kind "vq"). Adding a tokenizer: a module with its class and a builder, plus one line
``TOKENIZERS["mine"] = build_mine``; select it with ``data.tokenizer: mine`` or ``mine:PATH``.

Modules: pixel (PixelTokenizer), vq (LlamaGen-layout VQ model and VQTokenizer), vq_train (VQ
training), codes (pre-tokenised image stores), lpips (perceptual loss). Weight files are read
with mutor2d.io.read_torch_file (weights_only=True: never runs code from a file).
"""
from __future__ import annotations

from typing import Callable, Protocol

import torch
from torch import Tensor

from .pixel import PixelTokenizer


class Tokenizer(Protocol):
    vocab_size: int
    grid: tuple[int, int]
    image_size: int
    device: torch.device | None

    def to(self, device) -> "Tokenizer": ...

    def encode(self, images: Tensor) -> Tensor: ...

    def decode(self, codes: Tensor) -> Tensor: ...


def _pixel(arg: str | None, data_cfg) -> PixelTokenizer:
    return PixelTokenizer(data_cfg.levels)


def _vq(arg: str | None, data_cfg):
    from .vq import VQError, VQTokenizer
    if not arg:
        raise VQError(f"data.tokenizer={data_cfg.tokenizer!r}: expected a VQ checkpoint path (PATH or vq:PATH)")
    return VQTokenizer.from_checkpoint(arg)


# kind -> builder(argument after "KIND:" or None, data config) -> Tokenizer
TOKENIZERS: dict[str, Callable[[str | None, object], Tokenizer]] = {
    "pixel": _pixel,   # reads data.levels
    "vq": _vq,         # argument: a VQ checkpoint file or a train_vq.py run folder
}
DEFAULT_PATH_KIND = "vq"   # a bare path in data.tokenizer is a VQ checkpoint


def parse_tokenizer(spec: str) -> tuple[str, str | None]:
    """``data.tokenizer`` -> (TOKENIZERS key, argument): "KIND" -> (KIND, None), "KIND:ARG" ->
    (KIND, ARG) when KIND is registered, anything else -> (DEFAULT_PATH_KIND, spec)."""
    if spec in TOKENIZERS:
        return spec, None
    kind, sep, arg = spec.partition(":")
    if sep and kind in TOKENIZERS:
        return kind, arg
    return DEFAULT_PATH_KIND, spec


def tokenizer_kind(spec: str) -> str:
    """The TOKENIZERS key that a ``data.tokenizer`` value names."""
    return parse_tokenizer(spec)[0]


def build_tokenizer(data_cfg) -> Tokenizer:
    """The tokenizer ``data_cfg.tokenizer`` names (see :func:`parse_tokenizer`)."""
    kind, arg = parse_tokenizer(data_cfg.tokenizer)
    return TOKENIZERS[kind](arg, data_cfg)


__all__ = ["TOKENIZERS", "PixelTokenizer", "Tokenizer", "build_tokenizer", "parse_tokenizer", "tokenizer_kind"]
