"""Register layout for MuToR (multi-token prediction with registers): pure tensor code, no model.

Sequence terms. A sample has P prefix tokens (class token or prompt) and a body x_0..x_{N-1} on a
grid (H, W), N = H*W, raster order; 1D data is H = 1. The *regular inputs* are
prefix + x_0..x_{N-2}: T = P + N - 1 tokens; regular input i predicts body token i - (P - 1).

Registers. A register is anchored at body token x_t (regular input P + t) and predicts the body
token at grid offset (Δr, Δc): cell (row(t)+Δr, col(t)+Δc). For MuToR-1D the last prefix token is an
anchor too (t = -1, virtual cell (0, -1)). A target off the grid (below the last row, or past the
right edge under the default "geometric" rule) is invalid; the "raster" rule instead takes
x_{t + Δr*W + Δc} and is only invalid past the end. A register's position id is that of the regular
input that predicts its target under next-token prediction (regular input P - 1 + target).

Attention (see attention.Visibility): regular input i sees regular inputs 0..i; a register anchored
at x_t sees regular inputs 0..P+t and itself (with ``register_visibility: earlier_registers`` also
the registers anchored before x_t). Physical order: regular block first, registers after.

Position ids are (row, col) pairs. On a grid with H > 1 the prefix has no cell: (-1, -1); body token
t is at (t // W, t % W). On a line (H = 1) the prefix lies on the line: regular input i is at (0, i).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from ..model.attention import Visibility
from ..model.extras import register_visibility
from .spec import LayoutError, RegisterSpec, first_anchor


def offset_targets(grid: tuple[int, int], anchors: Tensor, offsets: Tensor, edge: str,
                   lengths: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Targets of ``anchors`` (..., ) body indices under ``offsets`` (..., 2), broadcast together.

    Returns (target body index, clamped into range where invalid; valid bool). ``lengths`` (B,)
    limits valid targets per sample (padded 1D data); shapes must then start with B.
    """
    H, W = grid
    N = H * W
    dr, dc = offsets[..., 0], offsets[..., 1]
    if edge == "raster":
        target = anchors + dr * W + dc
        valid = target < N
    else:
        row = anchors.clamp(min=0) // W                         # anchor -1: the virtual cell (0, -1)
        col = torch.where(anchors < 0, -1, anchors % W)
        tr, tc = row + dr, col + dc
        valid = (tr < H) & (tc < W) & (tc >= 0)
        target = tr * W + tc
    if lengths is not None:
        valid = valid & (target < lengths.view(-1, *([1] * (target.dim() - 1))))
    target = torch.where(valid, target, torch.zeros_like(target))
    return target, valid


