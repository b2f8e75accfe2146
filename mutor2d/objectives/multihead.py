"""Multi-token prediction with extra heads (Gloeckle et al.-style), the baseline MuToR is
compared with: one extra transformer layer per offset on the trunk's output, all sharing the
model's final norm and LM head. Head k predicts the token at offset k from each regular input's
anchor, with the same target rule as registers (2D: the D²-1 offsets; 1D: d = max(d_min, 2)..d_max,
d = 1 being the main head).

Loss = (1 - a) * CE_ntp + a * mean_k CE_head_k with a = ``reg_weight``.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..model import TransformerBlock
from ..registers import RegisterSpec, candidate_offsets, first_anchor, make_layout, offset_targets, \
    regular_position_ids
from .base import Batch, ObjectiveResult, masked_ce


class MultiHead(nn.Module):
    def __init__(self, cfg, model: nn.Module):
        super().__init__()
        kind = "mutor-2d" if cfg.layout == "2d" else "mutor-1d"
        offsets = candidate_offsets(kind, max(cfg.d_min, 2), cfg.d_max)
        if cfg.num_heads:
            offsets = offsets[: cfg.num_heads]
        self.kind, self.edge, self.reg_weight = kind, cfg.edge, cfg.reg_weight
        self.register_buffer("offsets", offsets, persistent=False)
        self.heads = nn.ModuleList(TransformerBlock(model.cfg, model.shape) for _ in range(len(offsets)))
        for m in self.heads.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, model.cfg.init_std)

    @staticmethod
    def uses_registers(cfg) -> bool:
        return False

    def blocks(self) -> list[nn.Module]:
        return list(self.heads)

    def forward(self, model, batch: Batch, generator: torch.Generator | None = None) -> ObjectiveResult:
        B, N = batch.body.shape
        P = model.prefix_len(batch.prefix)
        T = P + N - 1
        pos = regular_position_ids(batch.grid, P, device=batch.body.device).expand(B, T, 2)
        h = model.hidden(model.embed(batch.body[:, : N - 1], batch.prefix), pos)
        lay = make_layout(B, batch.grid, P, RegisterSpec("ntp"), None, batch.lengths, batch.body.device)
        ntp_t, _ = lay.gather_targets(batch.body)
        first = P - 1
        loss_ntp, n_ntp = masked_ce(model.logits(h[:, first:]), ntp_t[:, first:], lay.ntp_valid[:, first:])
        a0 = first_anchor(self.kind)
        anchors = torch.arange(a0, N - 1, device=h.device)                  # regular inputs P+a0..T-1
        rope = model.rotary(pos)
        losses, n_heads = [], 0
        for head, off in zip(self.heads, self.offsets):
            target, valid = offset_targets(batch.grid, anchors.expand(B, -1), off, self.edge, batch.lengths)
            hk = head(h, rope)[:, P + a0:]
            loss_k, n_k = masked_ce(model.logits(hk), batch.body.gather(1, target), valid)
            losses.append(loss_k)
            n_heads = n_heads + n_k
        loss_heads = torch.stack(losses).mean()
        loss = (1 - self.reg_weight) * loss_ntp + self.reg_weight * loss_heads
        tokens = torch.full((), B * T, device=batch.body.device)
        return ObjectiveResult(loss, {"loss_ntp": loss_ntp, "loss_heads": loss_heads},
                               {"ntp": n_ntp, "heads": n_heads}, tokens)
