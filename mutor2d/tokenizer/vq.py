"""VQ checkpoints and the VQ tokenizer: images <-> token grids through a VQModel (mutor2d.tokenizer.vq_model).

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
from torch import Tensor

from ..checkpoint import list_checkpoints
from ..io import UnsafeFileError, file_sha256, read_torch_file
from .base import register_tokenizer
from .config import VQConfig, VQError, vq_config
from .vq_model import VQModel


# ----------------------------------------------------------------------------- checkpoints

def _short(keys: list[str], limit: int) -> str:
    shown = ", ".join(keys[:limit])
    return f"[{shown}{f', ... (+{len(keys) - limit} more)' if len(keys) > limit else ''}]"


def load_vq_state(model: VQModel, state: dict, source: str = "state dict") -> None:
    """Strict load: every key present, none extra, every shape equal; else VQError naming them."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = sorted(f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
                    for k in set(own) & set(state) if tuple(state[k].shape) != tuple(own[k].shape))
    problems = (("missing keys", missing, 6), ("unexpected keys", unexpected, 6),
                ("shape mismatches (checkpoint vs model)", shapes, 3))
    parts = [f"{what} {_short(keys, limit)}" for what, keys, limit in problems if keys]
    if parts:
        raise VQError(f"{source} does not match the VQ model: " + "; ".join(parts))
    model.load_state_dict(state, strict=True)


def config_from_state_dict(state: dict, image_size: int = 256) -> VQConfig:
    """Infer the architecture of a LlamaGen-layout VQ state dict (channels, levels, codebook)."""
    try:
        emb = state["quantize.embedding.weight"]
        ch, in_channels = state["encoder.conv_in.weight"].shape[:2]
        levels = sorted({int(k.split(".")[2]) for k in state if k.startswith("encoder.conv_blocks.")})
        ch_mult = tuple(state[f"encoder.conv_blocks.{i}.res.0.conv1.weight"].shape[0] // ch for i in levels)
        nres = len({k.split(".")[4] for k in state if k.startswith("encoder.conv_blocks.0.res.")})
        z_channels = state["encoder.conv_out.weight"].shape[0]
    except (KeyError, IndexError, ValueError, AttributeError) as e:
        raise VQError(f"not a LlamaGen-layout VQ state dict (cannot read {e})") from None
    used = state.get("quantize.codebook_used")
    # norm_groups: LlamaGen uses 32; smaller models of ours store their config, this is only a fallback.
    return VQConfig(codebook_size=emb.shape[0], codebook_embed_dim=emb.shape[1], ch=ch, ch_mult=ch_mult,
                    num_res_blocks=nres, z_channels=z_channels, in_channels=in_channels,
                    usage_window=0 if used is None else used.numel(), norm_groups=32 if ch % 32 == 0 else ch,
                    image_size=image_size)


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


def read_vq_checkpoint(path: str | os.PathLike) -> tuple[Path, dict]:
    """A checkpoint file, or a train_vq.py run folder (its newest checkpoint that loads safely; unreadable
    or unsafe ones are skipped with a warning naming them) -> (file, loaded dict). Loading never runs
    code from the file."""
    path = Path(path)
    if not path.is_dir():
        return path, _read(path)
    for p in reversed(list_checkpoints(path)):
        try:
            ckpt = _read(p)
        except VQError as e:
            warnings.warn(f"skipped {e}")
            continue
        if isinstance(ckpt, dict):
            return p, ckpt
        warnings.warn(f"skipped VQ checkpoint {str(p)!r}: not a dict")
    raise VQError(f"no readable VQ checkpoint under {str(path)!r} (expected RUN/checkpoints/step_*.pt)")


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
        if isinstance(stored, dict) and stored.get("task") == "vq" and isinstance(stored.get("model"), dict):
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
