"""Model FLOPs and MFU: one formula, used by training logs and the benchmarks.

FLOPs of a training step = 3 x forward FLOPs (backward costs twice the forward). Forward FLOPs per
sequence of L tokens = 2 x matmul parameters x L (every linear layer, LM head included; embedding
lookups are free) + 2 x n_layer x L² x dim for attention scores and values under a causal mask (the
full L² x dim x 4 halved: a causal kernel skips the masked half). Registers are counted as ordinary
tokens of the sequence (an over-estimate: they attend to a prefix only).
"""
from __future__ import annotations

import math
import os

import torch

from .peaks import PEAK_BF16_FLOPS
PEAK_ENV = "MUTOR2D_PEAK_TFLOPS"   # the user's peak in TFLOP/s per device; wins over the table


def matmul_params(shape, vocab_size: int) -> int:
    """Parameters used in matmuls per token: attention (4 dim²), SwiGLU (3 dim x ffn), LM head."""
    return shape.n_layer * (4 * shape.dim ** 2 + 3 * shape.dim * shape.ffn_dim) + shape.dim * vocab_size


def train_flops(shape, vocab_size: int, sequences: float, seq_len: float) -> float:
    """Training FLOPs (forward + backward) of ``sequences`` sequences of ``seq_len`` tokens."""
    forward = 2 * matmul_params(shape, vocab_size) * seq_len + 2 * shape.n_layer * seq_len ** 2 * shape.dim
    return 3.0 * forward * sequences


def env_peak() -> float | None:
    """$MUTOR2D_PEAK_TFLOPS in FLOP/s, None when unset or empty; ValueError naming a bad value."""
    if not (text := os.environ.get(PEAK_ENV, "").strip()):
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{PEAK_ENV}={text!r}: expected a positive number of TFLOP/s (e.g. 989)")
    return value * 1e12


def peak_flops(device: torch.device) -> float | None:
    """The bf16 peak FLOP/s of ``device``: $MUTOR2D_PEAK_TFLOPS when set (any device), else the
    datasheet value of a known GPU; None on CPU or an unknown GPU (no MFU is logged then)."""
    if (peak := env_peak()) is not None or device.type != "cuda":
        return peak
    name = torch.cuda.get_device_name(device).lower()
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k.lower() in name), None)
