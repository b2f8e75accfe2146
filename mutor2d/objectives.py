"""Training objectives: next-token (NTP), MuToR (1D/2D registers) and the Gloeckle-style
multi-head baseline. One code path: NTP is MuToR with no registers.

Loss = (1 - a) * CE_ntp + a * CE_aux, each a mean over its own valid targets (DESIGN.md 1.5),
where CE_aux is the register loss (MuToR) or the mean of the extra heads' losses (multihead).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .config import ObjectiveConfig
from .model import GPT, TransformerBlock
from .registers import (Layout, RegisterSpec, candidate_offsets, first_anchor, make_layout,
                        offset_targets, regular_position_ids)


@dataclass
class Batch:
    """body (B, N) tokens in raster order of ``grid``; prefix: labels (B,) or prompt (B, P);
    lengths (B,) real body lengths for padded 1D data, else None."""
    body: Tensor
    prefix: Tensor
    grid: tuple[int, int]
    lengths: Tensor | None = None


def masked_ce(logits: Tensor, targets: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Mean cross-entropy over valid positions (0 if none) and the count of valid positions."""
    n = valid.sum()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return (ce * valid.reshape(-1)).sum() / n.clamp(min=1), n


class MuToR(nn.Module):
    """NTP (spec.objective == 'ntp', a ignored) or MuToR with registers."""

    def __init__(self, cfg: ObjectiveConfig):
        super().__init__()
        self.spec = RegisterSpec.from_config(cfg)
        self.reg_weight = cfg.reg_weight if self.spec.uses_registers else 0.0

    def layout(self, batch: Batch, prefix_len: int, generator: torch.Generator | None) -> Layout:
        return make_layout(batch.body.shape[0], batch.grid, prefix_len, self.spec, generator,
                           batch.lengths, batch.body.device)

    def forward(self, model: GPT, batch: Batch, generator: torch.Generator | None = None) -> dict:
        P = model.prefix_len(batch.prefix)
        lay = self.layout(batch, P, generator)
        T, R = lay.num_regular, lay.num_registers
        inputs = batch.body[:, : T - P]
        h = model.hidden(model.embed(inputs, batch.prefix, R), lay.position_ids, lay.visibility)
        ntp_t, reg_t = lay.gather_targets(batch.body)
        first = P - 1  # hidden states before it only predict prefix tokens: skip the head there
        loss_ntp, n_ntp = masked_ce(model.logits(h[:, first:T]), ntp_t[:, first:], lay.ntp_valid[:, first:])
        out = {"loss_ntp": loss_ntp, "n_ntp": n_ntp}
        if R:
            loss_reg, n_reg = masked_ce(model.logits(h[:, T:]), reg_t, lay.reg_valid)
            out.update(loss_reg=loss_reg, n_reg=n_reg)
            out["loss"] = (1 - self.reg_weight) * loss_ntp + self.reg_weight * loss_reg
        else:
            out["loss"] = loss_ntp
        return out


class MultiHead(nn.Module):
    """Gloeckle et al.-style multi-token prediction: one extra transformer layer per offset on the
    trunk output, all sharing the model's final norm and LM head. Head k predicts the token at
    offset k from each regular input's anchor, with the same target rule as registers (2D: the
    D²-1 offsets; 1D: d = d_min..d_max, skipping d = 1 which is the main head)."""

    def __init__(self, cfg: ObjectiveConfig, model: GPT):
        super().__init__()
        kind = "mutor-2d" if cfg.multihead_layout == "2d" else "mutor-1d"
        offsets = candidate_offsets(kind, max(cfg.d_min, 2), cfg.d_max, cfg.d_max_2d)
        if cfg.num_heads:
            offsets = offsets[: cfg.num_heads]
        self.kind, self.edge, self.reg_weight = kind, cfg.edge, cfg.reg_weight
        self.register_buffer("offsets", offsets, persistent=False)
        self.heads = nn.ModuleList(TransformerBlock(model.cfg, model.shape) for _ in range(len(offsets)))
        for m in self.heads.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, model.cfg.init_std)

    def forward(self, model: GPT, batch: Batch, generator: torch.Generator | None = None) -> dict:
        B, N = batch.body.shape
        P = model.prefix_len(batch.prefix)
        T = P + N - 1
        pos = regular_position_ids(batch.grid, P).to(batch.body.device).expand(B, T, 2)
        h = model.hidden(model.embed(batch.body[:, : N - 1], batch.prefix), pos)
        ntp = MuToR(ObjectiveConfig(name="ntp"))
        lay = ntp.layout(batch, P, None)
        ntp_t, _ = lay.gather_targets(batch.body)
        first = P - 1
        loss_ntp, n_ntp = masked_ce(model.logits(h[:, first:]), ntp_t[:, first:], lay.ntp_valid[:, first:])
        a0 = first_anchor(self.kind)
        anchors = torch.arange(a0, N - 1, device=h.device)                  # regular inputs P+a0..T-1
        rope = model.rotary(pos)
        losses = []
        for head, off in zip(self.heads, self.offsets):
            target, valid = offset_targets(batch.grid, anchors.expand(B, -1), off, self.edge, batch.lengths)
            hk = head(h, rope)[:, P + a0:]
            loss_k, _ = masked_ce(model.logits(hk), batch.body.gather(1, target), valid)
            losses.append(loss_k)
        loss_aux = torch.stack(losses).mean()
        return {"loss_ntp": loss_ntp, "n_ntp": n_ntp, "loss_reg": loss_aux,
                "loss": (1 - self.reg_weight) * loss_ntp + self.reg_weight * loss_aux}


def build_objective(cfg: ObjectiveConfig, model: GPT) -> nn.Module:
    """The loss module for ``cfg.name``; it may hold parameters (multihead) to train with the model."""
    if cfg.name == "multihead":
        return MultiHead(cfg, model)
    return MuToR(cfg)
