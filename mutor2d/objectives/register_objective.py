"""Next-token prediction with optional registers (MuToR-1D / MuToR-2D); plain NTP is this with
no registers.

Loss = (1 - a) * CE_ntp + a * CE_reg with a = ``reg_weight``, each a mean over its own valid
targets (so neither term's scale depends on how many registers there are). Registers are extra
tokens appended after the regular block; regular tokens never see them (see mutor2d.registers).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..registers import Layout, RegisterSpec, make_layout
from .base import Batch, ObjectiveResult, masked_ce


class RegisterObjective(nn.Module):
    """NTP (objective.name='ntp') or MuToR with registers (mutor-1d, mutor-2d)."""

    def __init__(self, cfg, model: nn.Module | None = None):
        super().__init__()
        self.spec = RegisterSpec.from_config(cfg)
        self.reg_weight = cfg.reg_weight if self.spec.uses_registers else 0.0

    @staticmethod
    def uses_registers(cfg) -> bool:
        return RegisterSpec.from_config(cfg).uses_registers

    def blocks(self) -> list[nn.Module]:
        return []

    def layout(self, batch: Batch, prefix_len: int, generator: torch.Generator | None) -> Layout:
        return make_layout(batch.body.shape[0], batch.grid, prefix_len, self.spec, generator,
                           batch.lengths, batch.body.device)

    def forward(self, model, batch: Batch, generator: torch.Generator | None = None) -> ObjectiveResult:
        P = model.prefix_len(batch.prefix)
        lay = self.layout(batch, P, generator)
        T, R = lay.num_regular, lay.num_registers
        inputs = batch.body[:, : T - P]
        h = model.hidden(model.embed(inputs, batch.prefix, R), lay.position_ids, lay.visibility)
        ntp_t, reg_t = lay.gather_targets(batch.body)
        first = P - 1  # hidden states before it only predict prefix tokens: skip the head there
        loss_ntp, n_ntp = masked_ce(model.logits(h[:, first:T]), ntp_t[:, first:], lay.ntp_valid[:, first:])
        logs, counts = {"loss_ntp": loss_ntp}, {"ntp": n_ntp}
        loss = loss_ntp
        if R:
            loss_reg, n_reg = masked_ce(model.logits(h[:, T:]), reg_t, lay.reg_valid)
            logs["loss_reg"], counts["reg"] = loss_reg, n_reg
            loss = (1 - self.reg_weight) * loss_ntp + self.reg_weight * loss_reg
        tokens = torch.full((), batch.body.shape[0] * (T + R), device=batch.body.device)
        return ObjectiveResult(loss, logs, counts, tokens)
