"""A batch of (prompt, answer) pairs in the canonical frame the objectives see, and where each of its
slots sits in the shorter physical sequence the transformers model runs on (rules: mutor2d.objectives.layout).

Canonical frame (:func:`canonical`): prompts left-padded to P_max, answers right-padded to the line width
W, so all answers start at column P_max (a Batch on the grid 1 x W). Canonical index = real index + P_max - P_b.
Physical sequence (:class:`Frame`): real tokens keep their canonical rank; padding slots get rank NEVER and
limit -1; max_b(P_b + N_b - 1) regular slots, then the register slots. Position ids = canonical - (P_max - P_b).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from ..model.attention import NEVER, Visibility
from ..objectives.spec import RegisterSpec, num_anchors


@dataclass
class LMBatch:
    """prompt (B, P_max) and answer (B, N_max) long, both right-padded; *_len (B,) real lengths."""
    prompt: Tensor
    prompt_len: Tensor
    answer: Tensor
    answer_len: Tensor


def line_width(spec: RegisterSpec, longest: int) -> int:
    """The narrowest line (1, width), width >= ``longest``, that ``spec`` accepts (RegisterSpec.check_layout)."""
    width = max(longest, getattr(spec, "d_min", 0))
    if spec.uses_registers() and spec.placement == "sparse":
        width += max(0, spec.num_registers - num_anchors(spec.kind, (1, width)))
    return width


def canonical(batch: LMBatch, width: int) -> tuple[Tensor, Tensor]:
    """(prefix (B, P_max): prompts left-padded with 0, body (B, width): answers right-padded with 0)."""
    P = batch.prompt_len.long()
    B, P_max = len(P), int(P.max())
    j = torch.arange(P_max)[None, :] - (P_max - P)[:, None]          # real prompt index of each column
    prefix = batch.prompt.gather(1, j.clamp(0, batch.prompt.shape[1] - 1))
    body = torch.zeros(B, width, dtype=torch.long)
    body[:, :batch.answer.shape[1]] = batch.answer[:, :width]
    return torch.where(j >= 0, prefix, torch.zeros_like(prefix)), body


@dataclass
class Frame:
    """Where the T_can = P_max + W - 1 canonical regular slots sit among the T physical ones: index (B, T),
    real (B, T) bool, slot (B, T_can) (T where none), shift (B, 1) = P_max - P_b."""
    index: Tensor
    real: Tensor
    slot: Tensor
    shift: Tensor

    @property
    def num_regular(self) -> int:
        return self.index.shape[1]

    @property
    def num_canonical(self) -> int:
        return self.slot.shape[1]

    def to(self, device) -> "Frame":
        return Frame(*(t.to(device, non_blocking=True) for t in (self.index, self.real, self.slot, self.shift)))

    def regular(self, x: Tensor, fill) -> Tensor:
        """Canonical regular slots x (B, T_can, ...) -> physical (B, T, ...), ``fill`` in padding slots."""
        idx = self.index.view(*self.index.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])
        real = self.real.view(*self.real.shape, *([1] * (x.dim() - 2)))
        return torch.where(real, x.gather(1, idx), torch.full_like(x[:, :1], fill))

    def canonical(self, x: Tensor) -> Tensor:
        """Physical regular slots x (B, T, D) -> canonical (B, T_can, D), zeros where no slot is real."""
        padded = torch.cat([x, x.new_zeros(x.shape[0], 1, x.shape[2])], 1)
        return padded.gather(1, self.slot[..., None].expand(-1, -1, x.shape[2]))

    def positions(self, col: Tensor) -> Tensor:
        """Canonical position ids (B, T_can + E) -> physical (B, T + E), counted from each first real token."""
        T_can = self.num_canonical
        return torch.cat([self.regular(col[:, :T_can] - self.shift, 0), col[:, T_can:] - self.shift], 1)

    def visibility(self, vis: Visibility) -> Visibility:
        """A canonical rule over T_can + E slots -> the physical T + E: ranks and limits kept, padding NEVER seen."""
        T_can = self.num_canonical

        def place(rank: Tensor, limit: Tensor) -> tuple[Tensor, Tensor]:
            return (torch.cat([self.regular(rank[:, :T_can], NEVER), rank[:, T_can:]], 1),
                    torch.cat([self.regular(limit[:, :T_can], -1), limit[:, T_can:]], 1))
        pair = place(vis.extra_rank, vis.extra_limit) if vis.extra_rank is not None else (None, None)
        return Visibility(*place(vis.key_rank, vis.query_limit), self.num_regular, None, *pair)


def frame(prompt_len: Tensor, answer_len: Tensor, width: int, padding_side: str = "right") -> Frame:
    """The Frame of a batch with these real lengths (B,) on a line of ``width`` columns."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side={padding_side!r}: expected 'left' or 'right'")
    P, N = prompt_len.long(), answer_len.long()
    if (P < 1).any() or (N < 2).any():
        raise ValueError(f"prompt lengths {P.tolist()} / answer lengths {N.tolist()}: need >= 1 / >= 2")
    P_max = int(P.max())
    n_real = P + N - 1                                        # regular inputs per sample
    T, T_can = int(n_real.max()), P_max + width - 1
    lead = (T - n_real) if padding_side == "left" else torch.zeros_like(n_real)
    shift = (P_max - P)[:, None]
    j = torch.arange(T)[None, :] - lead[:, None]              # real index of each physical slot
    real = (j >= 0) & (j < n_real[:, None])
    index = torch.where(real, j + shift, torch.zeros_like(j))
    jc = torch.arange(T_can)[None, :] - shift                 # real index of each canonical slot
    slot = torch.where((jc >= 0) & (jc < n_real[:, None]), jc + lead[:, None], torch.full_like(jc, T))
    return Frame(index, real, slot, shift)


def collate(examples: list[tuple[list[int], list[int]]], pad_id: int = 0) -> LMBatch:
    """Right-pad prompts and answers into an LMBatch."""
    prompts, answers = ([torch.tensor(x, dtype=torch.long) for x in side] for side in zip(*examples))
    P, N = (torch.tensor([len(x) for x in side]) for side in (prompts, answers))
    pad = partial(pad_sequence, batch_first=True, padding_value=pad_id)
    return LMBatch(pad(prompts), P, pad(answers), N)
