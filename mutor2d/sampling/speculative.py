"""Exact speculative decoding: register drafts (MuToR checkpoints) and speculative Jacobi decoding.

One round, per row with n body tokens emitted (x_{n-1} not yet in the KV cache):
  regular inputs [x_{n-1}, d_n, ..., d_{n+K-1}] (K drafts, some may be absent) at cache indices
  P+n-1.., so regular output j gives the target distribution p_j of body token n+j;
  drafts are verified left to right with standard speculative sampling: d_{n+i} ~ q_i is kept
  with probability min(1, p_i(d)/q_i(d)); at the first rejection the token is drawn from
  normalise(max(p_i − q_i, 0)) and the round ends; if every draft is kept (or none is left),
  one more token is drawn from the next p. Each emitted token thus follows p given the tokens
  before it, so the samples follow plain sampling's distribution. p and q are both made by
  ``SamplingRules`` (CFG, temperature, top-k, top-p); greedy makes them one-hot, which reproduces plain
  greedy decoding. Rows advance at their own pace (one cache start per row).

Drafters (who proposes d and q; any proposal is exact as long as d is drawn from the q used to
verify it):
* registers: after every regular input (anchor body token t) K registers with the checkpoint's
  draft offsets (``RegisterSpec.draft_offsets()``: (0, 2), (0, 3), ..., as many as its objective
  trained) predict x_{t+2}..x_{t+K+1} (x_{t+1} is the regular output's job). They follow the
  training rules: the position id of regular input P-1+target, they see regular inputs 0..P+t and
  themselves, are never written to the cache and no regular token sees them. A target the
  objective's edge rule makes invalid (past the end of the anchor's row under "geometric") gets no
  register; so does the anchor at the last prefix token unless the objective anchors there (1D
  offsets). K defaults to the checkpoint's useful draft length and may not exceed it
  (``useful_draft``). The next round's drafts come
  from the registers of the last kept input, so a partial acceptance needs no extra pass.
  ``anchors="last"``: registers after the last regular input only (K instead of (K+1)·K extra
  tokens per row); they draft only when every draft was kept. ``fill`` (default on): a slot
  without a register draft takes the Jacobi guess below, so drafts also cross row edges.
* jacobi (training-free): the regular outputs of this round past the kept tokens are the drafts
  of the next round (the last output stands in for positions it does not reach).
When every row starts at the same cache index (one image, or rows in step) the model gets one
int start, which takes its cheaper single-start path.

Config: ``sample.decode.name: registers`` (fields draft, anchors, fill) and ``jacobi`` (window).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..registers import RegisterSpec, first_anchor, offset_targets, regular_position_ids
from .config import JacobiDecode, RegisterDecode, useful_draft  # noqa: F401 (the modes' settings, importable from here)
from .plain import with_null_prefix
from .rules import SamplingRules, draw


# ----------------------------------------------------------------------------- the rounds


@dataclass
class Drafts:
    """tokens (B, K) long, probs (B, K, V) the distributions q they were drawn from, valid
    (B, K) bool (an invalid draft is absent; verification stops there), register (B, K) bool
    (drawn from a register; None = none was)."""
    tokens: Tensor
    probs: Tensor
    valid: Tensor
    register: Tensor | None = None

    @classmethod
    def none(cls, B: int, K: int, V: int, device) -> "Drafts":
        return cls(torch.zeros(B, K, dtype=torch.long, device=device),
                   torch.full((B, K, V), 1.0 / V, device=device),
                   torch.zeros(B, K, dtype=torch.bool, device=device))


def _uniform(shape, generator, device) -> Tensor:
    gen_device = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=gen_device).to(device)


def verify(p: Tensor, drafts: Drafts, generator) -> tuple[Tensor, Tensor, Tensor]:
    """Speculative sampling of one round. p (B, K+1, V) target distributions, drafts of K.

    Returns (kept (B,) number of drafts kept, token (B,) the token after them, lead (B, K) bool
    which drafts were kept)."""
    B, K1, V = p.shape
    K = K1 - 1
    d = drafts.tokens[..., None]
    p_d = p[:, :K].gather(-1, d)[..., 0]
    q_d = drafts.probs.gather(-1, d)[..., 0]
    ok = drafts.valid & (_uniform((B, K), generator, p.device) * q_d < p_d)   # u < p/q
    lead = ok.long().cumprod(1).bool()
    kept = lead.sum(1)
    at = kept[:, None, None].expand(B, 1, V)
    p_at = p.gather(1, at)[:, 0]
    q_at = torch.cat([drafts.probs, torch.zeros_like(p[:, :1])], 1).gather(1, at)[:, 0]
    rejected = torch.cat([drafts.valid, torch.zeros_like(drafts.valid[:, :1])], 1).gather(1, kept[:, None])
    residual = (p_at - q_at).clamp(min=0)
    mass = residual.sum(-1, keepdim=True)
    dist = torch.where(rejected & (mass > 0), residual / mass.clamp(min=1e-30), p_at)
    return kept, draw(dist, generator), lead


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
            return Drafts(draw(q, generator), q, valid, valid)
        q_jacobi, in_range = jacobi_drafts(p, kept, n_new, self.N)
        q = torch.where(valid[..., None], q, q_jacobi)
        return Drafts(draw(q, generator), q, in_range, valid)


class JacobiDrafter:
    """Drafts = this round's regular outputs past the kept tokens (see module doc)."""

    def __init__(self, num_tokens: int, K: int):
        self.N, self.K = num_tokens, K

    def extras(self, start: Tensor, cur: Tensor) -> tuple[None, None]:
        return None, None

    def first_extras(self, B: int, device) -> tuple[None, None]:
        return None, None

    def propose(self, logits: Tensor, p: Tensor, kept: Tensor, n_new: Tensor, generator) -> Drafts:
        q, in_range = jacobi_drafts(p, kept, n_new, self.N)
        return Drafts(draw(q, generator), q, in_range)


