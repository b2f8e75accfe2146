"""Model FLOPs and MFU: one formula, used by training logs and the benchmarks.

FLOPs of a training step = 3 x forward FLOPs (backward costs twice the forward). Forward FLOPs per
sequence of L tokens = 2 x matmul parameters x L (every linear layer, LM head included; embedding
lookups are free) + 2 x n_layer x L² x dim for attention scores and values under a causal mask (the
full L² x dim x 4 halved: a causal kernel skips the masked half). Registers are counted as ordinary
tokens of the sequence (an over-estimate: they attend to a prefix only).
"""
from __future__ import annotations

import torch

# Peak dense bf16 tensor-core FLOP/s per GPU (vendor datasheets, SXM parts, no sparsity).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def matmul_params(shape, vocab_size: int) -> int:
    """Parameters used in matmuls per token: attention (4 dim²), SwiGLU (3 dim x ffn), LM head."""
    return shape.n_layer * (4 * shape.dim ** 2 + 3 * shape.dim * shape.ffn_dim) + shape.dim * vocab_size


def train_flops(shape, vocab_size: int, sequences: float, seq_len: float) -> float:
    """Training FLOPs (forward + backward) of ``sequences`` sequences of ``seq_len`` tokens."""
    forward = 2 * matmul_params(shape, vocab_size) * seq_len + 2 * shape.n_layer * seq_len ** 2 * shape.dim
    return 3.0 * forward * sequences


def peak_flops(device: torch.device) -> float | None:
    """The datasheet bf16 peak of this GPU, None on CPU or an unknown GPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
