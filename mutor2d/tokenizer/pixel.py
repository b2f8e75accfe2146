"""Pixel tokenizer: one token per pixel, the grey level quantised to ``levels`` values."""
from __future__ import annotations

from torch import Tensor

from .base import register_tokenizer, settings_sha256
from .config import LEVELS_LIMIT


class PixelTokenizer:
    """Grey level g in [0, 1] <-> token round(g * (levels - 1)); the code grid is the image itself.

    ``grid`` (H, W) is the image size it tokenises (the digits: 8x8); ``decode`` accepts any grid."""

    def __init__(self, levels: int, grid: tuple[int, int] = (8, 8)):
        if not 2 <= levels <= LEVELS_LIMIT:
            raise ValueError(f"data.levels: expected 2..{LEVELS_LIMIT} grey levels (an 8-bit image has "
                             f"{LEVELS_LIMIT}), got {levels}")
        self.levels = levels
        self.vocab_size = levels
        self.grid = tuple(grid)
        self.image_size = self.grid[0]
        self.identity = f"pixel:{levels}"
        self.sha256 = settings_sha256("pixel", levels=levels, grid=list(self.grid))

    device = None  # no weights: works on any device

    def to(self, device) -> "PixelTokenizer":
        return self

    def encode(self, images: Tensor) -> Tensor:
        """images (B, C, H, W) or grey (B, H, W), float in [0, 1] -> codes (B, H, W) long.
        Colour images are reduced to grey by averaging the channels."""
        grey = images.mean(1) if images.dim() == 4 else images
        return (grey.clamp(0, 1) * (self.levels - 1)).round().long()

    def decode(self, codes: Tensor) -> Tensor:
        """codes (B, H, W) long -> images (B, 3, H, W) float in [0, 1] (grey in every channel)."""
        return (codes.float() / (self.levels - 1)).unsqueeze(1).expand(-1, 3, -1, -1)


@register_tokenizer("pixel")
def build_pixel(arg: str | None, data=None, image_size: int | None = None) -> PixelTokenizer:
    """"pixel:LEVELS", or "pixel" with the data config's ``levels`` (data.name: digits); images of
    side ``image_size`` (default 8, the digits)."""
    if arg is None and not hasattr(data, "levels"):
        raise ValueError("tokenizer 'pixel': expected pixel:LEVELS (e.g. pixel:17) outside data.name=digits")
    if arg is not None and not arg.isdigit():
        raise ValueError(f"tokenizer 'pixel:{arg}': expected pixel:LEVELS with an integer >= 2, e.g. pixel:17")
    size = image_size or 8
    return PixelTokenizer(int(arg) if arg is not None else data.levels, (size, size))
