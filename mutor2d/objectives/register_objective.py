"""Next-token prediction with optional registers (MuToR-1D / MuToR-2D); plain NTP is this with
no registers.

Loss = (1 - a) * CE_ntp + a * L_reg with a = ``reg_weight``, each a mean over its own valid
targets (so neither term's scale depends on how many registers there are). L_reg is CE_reg, the
registers' cross-entropy to their target tokens (``reg_target: token``), or under ``self_distill``
(1 - m) * CE_reg + m * KL_reg, KL_reg the divergence of each register's distribution from the model's
own detached next-token distribution at its target's predictor slot (base.TargetRule). Registers are
extra tokens appended after the regular block; regular tokens never see them (see mutor2d.registers).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn

from ..config import register_variant
from ..registers import Layout, RegisterSpec, make_layout
from .base import (AuxTermConfig, Batch, ObjectiveConfig, ObjectiveResult, TargetRule, TokenModel, WeightSchedule,
                   check_offset_distribution, check_offsets, mix, token_ce)


@register_variant("objective", "ntp")
@dataclass
class NTPConfig(ObjectiveConfig):
    """Plain next-token prediction: no other field."""

    def build(self, model: nn.Module) -> "RegisterObjective":
        return RegisterObjective(self.register_spec(), 0.0)


@dataclass
class RegisterConfig(AuxTermConfig):
    """Fields of the register objectives (beside a's and the term's, base.AuxTermConfig).
    ``placement``: dense (one register per anchor with a valid target) or sparse (``num_registers``
    random anchors per sequence). One offset per sequence unless ``per_register_offsets``. ``edge``:
    targets past the right edge are invalid (geometric) or wrap to the next row (raster).
    ``offset_distribution``: uniform, valid-anchors, or one weight per candidate offset;
    ``register_visibility``: isolated or earlier_registers (registers.RegisterSpec)."""
    offset_distribution: Literal["uniform", "valid-anchors"] | list[float] = "uniform"
    register_visibility: Literal["isolated", "earlier_registers"] = "isolated"
    placement: Literal["dense", "sparse"] = "dense"
    num_registers: int = 80
    per_register_offsets: bool = False
    edge: Literal["geometric", "raster"] = "geometric"

    def check(self) -> None:
        super().check()
        check_offsets(self, self.name)
        check_offset_distribution(self.offset_distribution, len(self.register_spec().offsets()),
                                  self.offsets_text())

    def register_spec(self) -> RegisterSpec:
        dist = self.offset_distribution
        return RegisterSpec(self.name, getattr(self, "d_min", 1), self.d_max, self.placement, self.num_registers,
                            self.per_register_offsets, self.edge, dist if isinstance(dist, str) else tuple(dist),
                            self.register_visibility)

    def uses_registers(self) -> bool:
        return True

    def build(self, model: nn.Module) -> "RegisterObjective":
        return RegisterObjective(self.register_spec(), self.reg_weight, self.weight_schedule(), self.target_rule())

    def offsets_text(self) -> str:
        """The offsets in a few characters, e.g. "D=4" or "d=1..4"."""
        raise NotImplementedError

    def describe(self) -> str:
        """e.g. "a=0.5, D=4, sparse K=80", "a=0.5, self_distill mix=0.5, D=4, dense" or
        "a=0.5, d=2..4, dense, raster, per-register offsets"."""
        parts = self.describe_aux_term() + [self.offsets_text(),
                                            f"sparse K={self.num_registers}" if self.placement == "sparse" else "dense"]
        parts += [self.edge] if self.edge != "geometric" else []
        parts += ["per-register offsets"] if self.per_register_offsets else []
        parts += [] if self.offset_distribution == "uniform" else [f"offsets {self.offset_distribution}"]
        parts += [] if self.register_visibility == "isolated" else [self.register_visibility]
        return ", ".join(parts)


@register_variant("objective", "mutor-1d")
@dataclass
class MuToR1DConfig(RegisterConfig):
    """Registers predicting the token d = d_min..d_max (inclusive) ahead on the raster line:
    offsets (0, d); d_max is the farthest token ahead."""
    d_min: int = 1
    d_max: int = 4

    def offsets_text(self) -> str:
        return f"d={self.d_min}..{self.d_max}"


@register_variant("objective", "mutor-2d")
@dataclass
class MuToR2DConfig(RegisterConfig):
    """Registers predicting a token at a 2D offset (dr, dc) in {0..D-1}^2 minus (0, 0), D = d_max,
    the side of the offset square (the paper's (d_h, d_w) in {1..D}^2 minus (1, 1))."""
    d_max: int = 4

    def offsets_text(self) -> str:
        return f"D={self.d_max}"

    @classmethod
    def from_legacy(cls, flat: dict) -> dict:
        """Old configs held D as ``d_max_2d`` beside the 1D ``d_min``/``d_max``."""
        return {**super().from_legacy(flat), "d_max": flat["d_max_2d"]}


class RegisterObjective(nn.Module):
    """NTP (a spec without registers) or MuToR with registers (mutor-1d, mutor-2d), on any
    TokenModel (images and text). ``reg_weight`` is a of the current update: ``schedule.at`` of the
    step the engine last passed to ``set_step`` (``schedule`` None: constant). ``target``: what each
    register learns (base.TargetRule; its teacher for target x_j is regular slot P - 1 + j)."""

    def __init__(self, spec: RegisterSpec, reg_weight: float, schedule: WeightSchedule | None = None,
                 target: TargetRule = TargetRule()):
        super().__init__()
        self.spec, self.reg_weight, self.schedule, self.target = spec, reg_weight, schedule, target

    def set_step(self, step: int, max_steps: int) -> None:
        """Before update ``step`` (0-based) of a ``max_steps`` run: a = schedule.at(step, max_steps)."""
        if self.schedule is not None:
            self.reg_weight = self.schedule.at(step, max_steps)

    def blocks(self) -> list[nn.Module]:
        return []

    def layout(self, batch: Batch, prefix_len: int, generator: torch.Generator | None) -> Layout:
        return make_layout(batch.body.shape[0], batch.grid, prefix_len, self.spec, generator,
                           batch.lengths, batch.body.device)

    def forward(self, model: TokenModel, batch: Batch, generator: torch.Generator | None = None) -> ObjectiveResult:
        P = model.prefix_len(batch.prefix)
        lay = self.layout(batch, P, generator)
        T, R = lay.num_regular, lay.num_registers
        inputs = batch.body[:, : T - P]
        h = model.hidden(model.embed(inputs, batch.prefix, R), lay.position_ids, lay.visibility, prefix_len=P)
        ntp_t, reg_t = lay.gather_targets(batch.body)
        first = P - 1  # hidden states before it only predict prefix tokens: skip the head there
        ntp = token_ce(model, h[:, first:T], ntp_t[:, first:], lay.ntp_valid[:, first:])
        reg, parts = (self.target.loss(model, h[:, T:], reg_t, lay.reg_valid, h[:, :T], first + lay.reg_target)
                      if R else (None, None))
        tokens = torch.full((), batch.body.shape[0] * (T + R), device=batch.body.device)
        return mix(ntp, reg, self.reg_weight, tokens, parts=parts)