def regular_position_ids(grid: tuple[int, int], prefix_len: int, length: int | None = None,
                         device: torch.device | str | None = None) -> Tensor:
    """(L, 2) position ids of the first ``length`` tokens of prefix + body (default: T inputs)."""
    H, W = grid
    P = prefix_len
    L = P + H * W - 1 if length is None else length
    i = torch.arange(L, device=device)
    if H == 1:
        return torch.stack([torch.zeros_like(i), i], dim=-1)
    t = (i - P).clamp(min=0)
    pos = torch.stack([t // W, t % W], dim=-1)
    return torch.where((i < P)[:, None], torch.full_like(pos, -1), pos)


def position_at(regular: Tensor, index: Tensor) -> Tensor:
    """The position ids (B, ..., 2) of regular inputs ``index`` (B, ...), from ``regular`` (L, 2) the ids
    of every regular input, or (B, L, 2) one row of them per sample."""
    if regular.dim() == 2:
        return regular[index]
    rows = torch.arange(regular.shape[0], device=index.device).view(-1, *[1] * (index.dim() - 1))
    return regular[rows, index]


def register_position_ids(regular: Tensor, prefix_len: int, target: Tensor) -> Tensor:
    """Position ids (B, ..., 2) of registers whose targets are the body indices ``target`` (B, ...): those
    of regular input P - 1 + target, the one that predicts the target under next-token prediction
    (``regular`` as in ``position_at``)."""
    return position_at(regular, prefix_len - 1 + target)


@dataclass
class Layout:
    """Everything the model and the loss need for one batch. Shapes: B samples, T regular
    inputs, R register slots (padded; ``reg_valid`` says which are real). Physical order:
    regular inputs 0..T-1, then registers T..T+R-1."""
    grid: tuple[int, int]
    prefix_len: int
    position_ids: Tensor    # (B, T+R, 2) long
    key_rank: Tensor        # (B, T+R) long
    query_limit: Tensor     # (B, T+R) long
    ntp_target: Tensor      # (B, T) body index each regular input predicts (clamped)
    ntp_valid: Tensor       # (B, T) bool: has a loss (not prefix-internal, not padding)
    reg_anchor: Tensor      # (B, R) body index of the anchor (-1 = last prefix token)
    reg_offset: Tensor      # (B, R, 2) (Δr, Δc)
    reg_target: Tensor      # (B, R) body index of the target (clamped)
    reg_valid: Tensor       # (B, R) bool
    extra_rank: Tensor | None = None    # (B, T+R) long: earlier_registers' second pair (attention), else None
    extra_limit: Tensor | None = None   # (B, T+R) long

    @property
    def num_regular(self) -> int:
        return self.ntp_target.shape[1]

    @property
    def num_registers(self) -> int:
        return self.reg_target.shape[1]

    @property
    def visibility(self) -> Visibility | None:
        """The attention rule for the model; None = plain causal (no registers)."""
        if self.num_registers == 0:
            return None
        return Visibility(self.key_rank, self.query_limit, self.num_regular, None, self.extra_rank, self.extra_limit)

    def dense_mask(self) -> Tensor:
        """(B, T+R, T+R) bool attention matrix (True = may attend); for SDPA and pictures."""
        return Visibility(self.key_rank, self.query_limit, None, None, self.extra_rank,
                          self.extra_limit).dense_mask()[:, 0]

    def gather_targets(self, body: Tensor) -> tuple[Tensor, Tensor]:
        """body (B, N) tokens -> (ntp targets (B, T), register targets (B, R))."""
        return body.gather(1, self.ntp_target), body.gather(1, self.reg_target)

    def interleaved_order(self) -> Tensor:
        """(B, T+R) permutation placing each register right after its anchor (the logical
        order of the paper), unused register slots last. ``x[b, order[b]]`` reorders tokens."""
        B, T, R = self.reg_target.shape[0], self.num_regular, self.num_registers
        reg_key = torch.where(self.reg_valid, 2 * (self.prefix_len + self.reg_anchor) + 1,
                              torch.full_like(self.reg_anchor, 4 * (T + R)))
        key = torch.cat([2 * torch.arange(T, device=reg_key.device).expand(B, T), reg_key], 1)
        return torch.argsort(key, dim=1, stable=True)


def make_layout(batch_size: int, grid: tuple[int, int], prefix_len: int, spec: RegisterSpec,
                generator: torch.Generator | None = None, lengths: Tensor | None = None,
                device: torch.device | str | None = None) -> Layout:
    """Build the layout of one batch.

    lengths: (B,) number of real body tokens per sample (1D padding, right-padded); None = full.
    Offsets: one per sequence drawn from the candidates by ``spec.offset_distribution`` (uniform by
    default; ``per_register_offsets``: one per anchor). Dense: every anchor with a valid target gets a
    register; R is fixed by the spec and the grid (``dense_slots``), so shapes never change from batch
    to batch. Sparse: K anchors drawn without replacement among the valid ones (fewer if fewer are
    valid); unused slots are padding.

    The random draws happen on the generator's device (CPU without one) and every tensor is built
    there, with no host round trip (nothing reads a value back): a CUDA generator keeps the whole
    layout on the GPU, so the host can queue the next step ahead.
    """
    spec.check_layout(grid, prefix_len)
    H, W = grid
    N, P, B = H * W, prefix_len, batch_size
    T = P + N - 1
    device = torch.device(device) if device is not None else None
    draw_on = generator.device if generator is not None else (device or torch.device("cpu"))
    if lengths is not None:
        lengths = torch.as_tensor(lengths, dtype=torch.long)
        _check_lengths(lengths, B, N)
        lengths = lengths.to(draw_on, non_blocking=True)

    reg_pos = regular_position_ids(grid, P, device=draw_on)                  # (T, 2)
    i = torch.arange(T, device=draw_on)
    ntp_target = (i - (P - 1)).clamp(min=0).expand(B, T)
    ntp_valid = (i >= P - 1).expand(B, T)
    if lengths is not None:
        ntp_valid = ntp_valid & (ntp_target < lengths[:, None])
    ntp_target = torch.where(ntp_valid, ntp_target, torch.zeros_like(ntp_target))
    reg_anchor, reg_offset, reg_target, reg_valid = _place_registers(B, grid, spec, generator, lengths, draw_on)

    position_ids = torch.cat([reg_pos.expand(B, T, 2), register_position_ids(reg_pos, P, reg_target)], dim=1)
    reg_limit = torch.where(reg_valid, P + reg_anchor, torch.full_like(reg_anchor, -1))
    vis = register_visibility(i.expand(B, T), i.expand(B, T), reg_limit,
                              earlier_registers=spec.register_visibility == "earlier_registers")
    out = Layout(grid, P, position_ids, vis.key_rank, vis.query_limit, ntp_target, ntp_valid,
                 reg_anchor, reg_offset, reg_target, reg_valid, vis.extra_rank, vis.extra_limit)
    for name, value in vars(out).items():
        if isinstance(value, Tensor):
            setattr(out, name, value.contiguous().to(device, non_blocking=True))   # device None: stays
    return out


def _check_lengths(lengths: Tensor, B: int, N: int) -> None:
    """One-line error for bad 1D lengths; values are only read when they live on the CPU (a device
    tensor would cost a host sync every batch: the data loader checked them already)."""
    if lengths.shape != (B,):
        raise LayoutError(f"lengths must have shape ({B},), got {tuple(lengths.shape)}")
    if lengths.device.type == "cpu" and ((lengths < 1).any() or (lengths > N).any()):
        raise LayoutError(f"lengths must be (B,)={B} values in 1..{N}, got {lengths.tolist()}")


@functools.lru_cache(maxsize=256)
def dense_slots(spec: RegisterSpec, grid: tuple[int, int]) -> int:
    """Register slots R of dense placement on ``grid``: the most anchors with a valid target any
    draw can give (one offset per sequence: the best offset; one per anchor: every anchor that has
    some valid offset). Batches with fewer valid anchors pad the rest (``reg_valid`` False)."""
    offsets = spec.offsets()                                                  # (C, 2)
    anchors = torch.arange(first_anchor(spec.kind), grid[0] * grid[1] - 1)
    _, valid = offset_targets(grid, anchors[:, None], offsets[None], spec.edge)   # (A, C)
    return int(valid.any(1).sum() if spec.per_register_offsets else valid.sum(0).max())


@functools.lru_cache(maxsize=64)
def _candidates_on(spec: RegisterSpec, device: torch.device) -> tuple[Tensor, Tensor | None]:
    """(the candidate offsets (C, 2), the explicit offset weights (1, C) float32: None unless
    ``offset_distribution`` is a tuple of them), copied to ``device`` once (not once per batch)."""
    dist = spec.offset_distribution
    weights = torch.tensor([dist], dtype=torch.float32, device=device) if isinstance(dist, tuple) else None
    return spec.offsets().to(device), weights


def _draw_offsets(spec: RegisterSpec, grid: tuple[int, int], anchors: Tensor, lengths: Tensor | None,
                  shape: tuple[int, int], generator: torch.Generator | None) -> Tensor:
    """(B, n) candidate indices: uniform (one ``randint``, the paper's rule) or one ``rand`` per draw
    through the inverse CDF of the candidates' weights (zero weights never drawn; no host sync): the
    explicit tuple, or for "valid-anchors" the count of ``anchors`` (A,) whose target is valid under
    each offset, per sample when ``lengths`` (B,) is given."""
    (offsets, weights), device = _candidates_on(spec, anchors.device), anchors.device
    if spec.offset_distribution == "uniform":
        return torch.randint(len(offsets), shape, generator=generator, device=device)
    if spec.offset_distribution == "valid-anchors":
        rows = 1 if lengths is None else lengths.shape[0]
        _, valid = offset_targets(grid, anchors.view(1, -1, 1).expand(rows, -1, 1), offsets[None, None],
                                  spec.edge, lengths)                             # (rows, A, C)
        weights = valid.sum(1).float()
    cdf = weights.cumsum(-1)                                                       # (B or 1, C)
    u = torch.rand(shape, generator=generator, device=device) * cdf[:, -1:]
    return (cdf[:, None, :] <= u[..., None]).sum(-1).clamp(max=len(offsets) - 1)


def _place_registers(B: int, grid: tuple[int, int], spec: RegisterSpec, generator: torch.Generator | None,
                     lengths: Tensor | None, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(anchor (B, R), offset (B, R, 2), target (B, R), valid (B, R)) of the register slots, on ``device``.

    Random draws, in this order: the offsets (``randint``; ``rand`` under a non-uniform
    ``offset_distribution``), then for sparse placement one score per anchor (``rand``); the K
    lowest-scoring valid anchors get registers, kept in anchor order. Dense: the valid anchors in
    anchor order, then padding slots up to ``dense_slots``."""
    if not spec.uses_registers():
        empty = torch.zeros(B, 0, dtype=torch.long, device=device)
        return empty, empty[..., None].expand(B, 0, 2), empty, empty.bool()
    offsets, _ = _candidates_on(spec, device)
    anchors = torch.arange(first_anchor(spec.kind), grid[0] * grid[1] - 1, device=device)   # (A,)
    A = anchors.numel()
    pick = _draw_offsets(spec, grid, anchors, lengths, (B, A if spec.per_register_offsets else 1), generator)
    off = offsets[pick.expand(B, A)]                                                  # (B, A, 2)
    target, valid = offset_targets(grid, anchors.expand(B, A), off, spec.edge, lengths)
    if spec.placement == "sparse":
        score = torch.rand(B, A, generator=generator, device=device).masked_fill(~valid, 2.0)
        slot = score.argsort(dim=1)[:, :spec.num_registers].sort(dim=1).values
    else:
        key = (~valid).long() * A + torch.arange(A, device=device)
        slot = key.argsort(dim=1)[:, :dense_slots(spec, grid)]
    return (anchors[slot], off.gather(1, slot[..., None].expand(-1, -1, 2)), target.gather(1, slot),
            valid.gather(1, slot))
