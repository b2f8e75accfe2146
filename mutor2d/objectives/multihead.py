"""Multi-token prediction with extra heads (Gloeckle et al.-style), the baseline MuToR is
compared with: one extra transformer layer per offset on the trunk's output, all sharing the
model's final norm and LM head. Head k predicts the token at offset k from each regular input's
anchor, with the same target rule as registers (2D: the D²-1 offsets; 1D: d = max(d_min, 2)..d_max,
d = 1 being the main head).

Loss = (1 - a) * CE_ntp + a * mean_k L_head_k with a = ``reg_weight`` (held, or scheduled by
``reg_weight_schedule`` as the register objectives' a), L_head_k = CE_head_k under ``reg_target: token``,
or (1 - m) * CE_head_k + m * KL_head_k under ``self_distill``: head k at an anchor whose target is x_j
learns the model's own detached next-token distribution at regular slot P - 1 + j (base.TargetRule).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .spec import NO_REGISTERS, first_anchor
from .layout import make_layout, offset_targets
from .base import Batch, ObjectiveResult, TokenModel, mix, target_rule, token_ce
from .config import MultiHeadConfig


class MultiHead(nn.Module):
    """The heads' loss on any TokenModel: its ``head_layers`` (the GPT's fresh blocks, owned here; a
    transformers LM's own copies of its last layer, None here) and ``hidden_with_heads``.
    ``reg_weight`` is a of the current update (``set_step``, as TokenPrediction's); ``target``: what
    each head learns (base.TargetRule; the teacher of target x_j is regular slot P - 1 + j)."""

    def __init__(self, cfg: MultiHeadConfig, model: TokenModel):
        super().__init__()
        spec = cfg.register_spec()
        offsets = spec.offsets()[: cfg.num_heads or None]
        self.kind, self.edge, self.reg_weight = spec.kind, spec.edge, cfg.reg_weight
        self.schedule, self.target = cfg.weight_schedule(), target_rule(cfg)
        self.register_buffer("offsets", offsets, persistent=False)
        self.heads = model.head_layers(len(offsets))

    def set_step(self, step: int, max_steps: int) -> None:
        """Before update ``step`` (0-based) of a ``max_steps`` run: a = schedule.at(step, max_steps)."""
        if self.schedule is not None:
            self.reg_weight = self.schedule.at(step, max_steps)

    def blocks(self) -> list[nn.Module]:
        return list(self.heads or [])

    def forward(self, model: TokenModel, batch: Batch, generator: torch.Generator | None = None) -> ObjectiveResult:
        B, N = batch.body.shape
        P = model.prefix_len(batch.prefix)
        lay = make_layout(B, batch.grid, P, NO_REGISTERS, None, batch.lengths, batch.body.device)
        inputs = model.embed(batch.body[:, : N - 1], batch.prefix)
        h, head_h = model.hidden_with_heads(inputs, lay.position_ids, self.heads, prefix_len=P)
        ntp_t, _ = lay.gather_targets(batch.body)
        first = P - 1
        ntp = token_ce(model, h[:, first:], ntp_t[:, first:], lay.ntp_valid[:, first:])
        a0 = first_anchor(self.kind)
        anchors = torch.arange(a0, N - 1, device=h.device)                  # regular inputs P+a0..T-1
        losses, parts, n_heads = [], [], 0
        for hk, off in zip(head_h, self.offsets):
            target, valid = offset_targets(batch.grid, anchors.expand(B, -1), off, self.edge, batch.lengths)
            (loss_k, n_k), parts_k = self.target.loss(model, hk[:, P + a0:], batch.body.gather(1, target), valid,
                                                      h, first + target)
            losses.append(loss_k)
            parts.append(parts_k)
            n_heads = n_heads + n_k
        tokens = torch.full((), B * lay.num_regular, device=batch.body.device)
        mean_parts = {k: torch.stack([p[k] for p in parts]).mean() for k in parts[0]}
        return mix(ntp, (torch.stack(losses).mean(), n_heads), self.reg_weight, tokens, "heads", mean_parts)
