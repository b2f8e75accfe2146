"""Who proposes each round's drafts d and their distributions q (``rounds``): one drafter per mode,
made per batch by the ``build`` of its ``sample.decode`` variant (a drafter class or ``build_auto``)
from the fitted mode, the checkpoint's RegisterSpec, the body grid (H, W), the rows and the device;
nothing in it changes between calls. Any proposal is exact when d is drawn from the q verifying it.

* ``Drafter``: none (plain decoding, K = 0).
* ``JacobiDrafter`` (training-free): this round's regular outputs past the kept tokens.
* ``RegisterDrafter``: K registers after every regular input of a round (``anchors="last"``: after
  the last one), with the checkpoint's draft offsets (0, 2), (0, 3), ... (``RegisterSpec.draft_offsets``)
  and the training rules (``registers.register_position_ids``, ``model.extras.register_visibility``);
  a target the spec's edge rule makes invalid gets no draft, the last prefix token anchors registers
  only for 1D offsets. The next drafts come from the registers of the last kept input; ``fill``: a
  slot without one takes the Jacobi guess, so drafts also cross row edges.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..config import make
from ..objectives.spec import RegisterSpec, first_anchor
from ..objectives.layout import offset_targets, register_position_ids
from ..registry import build
from .auto import auto_decode, can_draft
from .rounds import Extras, Frame, Round
from .verification import Drafts


class Drafter:
    """No drafts: plain decoding (K = 0), the rounds' degenerate case."""
    K = 0
    needs_registers = False      # whether the model must have its register embedding

    def __init__(self, mode=None, spec: RegisterSpec | None = None, grid=None, batch: int = 0, device=None):
        """A drafter class is its mode's builder: (fitted mode, RegisterSpec, grid (H, W), rows, device)."""

    def prefix_extras(self, frame: Frame, B: int) -> Extras | None:
        """The registers of the prefill (anchored at the last prefix token), or None."""
        return None

    def extras(self, frame: Frame, cur: Tensor) -> Extras | None:
        """The registers of a round for rows with ``cur`` (B,) tokens emitted (its first input x_{cur-1}), or None."""
        return None

    def propose(self, r: Round) -> Drafts:
        """The next round's drafts, from this round's forward (here: K absent ones)."""
        return Drafts.none(r.p.shape[0], self.K, r.p.shape[-1], r.rules.greedy, r.p.device)

    first = propose      # the first round's drafts, from the prefill's round: K absent ones


def jacobi_drafts(r: Round) -> tuple[Tensor, Tensor]:
    """The Jacobi guesses for the next round -> q (B, K, V) (this round's regular outputs past the kept
    tokens; the last output stands in where they run out) and in_range (B, K) (the target is a body
    token the row can emit)."""
    K, V = r.p.shape[1] - 1, r.p.shape[-1]
    i = torch.arange(K, device=r.p.device)
    j = (r.kept[:, None] + 1 + i).clamp(max=K)
    return r.p.gather(1, j[..., None].expand(-1, -1, V)), r.frame.holds(r.n[:, None] + i)


class JacobiDrafter(Drafter):
    """A window of ``mode.window`` = K Jacobi guesses (module doc)."""

    def __init__(self, mode, spec=None, grid=None, batch=0, device=None):
        self.K = mode.window

    def propose(self, r):
        q, in_range = jacobi_drafts(r)
        return Drafts.drawn(q, in_range, r.rules.greedy, r.generator)


class RegisterDrafter(Drafter):
    """K = ``mode.draft`` registers with the first K draft offsets of ``spec`` (slot i: (0, 2 + i)) after
    every regular input of a round, or (``mode.anchors`` "last") after the last one only, on bodies of
    ``grid`` (H, W) decoded on ``device``; with ``mode.fill``, Jacobi guesses where no register drafts."""
    needs_registers = True

    def __init__(self, mode, spec: RegisterSpec, grid: tuple[int, int], batch: int, device):
        K = mode.draft
        offsets = torch.tensor(spec.draft_offsets()[:K], dtype=torch.long).reshape(-1, 2)
        if len(offsets) < K:
            raise ValueError(f"draft={K}: the objective's registers draft at most {len(offsets)} tokens")
        self.spec, self.K, self.fill, dev = spec, K, mode.fill, device
        anchor = torch.arange(-1, grid[0] * grid[1] + K)[:, None].expand(-1, K)   # row a: anchor t = a - 1
        target, valid = offset_targets(grid, anchor, offsets, spec.edge)
        self.target, self.valid = target.to(dev), valid.to(dev)               # (N+K+1, K)
        self.inputs = torch.arange(0 if mode.anchors == "every" else K, K + 1, device=dev)
        self.slot = torch.full((K + 1,), -1, dtype=torch.long, device=dev)  # input j -> its slot
        self.slot[self.inputs] = torch.arange(len(self.inputs), device=dev)

    def _extras(self, frame: Frame, row: Tensor, reads: Tensor) -> Extras:
        """The registers of anchors ``row`` - 1 (B, A), each reading up to regular input ``reads`` (B, A)."""
        B, A, K = *row.shape, self.K
        target = self.target[row]                                            # (B, A, K)
        positions = register_position_ids(frame.positions, frame.P, target).reshape(B, -1, 2)
        return Extras(positions, reads[..., None].expand(B, A, K).reshape(B, -1),
                      self.valid[row] & frame.holds(target))

    def prefix_extras(self, frame, B):
        if first_anchor(self.spec.kind) >= 0:
            return None
        row = torch.zeros(B, 1, dtype=torch.long, device=self.target.device)
        return self._extras(frame, row, row + frame.P - 1)

    def extras(self, frame, cur):
        return self._extras(frame, cur[:, None] + self.inputs, self.inputs.expand(len(cur), -1))

    def first(self, r):
        """From the registers anchored at the last prefix token, where the spec anchors there."""
        if r.extras is None:
            return super().first(r)
        valid = r.extras.valid[:, 0]
        return Drafts.drawn(r.rules.probs(r.step.logits(r.out[:, 1:])), valid, r.rules.greedy, r.generator, valid)

    def propose(self, r):
        """From the registers of the last kept input (else, with ``fill``, Jacobi's)."""
        B, K, A = r.p.shape[0], self.K, len(self.inputs)
        rows, slot = torch.arange(B, device=r.kept.device), self.slot[r.kept]
        reg = r.out[:, K + 1:].unflatten(1, (A, K))[rows, slot.clamp(min=0)]                   # (B, K, ·)
        q, greedy = r.rules.probs(r.step.logits(reg)), r.rules.greedy
        valid = r.extras.valid[rows, slot.clamp(min=0)] & (slot >= 0)[:, None]
        if not self.fill:
            return Drafts.drawn(q, valid, greedy, r.generator, valid)
        q_jacobi, in_range = jacobi_drafts(r)
        return Drafts.drawn(torch.where(valid[..., None], q, q_jacobi), in_range, greedy, r.generator, valid)


def build_auto(mode, spec, grid, batch, device) -> Drafter:
    """The measured fastest exact mode for ``batch`` rows on ``device`` (``auto.auto_decode``), fitted."""
    chosen = make("sample.decode", name=auto_decode(batch, device, can_draft(spec))).fit(spec, grid)
    return build(chosen, spec, grid, batch, device)
