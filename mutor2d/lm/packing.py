"""Pack a batch of (prompt, answer) pairs into one padded sequence per sample, with registers.

Rules come from mutor2d.registers; nothing here restates them. A sample is prompt p_0..p_{P-1}
(the prefix) and answer a_0..a_{N-1} (the body, a 1 x N line). Its regular inputs are
prompt + a_0..a_{N-2} (P + N - 1 tokens); regular input j predicts a_{j-P+1} (loss only on the
answer). A MuToR-1D register anchored at answer token t (t = -1: the last prompt token) predicts
a_{t+d}; it sees the regular inputs up to its anchor and itself, nothing later, no other register;
its position id is that of the regular input predicting its target under next-token prediction.

Variable prompt lengths. ``make_layout`` takes one prefix length per call. We call it once per
batch on a *canonical frame*: every prompt left-padded to P_max and every answer right-padded to
N_max, so all answers start at column P_max and one prefix length is exact for every sample
(answer lengths go in ``lengths``). The canonical index of a real token is its real index plus
P_max - P_b. The attention rule (attention.Visibility) names tokens by rank, not by place, so each
real token keeps its canonical rank wherever it physically sits; padding slots get rank NEVER (no
one sees them) and limit -1 (they see only themselves). That lets the physical sequence be padded
on either side (``padding_side``) and be as short as max_b(P_b + N_b - 1) regular slots, with the
registers appended after the regular block. Position ids are the canonical ones minus
P_max - P_b, i.e. counted from each sequence's first real token (as a left-padded HF model would).
No grouping by length is needed and no canonical padding token is ever computed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..attention import NEVER, Visibility
from ..registers import Layout, RegisterSpec, make_layout, num_anchors


@dataclass
class LMBatch:
    """prompt (B, P_max) and answer (B, N_max) long, both right-padded; *_len (B,) real lengths."""
    prompt: Tensor
    prompt_len: Tensor
    answer: Tensor
    answer_len: Tensor


@dataclass
class Packed:
    """One model input. L = T + R: T regular slots then R register slots.

    input_ids (B, T) regular tokens (pad id in padding slots); position_ids (B, L);
    visibility: the rule over the L slots (dense mask via ``attention_mask()``); real (B, T) bool
    real regular slots; ntp_mask / ntp_targets (B, T): slots with a loss and their answer token;
    reg_valid / reg_targets (B, R); layout: the canonical-frame Layout (for inspection)."""
    input_ids: Tensor
    position_ids: Tensor
    visibility: Visibility
    real: Tensor
    ntp_mask: Tensor
    ntp_targets: Tensor
    reg_valid: Tensor
    reg_targets: Tensor
    layout: Layout

    @property
    def num_registers(self) -> int:
        return self.reg_targets.shape[1]

    def attention_mask(self) -> Tensor:
        """(B, 1, L, L) bool, True = may attend."""
        return self.visibility.dense_mask()

    def to(self, device) -> "Packed":
        vis = Visibility(self.visibility.key_rank.to(device), self.visibility.query_limit.to(device),
                         self.visibility.num_regular)
        moved = {k: v.to(device) for k, v in vars(self).items() if isinstance(v, Tensor)}
        return Packed(visibility=vis, layout=self.layout, **moved)


def line_width(spec: RegisterSpec, longest: int) -> int:
    """The narrowest line (1, width), width >= ``longest`` (the longest answer), that ``spec`` accepts
    (RegisterSpec.check: d_min columns, and for sparse placement num_registers anchors, counted by
    registers.num_anchors). Columns past an answer's length are padding, masked by ``lengths``."""
    width = max(longest, spec.d_min if spec.uses_registers else 0)
    if spec.uses_registers and spec.placement == "sparse":
        width += max(0, spec.num_registers - num_anchors(spec.kind, (1, width)))
    return width


def pack(batch: LMBatch, spec: RegisterSpec, padding_side: str = "right", pad_id: int = 0,
         generator: torch.Generator | None = None) -> Packed:
    """Build the physical sequence of ``batch`` (CPU tensors) under ``spec`` (for a run config:
    ``cfg.objective.register_spec()``)."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side={padding_side!r}: expected 'left' or 'right'")
    P, N = batch.prompt_len.long(), batch.answer_len.long()
    if (P < 1).any() or (N < 2).any():
        raise ValueError(f"prompt lengths {P.tolist()} / answer lengths {N.tolist()}: need >= 1 / >= 2")
    B, P_max = len(P), int(P.max())
    width = line_width(spec, int(N.max()))
    layout = make_layout(B, (1, width), P_max, spec, generator, lengths=N)
    T_can = layout.num_regular
    answer = torch.zeros(B, width, dtype=torch.long)
    answer[:, :batch.answer.shape[1]] = batch.answer[:, :width]
    ntp_tok, reg_targets = layout.gather_targets(answer)

    n_real = P + N - 1                                        # regular inputs per sample
    T = int(n_real.max())
    lead = (T - n_real) if padding_side == "left" else torch.zeros_like(n_real)
    j = torch.arange(T)[None, :] - lead[:, None]              # real index of each physical slot
    real = (j >= 0) & (j < n_real[:, None])
    shift = (P_max - P)[:, None]
    i = torch.where(real, j + shift, torch.zeros_like(j))     # canonical index (0 where padding)

    prompt_part = batch.prompt.gather(1, j.clamp(0, batch.prompt.shape[1] - 1))
    answer_part = answer.gather(1, (j - P[:, None]).clamp(0, width - 1))
    input_ids = torch.where(j < P[:, None], prompt_part, answer_part)
    input_ids = torch.where(real, input_ids, torch.full_like(input_ids, pad_id))

    rank = torch.where(real, layout.key_rank.gather(1, i), torch.full_like(i, NEVER))
    limit = torch.where(real, layout.query_limit.gather(1, i), torch.full_like(i, -1))
    col = layout.position_ids[..., 1]                         # a line: position = column
    pos_regular = torch.where(real, col.gather(1, i) - shift, torch.zeros_like(i))
    pos_reg = torch.where(layout.reg_valid, col[:, T_can:] - shift, torch.zeros_like(reg_targets))
    vis = Visibility(torch.cat([rank, layout.key_rank[:, T_can:]], 1),
                     torch.cat([limit, layout.query_limit[:, T_can:]], 1), num_regular=T)
    ntp_mask = real & layout.ntp_valid.gather(1, i)
    ntp_targets = torch.where(ntp_mask, ntp_tok.gather(1, i), torch.zeros_like(i))
    return Packed(input_ids, torch.cat([pos_regular, pos_reg], 1), vis, real, ntp_mask,
                  ntp_targets, layout.reg_valid, reg_targets, layout)
