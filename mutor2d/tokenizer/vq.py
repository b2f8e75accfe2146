"""VQ image tokenizer with LlamaGen's VQModel module and parameter names.

Architecture (LlamaGen VQ-16, taming-style): conv encoder (``conv_blocks`` of ResNet blocks, stride-2
downsampling between levels, attention in the last level and the middle), ``quant_conv`` to the
codebook dimension, an L2-normalised codebook (``quantize.embedding``), ``post_quant_conv`` and the
mirrored decoder with nearest-neighbour upsampling. Images are in [-1, 1]; the token grid is
image_size / 2**(len(ch_mult) - 1) on each side.

Quantiser rule (same as LlamaGen): z and the codebook are L2-normalised, code = argmin over
|z|^2 + |e|^2 - 2 z.e; the decoder sees the normalised code vector. Losses (training only):
codebook  mean((e - sg(z))^2), commitment  beta * mean((sg(e) - z)^2), straight-through gradients.

A user's ``vq_ds16_c2i.pt`` (weights under "model" or "ema") loads with strict key and shape checks:
:func:`load_vq`. A mismatch raises :class:`VQError` listing missing / unexpected keys. Files are read
with ``weights_only=True`` (mutor2d.io.read_torch_file): a file whose pickle would run code is refused.
Checkpoints written by train_vq.py carry a checksum of their content, verified at load: a corrupt
one is refused (skipped with a warning when a run folder is given).
The explicit allow-list ``VQ_FILE_GLOBALS`` holds argparse.Namespace, the training arguments
LlamaGen stores beside its weights ("args").
"""
from __future__ import annotations

import argparse
import hashlib
import os
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checkpoint import list_checkpoints
from ..io import UnsafeFileError, file_sha256, read_torch_file
from .base import register_tokenizer
from .config import PRESETS, VQConfig, VQError, vq_config  # noqa: F401 (the VQ settings, importable from here)


# ----------------------------------------------------------------------------- building blocks

def swish(x: Tensor) -> Tensor:
    return x * torch.sigmoid(x)


