"""The tokenizer protocol and the registry of tokenizer kinds (nothing here imports a kind, so a kind's
module, in mutor2d or in a plugin, imports this one without any import-order trap)."""
from __future__ import annotations

import hashlib
import json
from typing import Callable, Protocol

import torch
from torch import Tensor

from ..registry import resolve


class Tokenizer(Protocol):
    """Images <-> grids of token ids. Everything the training data, sampling and the codes path
    (tokenizers/extract_codes.py, ``data.name: codes``) read from a tokenizer:

    identity     str, the ``data.tokenizer`` value that rebuilds it (e.g. "vq:/abs/step.pt", "pixel:17");
                 stored in a codes folder's header to say what made the codes;
    sha256       str, hash of what decides its codes (a weights file, or its settings): a codes folder
                 stores it and ``data.name: codes`` warns when the tokenizer that decodes differs;
    vocab_size   number of token ids (codebook size, at most 65536 for a codes folder);
    grid         (H, W) code grid of one image at ``image_size``;
    image_size   side S of the square images ``encode`` takes;
    device       where its weights live (None: no weights); ``to(device)`` moves them, returns self;
    encode       a batch of images (B, 3, S, S) float in [0, 1] -> codes (B, H, W) long;
    decode       a batch of codes (B, H, W) long -> images (B, 3, h, w) float in [0, 1].
    """
    identity: str
    sha256: str
    vocab_size: int
    grid: tuple[int, int]
    image_size: int
    device: torch.device | None

    def to(self, device) -> "Tokenizer": ...

    def encode(self, images: Tensor) -> Tensor: ...

    def decode(self, codes: Tensor) -> Tensor: ...


# A builder makes a tokenizer from the part of ``data.tokenizer`` after "KIND:" (None without one),
# the data config it is built for (None outside one, e.g. in tokenizers/extract_codes.py) and an
# image size to encode at (None: its own; a kind that cannot change it raises ValueError).
Builder = Callable[..., Tokenizer]
TOKENIZERS: dict[str, Builder | str] = {"pixel": "mutor2d.tokenizer.pixel:build_pixel",   # built in: imported
                                        "vq": "mutor2d.tokenizer.vq:build_vq"}          # on first build
DEFAULT_PATH_KIND = "vq"   # a bare path in data.tokenizer is a VQ checkpoint


def register_tokenizer(kind: str):
    """Decorator: make ``builder(arg, data=None, image_size=None) -> Tokenizer`` the tokenizer kind
    ``kind``, selected by ``data.tokenizer: KIND`` or ``KIND:ARG``."""
    def add(builder: Builder) -> Builder:
        TOKENIZERS[kind] = builder
        return builder
    return add


def parse_tokenizer(spec: str) -> tuple[str, str | None]:
    """``data.tokenizer`` -> (TOKENIZERS key, argument): "KIND" -> (KIND, None), "KIND:ARG" ->
    (KIND, ARG) when KIND is registered, anything else -> (DEFAULT_PATH_KIND, spec)."""
    if spec in TOKENIZERS:
        return spec, None
    kind, sep, arg = spec.partition(":")
    return (kind, arg) if sep and kind in TOKENIZERS else (DEFAULT_PATH_KIND, spec)


def tokenizer_kind(spec: str) -> str:
    return parse_tokenizer(spec)[0]


def build_tokenizer(spec: str, data=None, image_size: int | None = None) -> Tokenizer:
    """The tokenizer ``spec`` names (see :func:`parse_tokenizer`), for the data config ``data`` (or None)."""
    kind, arg = parse_tokenizer(spec)
    return resolve(TOKENIZERS[kind])(arg, data=data, image_size=image_size)


def settings_sha256(kind: str, **settings) -> str:
    """sha256 of a tokenizer without a weights file: its kind and settings (JSON, sorted keys)."""
    return hashlib.sha256(json.dumps({"kind": kind, **settings}, sort_keys=True).encode()).hexdigest()
