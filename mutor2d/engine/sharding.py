"""Sharded training with PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``); what it means for a
run (precision, offload, checkpoints): docs/SCALING.md.

Rules:
  * ``train.sharding``: auto = DDP with several processes; fsdp = FSDP2 with several processes
    (one process trains unsharded, with a warning); ddp = never shard.
  * ``shard_blocks(root, blocks)`` shards each transformer block, then the root with what is left
    (embeddings, final norm, head, register embedding): any model given its list of blocks.
    Parameters become DTensors (dim 0 split over the processes); the optimizer is built on them afterwards.
  * EMA: ``ShardedEma``, one DTensor per parameter sharded as the parameter is, by timm ModelEmaV3's
    rule; it saves and loads itself as a checkpoint part (``ema_part``: mutor2d.checkpoint.state).
  * Sample grids and evaluations: every process takes part in gathering the weights (EMA when kept)
    into an unsharded model on the main process.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils.checkpoint import checkpoint

from ..config import ConfigError
from ..io import warn


def wants_fsdp(train_cfg, num_processes: int, main: bool) -> bool:
    """True when train.sharding asks for FSDP2 and a process group exists: several processes, or one
    launched by torchrun / accelerate (a one-rank mesh: the sharded code path on one GPU, as
    bench/gpu.sh checks it). A plain single process trains unsharded, with a warning."""
    if train_cfg.sharding != "fsdp":
        return False
    if num_processes == 1 and not dist.is_initialized():
        if main:
            warn("train.sharding=fsdp in a single process without a launcher: nothing to shard over, the "
                 "model trains unsharded")
        return False
    return True


def precision_policy(mixed_precision: str):
    """MixedPrecisionPolicy for the accelerator's resolved train.mixed_precision (None: fp32 throughout)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    if mixed_precision == "fp16":
        raise ConfigError("train.mixed_precision=fp16 with train.sharding=fsdp: expected bf16 or no "
                          "(fp16 needs a gradient scaler that sharded training does not have here)")
    if mixed_precision == "bf16":
        # inputs are not cast: the embeddings already come out in bf16, and FSDP's cast would rebuild
        # dataclass inputs (Visibility) through their constructor
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                    cast_forward_inputs=False)
    return None


def shard_blocks(root: nn.Module, blocks: list[nn.Module], device: torch.device, mp_policy=None,
                 offload: bool = False) -> None:
    """fully_shard each block, then ``root`` (in place: the rest) over all processes of ``device``'s
    kind; ``mp_policy``: :func:`precision_policy`'s; ``offload``: parameters, gradients and optimizer
    states on the CPU."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    offloading = CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload else OffloadPolicy()
    kwargs = {"mesh": mesh, "mp_policy": mp_policy or MixedPrecisionPolicy(), "offload_policy": offloading}
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(root, **kwargs)


def _recompute(forward, *args, **kwargs):
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def checkpoint_activations(blocks: list[nn.Module]) -> None:
    """Each block keeps only its input and recomputes its activations in the backward (non-reentrant
    torch.utils.checkpoint; the RNG state is replayed, so dropout masks and losses are unchanged).
    A partial of the bound forward: a deep copy (the EMA's) recomputes with its own weights."""
    for block in blocks:
        block.forward = functools.partial(_recompute, block.forward)


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule
    return isinstance(module, FSDPModule)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def global_tensor(t: torch.Tensor) -> torch.Tensor:
    """A reduced or replicated DTensor (a clipped gradient norm) as a plain tensor."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def all_finite(params) -> bool:
    """Every parameter finite, on every process (one answer everywhere: sharded or not)."""
    params = list(params)
    flag = torch.stack([torch.isfinite(_local(p)).all() for p in params]).all()
    if any(isinstance(p, DTensor) for p in params):
        flag = flag.to(torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag)


class ShardedEma:
    """EMA of a sharded GPT's parameters, one DTensor per parameter (names as in the GPT's state dict)."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.weights = {k: p.detach().clone() for k, p in model.named_parameters()}

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        """timm ModelEmaV3's rule: decay 0 at update 1 (a copy), then ``decay``: ema += (1-decay)(w-ema)."""
        decay = 0.0 if step <= 1 else self.decay
        params = dict(model.named_parameters())
        torch._foreach_lerp_([_local(v) for v in self.weights.values()],
                             [_local(params[k].detach()) for k in self.weights], 1.0 - decay)

    def state_dict(self) -> dict:
        """The EMA's DTensors themselves (a sharded checkpoint reads into them in place)."""
        return self.weights

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """EMA weights into the shards: this EMA's own DTensors (read in place) or full tensors, the same
        on every process (a .pt file)."""
        for k, v in self.weights.items():
            if state[k] is not v:
                full = state[k].to(device=v.device, dtype=v.dtype)
                v.copy_(distribute_tensor(full, v.device_mesh, v.placements) if isinstance(v, DTensor) else full)


def build_ema(model: nn.Module, train_cfg, sharded: bool):
    """ShardedEma under FSDP, timm ModelEmaV3 otherwise: a copy of ``model``'s weights."""
    if sharded:
        return ShardedEma(model, train_cfg.ema_decay)
    from timm.utils import ModelEmaV3
    return ModelEmaV3(model, decay=train_cfg.ema_decay)


def ema_part(ema):
    """The EMA as a checkpoint part (state_dict / load_state_dict): ShardedEma itself, ModelEmaV3's module."""
    return ema if isinstance(ema, ShardedEma) else ema.module


def gathered_model(model: nn.Module, ema, main: bool, device: torch.device, plain_copy):
    """Collective: an unsharded model holding the sharded model's weights (EMA when kept) on the main
    process, in eval mode; None on the others. ``plain_copy(model)``: a new unsharded model of the same
    architecture (the run kind's ``plain_copy``)."""
    state = {}
    for k, v in (ema.state_dict() if ema is not None else dict(model.named_parameters())).items():
        full = global_tensor(v)                    # every process takes part; only the main one keeps it
        if main:
            state[k] = full.detach()
    if not main:
        return None
    with torch.device(device):
        plain = plain_copy(model)
    plain.load_state_dict(state, strict=True)
    return plain.eval()