def group_norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(groups, channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """x + conv2(drop(swish(norm2(conv1(swish(norm1(x))))))); 1x1 ``nin_shortcut`` when widths differ."""

    def __init__(self, cin: int, cout: int, groups: int, dropout: float):
        super().__init__()
        self.norm1 = group_norm(cin, groups)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = group_norm(cout, groups)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(self.dropout(swish(self.norm2(h))))
        skip = x if self.nin_shortcut is None else self.nin_shortcut(x)
        return skip + h


class AttnBlock(nn.Module):
    """Single-head spatial self-attention over h*w positions, 1x1 conv q/k/v/proj_out, residual."""

    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.norm = group_norm(channels, groups)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (m(y).flatten(2).transpose(1, 2).unsqueeze(1) for m in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)  # (b, 1, hw, c), scale c^-0.5
        out = out.squeeze(1).transpose(1, 2).reshape(b, c, h, w)
        return x + self.proj_out(out)


class Downsample(nn.Module):
    """Pad right/bottom by one, 3x3 conv with stride 2."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    """Nearest-neighbour x2, then 3x3 conv."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Encoder(nn.Module):
    """(B, in_channels, S, S) -> (B, z_channels, S/f, S/f)."""

    def __init__(self, cfg: VQConfig):
        super().__init__()
        ch, mult, g, p = cfg.ch, cfg.ch_mult, cfg.norm_groups, cfg.dropout_p
        self.conv_in = nn.Conv2d(cfg.in_channels, ch, 3, padding=1)
        self.conv_blocks = nn.ModuleList()
        cin = ch
        for level, m in enumerate(mult):
            last = level == len(mult) - 1
            block = nn.Module()
            block.res, block.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(cfg.num_res_blocks):
                block.res.append(ResnetBlock(cin, ch * m, g, p))
                cin = ch * m
                if last:
                    block.attn.append(AttnBlock(cin, g))
            if not last:
                block.downsample = Downsample(cin)
            self.conv_blocks.append(block)
        self.mid = nn.ModuleList([ResnetBlock(cin, cin, g, p), AttnBlock(cin, g), ResnetBlock(cin, cin, g, p)])
        self.norm_out = group_norm(cin, g)
        self.conv_out = nn.Conv2d(cin, cfg.z_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv_in(x)
        for block in self.conv_blocks:
            for i, res in enumerate(block.res):
                h = res(h)
                if len(block.attn):
                    h = block.attn[i](h)
            if hasattr(block, "downsample"):
                h = block.downsample(h)
        for m in self.mid:
            h = m(h)
        return self.conv_out(swish(self.norm_out(h)))


class Decoder(nn.Module):
    """(B, z_channels, S/f, S/f) -> (B, in_channels, S, S). ``conv_blocks[0]`` is the deepest level."""

    def __init__(self, cfg: VQConfig):
        super().__init__()
        ch, mult, g, p = cfg.ch, cfg.ch_mult, cfg.norm_groups, cfg.dropout_p
        cin = ch * mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, cin, 3, padding=1)
        self.mid = nn.ModuleList([ResnetBlock(cin, cin, g, p), AttnBlock(cin, g), ResnetBlock(cin, cin, g, p)])
        self.conv_blocks = nn.ModuleList()
        for level in reversed(range(len(mult))):
            block = nn.Module()
            block.res, block.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(cfg.num_res_blocks + 1):
                block.res.append(ResnetBlock(cin, ch * mult[level], g, p))
                cin = ch * mult[level]
                if level == len(mult) - 1:
                    block.attn.append(AttnBlock(cin, g))
            if level != 0:
                block.upsample = Upsample(cin)
            self.conv_blocks.append(block)
        self.norm_out = group_norm(cin, g)
        self.conv_out = nn.Conv2d(cin, cfg.in_channels, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.conv_in(z)
        for m in self.mid:
            h = m(h)
        for block in self.conv_blocks:
            for i, res in enumerate(block.res):
                h = res(h)
                if len(block.attn):
                    h = block.attn[i](h)
            if hasattr(block, "upsample"):
                h = block.upsample(h)
        return self.conv_out(swish(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    """Nearest-code quantiser over ``embedding`` (n_e, e_dim), L2-normalised when ``l2_norm``.

    ``codebook_used`` (LlamaGen's buffer) holds the most recent ``usage_window`` codes seen in
    training; -1 marks empty slots (a LlamaGen checkpoint's buffer is loaded as it is)."""

    def __init__(self, n_e: int, e_dim: int, beta: float, l2_norm: bool, usage_window: int):
        super().__init__()
        self.n_e, self.e_dim, self.beta, self.l2_norm = n_e, e_dim, beta, l2_norm
        self.embedding = nn.Embedding(n_e, e_dim)
        with torch.no_grad():
            self.embedding.weight.uniform_(-1.0 / n_e, 1.0 / n_e)
            if l2_norm:
                self.embedding.weight.copy_(F.normalize(self.embedding.weight, dim=-1))
        if usage_window:
            self.register_buffer("codebook_used", torch.full((usage_window,), -1.0))
        else:
            self.codebook_used = None

    def codebook(self) -> Tensor:
        """(n_e, e_dim) code vectors as the decoder sees them."""
        w = self.embedding.weight
        return F.normalize(w, dim=-1) if self.l2_norm else w

    def nearest(self, z: Tensor) -> Tensor:
        """z (M, e_dim), already normalised if l2_norm -> codes (M,) long."""
        e = self.codebook()
        e2 = (e ** 2).sum(1)
        step = max(1, (1 << 26) // self.n_e)  # rows per chunk: bounds the (rows, n_e) distance matrix
        out = [((zc ** 2).sum(1, keepdim=True) + e2 - 2 * zc @ e.t()).argmin(1) for zc in z.split(step)]
        return torch.cat(out) if out else z.new_zeros(0, dtype=torch.long)

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor, dict]:
        """z (B, e_dim, h, w) -> (z_q (B, e_dim, h, w), codes (B, h, w), losses).

        losses: codebook, commitment (zero tensors in eval mode)."""
        b, c, h, w = z.shape
        z = z.permute(0, 2, 3, 1).reshape(-1, c)
        if self.l2_norm:
            z = F.normalize(z, dim=-1)
        codes = self.nearest(z)
        z_q = self.codebook()[codes]
        if self.training:
            losses = {"codebook": F.mse_loss(z_q, z.detach()),
                      "commitment": self.beta * F.mse_loss(z, z_q.detach())}
            self._track_usage(codes)
        else:
            zero = z.new_zeros(())
            losses = {"codebook": zero, "commitment": zero}
        z_q = z + (z_q - z).detach()
        z_q = z_q.reshape(b, h, w, c).permute(0, 3, 1, 2)
        return z_q, codes.reshape(b, h, w), losses

    @torch.no_grad()
    def _track_usage(self, codes: Tensor) -> None:
        if self.codebook_used is None:
            return
        n = min(codes.numel(), self.codebook_used.numel())
        self.codebook_used.copy_(torch.cat([self.codebook_used[n:], codes[-n:].to(self.codebook_used)]))

    def usage(self) -> float:
        """Fraction of the codebook among the last ``usage_window`` training codes."""
        if self.codebook_used is None:
            return float("nan")
        used = self.codebook_used[self.codebook_used >= 0].long().unique()
        return used.numel() / self.n_e

    def lookup(self, codes: Tensor) -> Tensor:
        """codes (B, h, w) long -> (B, e_dim, h, w) code vectors."""
        if codes.min() < 0 or codes.max() >= self.n_e:
            raise VQError(f"codes out of range: got values in [{int(codes.min())}, {int(codes.max())}], "
                          f"expected [0, {self.n_e - 1}]")
        return self.codebook()[codes].permute(0, 3, 1, 2)


class VQModel(nn.Module):
    """LlamaGen-compatible VQ tokenizer. Images in [-1, 1]."""

    def __init__(self, cfg: VQConfig):
        super().__init__()
        self.config = cfg.validate()
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.quantize = VectorQuantizer(cfg.codebook_size, cfg.codebook_embed_dim, cfg.commit_loss_beta,
                                        cfg.codebook_l2_norm, cfg.usage_window)
        self.quant_conv = nn.Conv2d(cfg.z_channels, cfg.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(cfg.codebook_embed_dim, cfg.z_channels, 1)

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor, dict]:
        """x (B, C, S, S) in [-1, 1] -> (z_q (B, e_dim, S/f, S/f), codes (B, S/f, S/f), losses)."""
        self._check_input(x)
        return self.quantize(self.quant_conv(self.encoder(x)))

    def decode(self, z_q: Tensor) -> Tensor:
        """(B, e_dim, h, w) -> images (B, C, h*f, w*f), nominally in [-1, 1]."""
        return self.decoder(self.post_quant_conv(z_q))

    def decode_codes(self, codes: Tensor) -> Tensor:
        """codes (B, h, w) long -> images (B, C, h*f, w*f)."""
        return self.decode(self.quantize.lookup(codes))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, dict]:
        """x -> (reconstruction, codes, losses)."""
        z_q, codes, losses = self.encode(x)
        return self.decode(z_q), codes, losses

    def _check_input(self, x: Tensor) -> None:
        f = self.config.downsample
        if x.dim() != 4 or x.shape[1] != self.config.in_channels or x.shape[2] % f or x.shape[3] % f:
            raise VQError(f"VQ input: expected (B, {self.config.in_channels}, H, W) with H, W multiples "
                          f"of {f}, got {tuple(x.shape)}")


# ----------------------------------------------------------------------------- checkpoints

def _short(keys: list[str], limit: int = 6) -> str:
    shown = ", ".join(keys[:limit])
    return f"[{shown}{f', ... (+{len(keys) - limit} more)' if len(keys) > limit else ''}]"


def load_vq_state(model: VQModel, state: dict, source: str = "state dict") -> None:
    """Strict load: every key present, none extra, every shape equal; else VQError naming them."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
                    for k in set(own) & set(state) if tuple(state[k].shape) != tuple(own[k].shape))
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing keys {_short(missing)}")
        if unexpected:
            parts.append(f"unexpected keys {_short(unexpected)}")
        if shapes:
            parts.append(f"shape mismatches (checkpoint vs model) {_short(shapes, 3)}")
        raise VQError(f"{source} does not match the VQ model: " + "; ".join(parts))
    model.load_state_dict(state, strict=True)


def config_from_state_dict(state: dict, image_size: int = 256) -> VQConfig:
    """Infer the architecture of a LlamaGen-layout VQ state dict (channels, levels, codebook)."""
    try:
        emb = state["quantize.embedding.weight"]
        ch = state["encoder.conv_in.weight"].shape[0]
        levels = sorted({int(k.split(".")[2]) for k in state if k.startswith("encoder.conv_blocks.")})
        ch_mult = tuple(state[f"encoder.conv_blocks.{i}.res.0.conv1.weight"].shape[0] // ch for i in levels)
        nres = len({k.split(".")[4] for k in state if k.startswith("encoder.conv_blocks.0.res.")})
        z_channels = state["encoder.conv_out.weight"].shape[0]
        in_channels = state["encoder.conv_in.weight"].shape[1]
    except (KeyError, IndexError, ValueError, AttributeError) as e:
        raise VQError(f"not a LlamaGen-layout VQ state dict (cannot read {e})") from None
    used = state.get("quantize.codebook_used")
    return VQConfig(codebook_size=emb.shape[0], codebook_embed_dim=emb.shape[1], ch=ch, ch_mult=ch_mult,
                    num_res_blocks=nres, z_channels=z_channels, in_channels=in_channels,
                    usage_window=0 if used is None else used.numel(), norm_groups=_norm_groups(ch),
                    image_size=image_size)


def _norm_groups(ch: int) -> int:
    # LlamaGen uses 32 groups; smaller models of ours store their config, this is only a fallback.
    return 32 if ch % 32 == 0 else ch


def _weights_of(ckpt, path: Path, use_ema: bool) -> dict:
    """The state dict inside a loaded checkpoint: "ema" (if preferred and present), "model",
    "state_dict", or the checkpoint itself when it is a bare state dict."""
    if not isinstance(ckpt, dict):
        raise VQError(f"VQ checkpoint {str(path)!r}: expected a dict, got {type(ckpt).__name__}")
    state = ckpt.get("ema") if use_ema and ckpt.get("ema") is not None else ckpt.get("model")
    if state is None:
        state = ckpt.get("state_dict")
    if state is None and "quantize.embedding.weight" in ckpt:
        state = ckpt
    if not isinstance(state, dict):
        raise VQError(f"VQ checkpoint {str(path)!r} has no weights under 'model', 'ema' or 'state_dict' "
                      f"(keys: {sorted(map(str, ckpt))[:8]})")
    return state


VQ_FILE_GLOBALS = [argparse.Namespace]


def _read(path: Path):
    try:
        return read_torch_file(path, "VQ checkpoint", allow=VQ_FILE_GLOBALS)
    except (UnsafeFileError, FileNotFoundError) as e:
        raise VQError(str(e)) from None


def newest_vq_checkpoint(run_dir: str | os.PathLike) -> tuple[Path, dict] | None:
    """(file, loaded dict) of the newest checkpoint of a run folder that loads safely, or None.
    Unreadable or unsafe files are skipped with a warning naming them."""
    for p in reversed(list_checkpoints(run_dir)):
        try:
            ckpt = _read(p)
        except VQError as e:
            warnings.warn(f"skipped {e}")
            continue
        if isinstance(ckpt, dict):
            return p, ckpt
        warnings.warn(f"skipped VQ checkpoint {str(p)!r}: not a dict")
    return None


def read_vq_checkpoint(path: str | os.PathLike) -> tuple[Path, dict]:
    """A checkpoint file, or a train_vq.py run folder (its newest safely readable checkpoint)
    -> (file, loaded dict). Loading never runs code from the file."""
    path = Path(path)
    if path.is_dir():
        found = newest_vq_checkpoint(path)
        if found is None:
            raise VQError(f"no readable VQ checkpoint under {str(path)!r} (expected RUN/checkpoints/step_*.pt)")
        return found
    return path, _read(path)


def load_vq(path: str | os.PathLike, config: VQConfig | None = None, use_ema: bool = True,
            device="cpu") -> VQModel:
    """A VQ checkpoint -> VQModel in eval mode.

    Accepts mutor2d VQ checkpoints (``config["model"]`` holds the architecture) and LlamaGen's
    (weights under "model", "ema" or "state_dict", or a bare state dict; architecture read from the
    weights, image size 256). ``config`` forces an architecture; the weights must then match it
    exactly. ``use_ema`` prefers "ema" when present. ``path`` may be a train_vq.py run folder."""
    return _build_vq(*read_vq_checkpoint(path), config, use_ema).to(device).eval()


def _build_vq(path: Path, ckpt, config: VQConfig | None, use_ema: bool) -> VQModel:
    state = _weights_of(ckpt, path, use_ema)
    if config is None:
        stored = ckpt.get("config")
        if isinstance(stored, dict) and isinstance(stored.get("model"), dict) and \
                stored.get("task") == "vq":
            config = vq_config("vq16", **stored["model"])
        else:
            config = config_from_state_dict(state).validate()
    model = VQModel(config)
    load_vq_state(model, state, source=f"VQ checkpoint {str(path)!r}")
    return model


class VQTokenizer:
    """Images <-> token grids through a VQModel; images are floats in [0, 1]. ``identity``: the
    ``data.tokenizer`` value of its checkpoint ("vq:PATH"); ``sha256``: of that file, or of the
    weights for a model built in memory."""

    def __init__(self, model: VQModel, identity: str = "vq:(in memory)", sha256: str | None = None,
                 image_size: int | None = None):
        self.model = model.eval()
        self.identity, self._sha256 = identity, sha256
        self.vocab_size = model.config.codebook_size
        self.image_size = image_size or model.config.image_size
        f = model.config.downsample
        if self.image_size % f:
            raise VQError(f"image size {self.image_size} is not a multiple of the VQ's downsampling factor {f}")
        self.grid = (self.image_size // f, self.image_size // f)

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, device="cpu", image_size: int | None = None) -> "VQTokenizer":
        """``path``: a VQ checkpoint file or a train_vq.py run folder (its newest valid checkpoint).
        ``image_size`` overrides the resolution the checkpoint was made for (e.g. 384 for VQ-16)."""
        path, ckpt = read_vq_checkpoint(path)
        model = _build_vq(path, ckpt, None, use_ema=True).to(device)
        return cls(model, identity=f"vq:{path.resolve()}", sha256=file_sha256(path), image_size=image_size)

    @property
    def sha256(self) -> str:
        """sha256 of the checkpoint file, else of the weights (computed once)."""
        if self._sha256 is None:
            h = hashlib.sha256()
            for name, t in self.model.state_dict().items():
                h.update(name.encode())
                h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            self._sha256 = h.hexdigest()
        return self._sha256

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device) -> "VQTokenizer":
        """Move the VQ weights to ``device``; returns self."""
        self.model.to(device)
        return self

    @torch.no_grad()
    def encode(self, images: Tensor) -> Tensor:
        """images (B, C, S, S) in [0, 1] -> codes (B, S/f, S/f) long."""
        _, codes, _ = self.model.encode(images.to(self.device) * 2 - 1)
        return codes

    @torch.no_grad()
    def decode(self, codes: Tensor) -> Tensor:
        """codes (B, H, W) long -> images (B, 3, H*f, W*f) float in [0, 1]."""
        img = self.model.decode_codes(codes.to(self.device).long())
        if img.shape[1] == 1:
            img = img.expand(-1, 3, -1, -1)
        return ((img + 1) / 2).clamp(0, 1)


@register_tokenizer("vq")
def build_vq(arg: str | None, data=None, image_size: int | None = None) -> VQTokenizer:
    """"vq:PATH" or a bare PATH: a VQ checkpoint file or a train_vq.py run folder."""
    if not arg:
        raise VQError("tokenizer 'vq': expected a VQ checkpoint path (PATH or vq:PATH)")
    return VQTokenizer.from_checkpoint(arg, image_size=image_size)
