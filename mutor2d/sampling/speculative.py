"""Exact speculative decoding of images: register drafts (MuToR checkpoints) and speculative Jacobi
decoding, on the model's static KV cache.

One round, per row with n body tokens emitted (x_{n-1} not yet in the KV cache):
  regular inputs [x_{n-1}, d_n, ..., d_{n+K-1}] (K drafts, some may be absent) at cache indices
  P+n-1.., so regular output j gives the target distribution p_j of body token n+j; the drafts are
  verified by the speculative rule (``speculation``: sampled and greedy), so the samples follow
  plain sampling's distribution and greedy decoding gives plain greedy's tokens. p and q are both
  made by ``SamplingRules``. Rows advance at their own pace (one cache start per row; when every
  row starts at the same index the model gets one int start, its cheaper path).

Drafters (who proposes d and q; any proposal is exact as long as d is drawn from the q used to
verify it):
* registers: after every regular input (anchor body token t) K registers with the checkpoint's
  draft offsets (``RegisterSpec.draft_offsets()``: (0, 2), (0, 3), ...) predict x_{t+2}..x_{t+K+1}
  (x_{t+1} is the regular output's job). They follow the training rules: the position id of
  regular input P-1+target, they see regular inputs 0..P+t and themselves, are never written to
  the cache and no regular token sees them. A target the objective's edge rule makes invalid gets
  no register; so does the anchor at the last prefix token unless the objective anchors there (1D
  offsets). The next round's drafts come from the registers of the last kept input, so a partial
  acceptance needs no extra pass. ``anchors="last"``: registers after the last regular input only
  (K instead of (K+1)·K extra tokens per row; they draft only when every draft was kept). ``fill``
  (default on): a slot without a register draft takes the Jacobi guess below, so drafts also cross
  row edges.
* jacobi (training-free): the regular outputs of this round past the kept tokens are the drafts
  of the next round (the last output stands in for positions it does not reach).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..register_spec import RegisterSpec, first_anchor
from ..registers import offset_targets, regular_position_ids
from . import speculation
from .plain import Progress, with_null_prefix
from .rules import SamplingRules
from .speculation import Drafts, emitted, pick, reached
from .stats import DecodeStats


# ----------------------------------------------------------------------------- the rounds


def jacobi_drafts(p: Tensor, kept: Tensor, n_new: Tensor, N: int) -> tuple[Tensor, Tensor]:
    """The Jacobi guesses for the next round: p (B, K+1, V) of this round, kept (B,), n_new (B,)
    tokens emitted -> q (B, K, V) (regular outputs past the kept tokens; the last output stands
    in where they run out) and in_range (B, K) (the target is a body token)."""
    K, V = p.shape[1] - 1, p.shape[-1]
    i = torch.arange(K, device=p.device)
    j = (kept[:, None] + 1 + i).clamp(max=K)
    return p.gather(1, j[..., None].expand(-1, -1, V)), (n_new[:, None] + i) < N


class RegisterDrafter:
    """K registers with the first K draft offsets of ``spec`` (slot i: (0, 2 + i)) after every
    regular input of a round, or (``anchors`` "last") after the last one only (see module doc).
    With ``fill``, a draft slot that has no register (its target is invalid under the spec's edge
    rule, or the kept input carries none) takes the Jacobi guess."""

    def __init__(self, grid: tuple[int, int], prefix_len: int, spec: RegisterSpec, K: int, table: Tensor,
                 rules: SamplingRules, fill: bool = True, anchors: str = "every"):
        self.grid, self.P, self.K, self.rules, self.fill = grid, prefix_len, K, rules, fill
        self.N, dev = grid[0] * grid[1], table.device
        offsets = torch.tensor(spec.draft_offsets()[:K], dtype=torch.long).reshape(-1, 2)
        if len(offsets) < K:
            raise ValueError(f"draft={K}: the objective's registers draft at most {len(offsets)} tokens")
        self.prefix_anchor = first_anchor(spec.kind) < 0         # registers at the last prefix token
        anchor_t = torch.arange(-1, self.N + K)[:, None].expand(-1, K)     # row a: anchor t = a - 1
        target, valid = offset_targets(grid, anchor_t, offsets, spec.edge)
        self.positions = table[prefix_len - 1 + target.to(dev)]             # (N+K+1, K, 2)
        self.valid_table = valid.to(dev)                                      # (N+K+1, K)
        self.inputs = torch.arange(0 if anchors == "every" else K, K + 1, device=dev)
        self.slot = torch.full((K + 1,), -1, dtype=torch.long, device=dev)  # input j -> its slot
        self.slot[self.inputs] = torch.arange(len(self.inputs), device=dev)
        self.valid = None

    def extras(self, start: Tensor, cur: Tensor) -> tuple[Tensor, Tensor]:
        """Rows with cur tokens emitted -> register position ids (B, E, 2) and read limits (B, E),
        E = A·K for the A inputs carrying registers, input-major."""
        B, K, j = start.shape[0], self.K, self.inputs
        row = cur[:, None] + j                                               # anchor t = cur - 1 + j
        self.valid = self.valid_table[row]                                   # (B, A, K)
        limit = (start[:, None] + j)[:, :, None].expand(B, len(j), K).reshape(B, -1)
        return self.positions[row].reshape(B, -1, 2), limit

    def first_extras(self, B: int, device) -> tuple[Tensor | None, Tensor | None]:
        """Registers anchored at the last prefix token (t = -1, virtual cell (0, -1)), drafting
        x_1..x_K during the prefill: only where the objective anchors there (1D offsets)."""
        if not self.prefix_anchor:
            return None, None
        self.valid = self.valid_table[:1].expand(B, 1, self.K)
        limit = torch.full((B, self.K), self.P - 1, device=device)
        return self.positions[0].expand(B, self.K, 2), limit

    def propose(self, logits: Tensor, p: Tensor, kept: Tensor, n_new: Tensor, generator) -> Drafts:
        """Drafts for the next round from the registers of the last kept input (else Jacobi's)."""
        B, K, A = logits.shape[0], self.K, len(self.inputs)
        rows, slot = torch.arange(B, device=kept.device), self.slot[kept]
        reg = logits[:, K + 1:].unflatten(1, (A, K))[rows, slot.clamp(min=0)]    # (B, K, V)
        q = self.rules.probs(reg)
        valid = self.valid[rows, slot.clamp(min=0)] & (slot >= 0)[:, None]
        if not self.fill:
            return Drafts.drawn(q, valid, self.rules.greedy, generator, valid)
        q_jacobi, in_range = jacobi_drafts(p, kept, n_new, self.N)
        q = torch.where(valid[..., None], q, q_jacobi)
        return Drafts.drawn(q, in_range, self.rules.greedy, generator, valid)


class JacobiDrafter:
    """Drafts = this round's regular outputs past the kept tokens (see module doc)."""

    def __init__(self, num_tokens: int, K: int, rules: SamplingRules):
        self.N, self.K, self.greedy = num_tokens, K, rules.greedy

    def extras(self, start: Tensor, cur: Tensor) -> tuple[None, None]:
        return None, None

    def first_extras(self, B: int, device) -> tuple[None, None]:
        return None, None

    def propose(self, logits: Tensor, p: Tensor, kept: Tensor, n_new: Tensor, generator) -> Drafts:
        q, in_range = jacobi_drafts(p, kept, n_new, self.N)
        return Drafts.drawn(q, in_range, self.greedy, generator)


def speculative(model, prefix: Tensor, grid: tuple[int, int], rules: SamplingRules, generator,
                stats: DecodeStats | None, K: int, make_drafter, progress: Progress | None = None) -> Tensor:
    """The round loop shared by the drafters (see module doc) -> bodies (B, H*W); ``progress`` sees
    every round's."""
    device = model.output.weight.device
    prefix = prefix.to(device)
    B, N = prefix.shape[0], grid[0] * grid[1]
    P = model.prefix_len(prefix)
    prefix = with_null_prefix(model, prefix, rules)
    rows = prefix.shape[0]
    twice = (lambda t: torch.cat([t, t])) if rules.guided else (lambda t: t)
    table = regular_position_ids(grid, P, P + N + K).to(device)
    drafter = make_drafter(grid, P, table)
    model.setup_cache(rows, P + N - 1 + K)
    out = torch.zeros(B, N + K + 1, dtype=torch.long, device=device)
    out[:, 0], drafts = _prefill(model, prefix, table[:P], rules, drafter, twice, generator)
    n = torch.ones(B, dtype=torch.long, device=device)
    counts, j = DecodeStats(), torch.arange(K + 1, device=device)
    counts.add_plain(B, B * N, 1, B)                   # the prefill
    while bool((n < N).any()):
        active = n < N
        cur = n.clamp(max=N - 1)                       # finished rows repeat their last input
        start = P + cur - 1
        tokens = torch.cat([out.gather(1, (cur - 1)[:, None]), drafts.tokens], 1)
        positions = table[start[:, None] + j]
        extra_pos, extra_limit = drafter.extras(start, cur)
        extras = () if extra_pos is None else (twice(extra_pos), twice(extra_limit))
        logits = model.decode(twice(tokens), twice(positions), _shared(start, twice), None, *extras)
        logits = rules.combine(logits)
        p = rules.probs(logits[:, :K + 1])
        kept, token, lead = speculation.verify(p, drafts, generator)
        counts.add_round(active, reached(lead, drafts.valid), lead, drafts.register)
        write = (j <= kept[:, None]) & active[:, None]
        cols = torch.where(write, n[:, None] + j, torch.full_like(write, N + K, dtype=torch.long))
        out.scatter_(1, cols, emitted(drafts.tokens, kept, token))
        n = torch.where(active, (n + kept + 1).clamp(max=N), n)
        drafts = drafter.propose(logits, p, kept, n, generator)
        if progress is not None:
            progress(out[:, :N], n)
    if stats is not None:
        stats.merge(counts)
    return out[:, :N]


def _shared(start: Tensor, twice) -> int | Tensor:
    """Cache starts (B,) -> one int when every row starts at the same index (the model then
    takes its single-start path: slices, no scatter, causal attention without extras), else
    the per-row starts for all rows."""
    first = int(start[0])
    return first if bool((start == first).all()) else twice(start)


def _prefill(model, prefix: Tensor, positions: Tensor, rules: SamplingRules, drafter, twice, generator):
    """Prefix step -> (x_0 (B,), drafts for x_1.. from registers anchored at the prefix, if any)."""
    rows, P = prefix.shape[0], positions.shape[0]
    B, K, V = (rows // 2 if rules.guided else rows), drafter.K, model.cfg.vocab_size
    extra_pos, extra_limit = drafter.first_extras(B, prefix.device)
    extras = () if extra_pos is None else (twice(extra_pos), twice(extra_limit))
    logits = rules.combine(model.decode(None, positions.expand(rows, P, 2), 0, prefix, *extras))
    first = pick(rules.probs(logits[:, P - 1]), rules.greedy, generator)
    if extra_pos is None:
        return first, Drafts.none(B, K, V, rules.greedy, prefix.device)
    valid = drafter.valid[:, 0]
    return first, Drafts.drawn(rules.probs(logits[:, P:]), valid, rules.greedy, generator, valid)


def decode_registers(model, prefix, grid, rules, generator, stats=None, *, spec: RegisterSpec, draft: int,
                     anchors: str = "every", fill: bool = True, progress: Progress | None = None) -> Tensor:
    """Speculative decoding with ``draft`` = K register drafts (the first K of ``spec.draft_offsets()``,
    the rules of the checkpoint's objective) per regular input (``anchors`` "every") or after the last
    regular input only ("last"); ``fill``: Jacobi guesses where no register drafts."""
    if not model.has_register_token:
        raise ValueError("decode='registers' needs a checkpoint trained with registers; this model "
                         "has no register embedding (use decode='jacobi' or 'plain')")
    return speculative(model, prefix, grid, rules, generator, stats, draft,
                       lambda grid, P, table: RegisterDrafter(grid, P, spec, draft, table, rules, fill, anchors),
                       progress)


def decode_jacobi(model, prefix, grid, rules, generator, stats=None, *, window: int,
                  progress: Progress | None = None) -> Tensor:
    """Speculative Jacobi decoding with a window of ``window`` = K draft tokens."""
    return speculative(model, prefix, grid, rules, generator, stats, window,
                       lambda grid, P, table: JacobiDrafter(grid[0] * grid[1], window, rules), progress)
