"""Next-token prediction with optional registers (MuToR-1D / MuToR-2D); plain NTP is this with
no registers.

Loss = (1 - a) * CE_ntp + a * L_reg with a = ``reg_weight``, each a mean over its own valid
targets (so neither term's scale depends on how many registers there are). L_reg is CE_reg, the
registers' cross-entropy to their target tokens (``reg_target: token``), or under ``self_distill``
(1 - m) * CE_reg + m * KL_reg, KL_reg the divergence of each register's distribution from the model's
own detached next-token distribution at its target's predictor slot (base.TargetRule). Registers are
extra tokens appended after the regular block; regular tokens never see them (see mutor2d.objectives.layout).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .layout import Layout, make_layout
from .spec import NO_REGISTERS, RegisterSpec
from .base import Batch, ObjectiveResult, TargetRule, TokenModel, mix, target_rule, token_ce
from .config import MuToR1DConfig, MuToR2DConfig, NTPConfig, WeightSchedule


class TokenPrediction(nn.Module):
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


def build_ntp(cfg: NTPConfig, model: TokenModel) -> TokenPrediction:
    """Plain next-token prediction: no registers."""
    return TokenPrediction(NO_REGISTERS, 0.0)


def build_registers(cfg: MuToR1DConfig | MuToR2DConfig, model: TokenModel) -> TokenPrediction:
    """MuToR-1D / MuToR-2D: the registers of ``cfg`` (the section is its RegisterSpec), a and its
    schedule, their target rule."""
    return TokenPrediction(cfg, cfg.reg_weight, cfg.weight_schedule(), target_rule(cfg))