class Counts:
    """Per-run statistics of a speculative run (kept on the device until ``summary``)."""

    def __init__(self, B: int, K: int, device):
        self.B, self.forwards, self.row_forwards = B, 1, torch.tensor(B, device=device)  # the prefill
        self.proposed, self.accepted = torch.zeros(2, K, device=device), torch.zeros(2, K, device=device)

    def add(self, active: Tensor, drafts: Drafts, lead: Tensor) -> None:
        """One round: drafts proposed (reached by verification) and kept, by distance; row 1
        counts register drafts only."""
        reached = torch.cat([torch.ones_like(lead[:, :1]), lead[:, :-1]], 1) & drafts.valid & active[:, None]
        kept = lead & active[:, None]
        register = drafts.register if drafts.register is not None else torch.zeros_like(lead)
        self.forwards += 1
        self.row_forwards += active.sum()
        self.proposed += torch.stack([reached.sum(0), (reached & register).sum(0)])
        self.accepted += torch.stack([kept.sum(0), (kept & register).sum(0)])

    def summary(self, N: int) -> dict:
        row_forwards = int(self.row_forwards)
        per_image = row_forwards / self.B
        rounds = max(row_forwards - self.B, 1)
        proposed, accepted = self.proposed.cpu().long(), self.accepted.cpu().long()

        def rates(row: int) -> list[float]:
            pairs = zip(accepted[row].tolist(), proposed[row].tolist())
            return [a / p if p else float("nan") for a, p in pairs]
        out = dict(forwards=self.forwards, forwards_per_image=per_image, tokens_per_forward=N / per_image,
                   accepted_per_forward=float(accepted[0].sum()) / rounds,
                   proposed=proposed[0].tolist(), accepted=accepted[0].tolist(),
                   acceptance_by_distance=rates(0))
        if int(proposed[1].sum()):
            out.update(register_proposed=proposed[1].tolist(), register_accepted=accepted[1].tolist(),
                       register_acceptance_by_distance=rates(1))
        return out


def speculative(model, prefix: Tensor, grid: tuple[int, int], rules: SamplingRules, generator,
                stats: dict | None, K: int, make_drafter) -> Tensor:
    """The round loop shared by the drafters (see module doc) -> bodies (B, H*W)."""
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
    counts, j = Counts(B, K, device), torch.arange(K + 1, device=device)
    while bool((n < N).any()):
        active = n < N
        cur = n.clamp(max=N - 1)                       # finished rows repeat their last input
        start = P + cur - 1
        tokens = torch.cat([out.gather(1, (cur - 1)[:, None]), drafts.tokens], 1)
        positions = table[start[:, None] + j]
        extra_pos, extra_limit = drafter.extras(start, cur)
        logits = model.decode(twice(tokens), twice(positions), _shared(start, twice), None,
                              None if extra_pos is None else twice(extra_pos),
                              None if extra_limit is None else twice(extra_limit))
        logits = rules.combine(logits)
        p = rules.probs(logits[:, :K + 1])
        kept, token, lead = verify(p, drafts, generator)
        counts.add(active, drafts, lead)
        emitted = torch.cat([drafts.tokens, token[:, None]], 1).scatter(1, kept[:, None], token[:, None])
        write = (j <= kept[:, None]) & active[:, None]
        cols = torch.where(write, n[:, None] + j, torch.full_like(write, N + K, dtype=torch.long))
        out.scatter_(1, cols, emitted)
        n = torch.where(active, (n + kept + 1).clamp(max=N), n)
        drafts = drafter.propose(logits, p, kept, n, generator)
    if stats is not None:
        stats.update(counts.summary(N))
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
    if extra_pos is None:
        logits = rules.combine(model.decode(None, positions.expand(rows, P, 2), 0, prefix))
        return draw(rules.probs(logits[:, P - 1]), generator), Drafts.none(B, K, V, prefix.device)
    logits = rules.combine(model.decode(None, positions.expand(rows, P, 2), 0, prefix,
                                        twice(extra_pos), twice(extra_limit)))
    first = draw(rules.probs(logits[:, P - 1]), generator)
    q = rules.probs(logits[:, P:])
    valid = drafter.valid[:, 0]
    return first, Drafts(draw(q, generator), q, valid, valid)


def decode_registers(model, prefix, grid, rules, generator, stats=None, *, spec: RegisterSpec, draft: int,
                     anchors: str = "every", fill: bool = True) -> Tensor:
    """Speculative decoding with ``draft`` = K register drafts (the first K of ``spec.draft_offsets()``,
    the rules of the checkpoint's objective) per regular input (``anchors`` "every") or after the last
    regular input only ("last"); ``fill``: Jacobi guesses where no register drafts."""
    if not model.has_register_token:
        raise ValueError("decode='registers' needs a checkpoint trained with registers; this model "
                         "has no register embedding (use decode='jacobi' or 'plain')")
    return speculative(model, prefix, grid, rules, generator, stats, draft,
                       lambda grid, P, table: RegisterDrafter(grid, P, spec, draft, table, rules, fill, anchors))


def decode_jacobi(model, prefix, grid, rules, generator, stats=None, *, window: int) -> Tensor:
    """Speculative Jacobi decoding with a window of ``window`` = K draft tokens."""
    return speculative(model, prefix, grid, rules, generator, stats, window,
                       lambda grid, P, table: JacobiDrafter(grid[0] * grid[1], window))
