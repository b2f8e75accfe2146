"""The engine's config sections, shared by every run kind: ``optim`` (OptimConfig, built by
mutor2d.engine.optim) and the loop's TrainConfig (a kind subclasses it: mutor2d.image.config). No
torch here (the rule: mutor2d.config)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..checks import ConfigError, at_least, check_seed, fail
from ..config import register_section


@register_section("optim", build="mutor2d.engine.optim:build_optimizer")
@dataclass
class OptimConfig:
    lr: float = 4e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.05
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0
    grad_clip: float = 1.0           # 0 = no clipping

    def check(self) -> None:
        if self.lr <= 0:
            fail("optim.lr", "> 0", self.lr)
        if not all(0 <= b < 1 for b in self.betas):
            fail("optim.betas", "values in [0, 1)", list(self.betas))
        for k in ("weight_decay", "warmup_steps", "min_lr", "grad_clip"):
            at_least(f"optim.{k}", getattr(self, k), 0)


@dataclass
class TrainConfig:
    """The loop's settings, shared by every run kind: batch and steps, precision, cadence of logs,
    checkpoints and online evaluation, EMA, tracker, sharding, guards, where the run goes. A kind adds
    its own fields by subclassing (mutor2d.image.config.ImageTrainConfig)."""
    batch_size: int = 64             # global batch (split over processes)
    max_steps: int = 1000
    grad_accum: int = 1
    seed: int = 0
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    log_every: int = 10
    ckpt_every: int = 500
    keep_ckpts: int = 2              # newest checkpoints kept by rotation (0 = all)
    keep_every: int = 0              # also keep every checkpoint of a multiple of this step, to score later
    eval_every: int = 0              # online embedded-metric evaluation (digits); 0 = off
    ema: bool = False
    ema_decay: float = 0.9999
    tracker: Literal["tensorboard", "wandb", "none"] = "tensorboard"
    out_dir: str = ""                # "" = runs/<config name>; train.py --out wins
    max_nonfinite: int = 20          # updates in a row skipped for non-finite values or exploded weights
                                     # before the run stops with an error (gradient spikes never stop it)
    sharding: Literal["auto", "ddp", "fsdp"] = "auto"   # auto: DDP with several processes; fsdp: FSDP2
                                     # shards each block, then the rest (mutor2d/engine/sharding.py)
    fsdp_offload: bool = False       # fsdp: sharded parameters, gradients and AdamW states live on the CPU
    activation_checkpointing: bool = False   # recompute each block's activations in the backward
    blowup_factor: float = 10.0      # skip an update whose grad norm exceeds this x the 90th percentile of
                                     # the last blowup_window judged ones, or whose weight norm this x its
                                     # median over the last applied ones (engine/health.py); 0 = off
    blowup_window: int = 50

    def check(self) -> None:
        for k in ("batch_size", "grad_accum", "log_every", "blowup_window"):
            at_least(f"train.{k}", getattr(self, k), 1)
        for k in ("max_steps", "ckpt_every", "keep_ckpts", "keep_every", "eval_every", "max_nonfinite"):
            at_least(f"train.{k}", getattr(self, k), 0)
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"train.grad_accum: {self.grad_accum} does not divide "
                              f"train.batch_size={self.batch_size}")
        check_seed("train.seed", self.seed)
        if not 0 < self.ema_decay < 1:
            fail("train.ema_decay", "a number in (0, 1)", self.ema_decay)
        if self.blowup_factor != 0 and not self.blowup_factor > 1:
            fail("train.blowup_factor", "0 (off) or a number > 1", self.blowup_factor)
        if self.fsdp_offload and self.sharding != "fsdp":
            fail("train.fsdp_offload", "false unless train.sharding=fsdp", self.fsdp_offload)


def flat(d: dict, prefix: str = "") -> dict:
    """Nested config sections -> {"section.key": value}."""
    out = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out
