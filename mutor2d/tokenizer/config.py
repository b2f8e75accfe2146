"""The tokenizers' settings that need no torch: the VQ architecture (VQConfig, its presets and errors)
and the pixel tokenizer's level limit (no torch: mutor2d.config)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

LEVELS_LIMIT = 256      # pixel tokenizer: grey levels; an 8-bit image has no more
IMAGE_SIZE_LIMIT = 4096      # pixels a side: 16x ImageNet's 256 (one float view of 4096 px is 200 MB)
CROP_RANGE = (1.0, 2.0)      # random / corner crops from a centre crop 1x to 2x the image size
CODEBOOK_LIMIT = 1 << 16     # codes are stored as uint16 (mutor2d.tokenizer.codes)
USAGE_WINDOW_LIMIT = 1 << 24  # quantize.codebook_used: 128 MB of int64
VQ_PARAMS_LIMIT = 10 ** 10   # about 40 GB of float32 weights: 100x LlamaGen's VQ-16


class VQError(ValueError):
    """A VQ config or checkpoint that cannot be used; the message is one line."""


@dataclass
class VQConfig:
    """VQ architecture. Field names follow LlamaGen's ModelArgs where they exist."""
    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    commit_loss_beta: float = 0.25
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    z_channels: int = 256
    norm_groups: int = 32
    in_channels: int = 3
    dropout_p: float = 0.0
    usage_window: int = 65536       # length of quantize.codebook_used (LlamaGen: 65536); 0 = no buffer
    image_size: int = 256           # training / extraction resolution

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    @property
    def grid(self) -> tuple[int, int]:
        g = self.image_size // self.downsample
        return (g, g)

    def validate(self) -> "VQConfig":
        self.ch_mult = tuple(self.ch_mult)
        if not self.ch_mult or min(self.ch_mult) < 1:
            raise VQError(f"vq ch_mult: expected a non-empty list of positive ints, got {list(self.ch_mult)}")
        for name in ("codebook_size", "codebook_embed_dim", "ch", "num_res_blocks", "z_channels",
                     "norm_groups", "in_channels", "image_size"):
            if getattr(self, name) < 1:
                raise VQError(f"vq {name}: expected >= 1, got {getattr(self, name)}")
        for c in {self.ch * m for m in self.ch_mult}:
            if c % self.norm_groups:
                raise VQError(f"vq norm_groups={self.norm_groups} does not divide channel count {c} "
                              f"(ch={self.ch}, ch_mult={list(self.ch_mult)})")
        if self.image_size % self.downsample:
            raise VQError(f"vq image_size={self.image_size} is not a multiple of the downsampling "
                          f"factor {self.downsample}")
        for name, high in (("codebook_size", CODEBOOK_LIMIT), ("image_size", IMAGE_SIZE_LIMIT),
                           ("usage_window", USAGE_WINDOW_LIMIT)):
            if getattr(self, name) > high:
                raise VQError(f"vq {name}: expected at most {high}, got {getattr(self, name)}")
        if self.params > VQ_PARAMS_LIMIT:
            raise VQError(f"vq ch={self.ch}, num_res_blocks={self.num_res_blocks}, z_channels={self.z_channels}, "
                          f"in_channels={self.in_channels}, codebook_embed_dim={self.codebook_embed_dim}: about "
                          f"{self.params:.3g} parameters; expected at most {VQ_PARAMS_LIMIT:.0e}")
        if self.usage_window < 0:
            raise VQError(f"vq usage_window: expected >= 0, got {self.usage_window}")
        return self

    @property
    def params(self) -> int:
        """About the parameter count (3x3 convolutions at the widest level), counted without building it."""
        wide = self.ch * max(self.ch_mult)
        convs = 9 * (2 * len(self.ch_mult) * (2 * self.num_res_blocks + 1) * wide ** 2
                     + 2 * self.in_channels * self.ch + 2 * self.z_channels * wide)
        return convs + self.codebook_size * self.codebook_embed_dim

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["ch_mult"] = list(self.ch_mult)
        return d


PRESETS: dict[str, dict] = {
    # LlamaGen VQ-16 (vq_ds16_c2i.pt): 256 px -> 16x16 tokens, ~72M params.
    "vq16": dict(),
    # LlamaGen VQ-8: /8 downsampling.
    "vq8": dict(ch_mult=(1, 2, 2, 4)),
    # CPU preset for the embedded digits: 32 px -> 8x8 tokens (/4).
    "digits": dict(codebook_size=256, ch=8, ch_mult=(1, 2, 4), num_res_blocks=1, z_channels=32,
                   norm_groups=8, image_size=32, usage_window=4096),
    # CPU preset for the photo crops: 32 px -> 16x16 tokens (/2), the paper's token grid.
    "photos": dict(codebook_size=512, codebook_embed_dim=8, ch=16, ch_mult=(1, 2), num_res_blocks=1,
                   z_channels=32, norm_groups=8, image_size=32, usage_window=4096),
    # Smallest useful model, for tests: 16 px -> 4x4 tokens.
    "tiny": dict(codebook_size=64, codebook_embed_dim=4, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1,
                 z_channels=16, norm_groups=4, image_size=16, usage_window=1024),
}


def vq_config(preset: str = "vq16", **overrides) -> VQConfig:
    """A preset's config with ``overrides`` applied; unknown presets or fields raise VQError."""
    if preset not in PRESETS:
        raise VQError(f"vq preset {preset!r}: expected one of {sorted(PRESETS)}")
    names = {f.name for f in dataclasses.fields(VQConfig)}
    bad = sorted(set(overrides) - names)
    if bad:
        raise VQError(f"unknown vq config key {bad[0]!r} (known: {', '.join(sorted(names))})")
    return VQConfig(**{**PRESETS[preset], **overrides}).validate()
