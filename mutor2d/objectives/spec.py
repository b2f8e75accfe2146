"""The register rules of an objective (RegisterSpec: no registers; RegisterSpec1D, RegisterSpec2D) and
their errors, as plain values: no torch, so a config checks them before torch is imported. They are
declared once: the register objectives' config sections are these specs (``objective.name: mutor-2d``
is a RegisterSpec2D with the loss's fields beside, mutor2d.objectives.config). The layout built from
them: mutor2d.objectives.layout."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from ..checks import ConfigError

if TYPE_CHECKING:
    from torch import Tensor

RegisterKind = Literal["ntp", "mutor-1d", "mutor-2d"]   # what RegisterSpec.kind may be
MAX_D_1D = 1 << 16      # the farthest 1D offset: beyond any sequence length trained here
MAX_D_2D = 256          # the side of the 2D offset square: 256^2 - 1 candidates, past any VQ grid


class LayoutError(ConfigError):
    """An impossible register setting for the given grid; one-line message (a config error)."""


@dataclass(frozen=True, kw_only=True)
class RegisterSpec:
    """The register rules of one objective, in one place: which offsets, which anchors, whether they
    fit a grid, and how many drafts the registers give a speculative decoder. This class: no registers
    (``kind`` "ntp"); RegisterSpec1D and RegisterSpec2D add the offsets (``d_min``, ``d_max``, the
    only fields they take by position: ``RegisterSpec1D(2, 4, edge="raster")``).

    placement: "dense" (a register at every anchor with a valid target) or "sparse"
    (``num_registers`` anchors drawn among the valid ones). One offset per sequence, or one per
    anchor with ``per_register_offsets``. edge: "geometric" or "raster" (see ``offset_targets``).
    offset_distribution: how an offset is drawn from the candidates: "uniform" (the paper's rule),
    "valid-anchors" (each candidate weighted by how many anchors of the sample it leaves a valid
    target: on padded 1D data, far offsets grow rarer as the answer gets shorter), or C weights, one
    per candidate offset in ``offsets()`` order (a list is kept as a tuple: specs are values).
    register_visibility: "isolated" (the paper's rule: a register sees no other register) or
    "earlier_registers" (a register also sees the registers anchored strictly before its own anchor;
    regular tokens still see none).
    """
    kind: ClassVar[RegisterKind] = "ntp"
    offset_distribution: Literal["uniform", "valid-anchors"] | list[float] = "uniform"
    register_visibility: Literal["isolated", "earlier_registers"] = "isolated"
    placement: Literal["dense", "sparse"] = "dense"
    num_registers: int = 80
    per_register_offsets: bool = False
    edge: Literal["geometric", "raster"] = "geometric"

    def __post_init__(self):
        if isinstance(self.offset_distribution, list):
            object.__setattr__(self, "offset_distribution", tuple(self.offset_distribution))

    def uses_registers(self) -> bool:
        return self.kind != "ntp"

    def offsets(self) -> Tensor:
        """Candidate offsets (C, 2) as (Δr, Δc), a long tensor (imports torch)."""
        import torch
        return torch.tensor(self.offset_pairs(), dtype=torch.long).reshape(-1, 2)

    def offset_pairs(self) -> list[tuple[int, int]]:
        """Candidate offsets as (Δr, Δc) pairs, in ``offsets()`` order: none here."""
        return []

    def draft_offsets(self) -> list[tuple[int, int]]:
        """The offsets a speculative decoder drafts with after a verified token x_t: (0, 2), (0, 3), ...
        while they are candidates (x_{t+1} is the next-token head's). Their count is the useful draft
        length: D - 2 for mutor-2d, d_max - 1 for mutor-1d with d_min <= 2, 0 otherwise."""
        have = set(self.offset_pairs())
        out, d = [], 2
        while (0, d) in have:
            out.append((0, d))
            d += 1
        return out

    def check_height(self, H: int, name: str, shape: str) -> None:
        """Raise LayoutError if this spec cannot work on a grid of H rows (2D offsets need H > 1);
        ``shape`` names the grid in the message (e.g. "1x16")."""
        if self.kind == "mutor-2d" and H == 1:
            raise LayoutError(f"{name}: 2D offsets need a 2D grid, got {shape} (use 1D offsets)")

    def check_layout(self, grid: tuple[int, int], prefix_len: int, name: str = "objective") -> None:
        """Raise LayoutError if this spec cannot work on ``grid``; ``name`` is the config section."""
        H, W = grid
        if H < 1 or W < 1 or H * W < 2:
            raise LayoutError(f"grid {H}x{W}: need at least 2 body tokens")
        if prefix_len < 1:
            raise LayoutError(f"prefix length {prefix_len}: need at least one prefix token")
        if not self.uses_registers():
            return
        self.check_height(H, name, f"{H}x{W}")
        if self.kind == "mutor-2d" and self.d_max > max(H, W):
            raise LayoutError(f"{name}.d_max={self.d_max} exceeds the grid {H}x{W}")
        if self.kind == "mutor-1d" and self.d_min > (H * W if self.edge == "raster" else W):
            raise LayoutError(f"{name}.d_min={self.d_min}: every 1D target falls off the {H}x{W} grid")
        if self.placement == "sparse" and self.num_registers > (anchors := num_anchors(self.kind, grid)):
            raise LayoutError(f"{name}.num_registers={self.num_registers} exceeds the "
                              f"{anchors} anchors of a {H}x{W} grid")


@dataclass(frozen=True)
class RegisterSpec1D(RegisterSpec):
    """MuToR-1D: offsets (0, d) for d = d_min..d_max (d_max the farthest token ahead, d = 1 the next
    token); anchors x_{-1} (the last prefix token) .. x_{N-2}."""
    kind: ClassVar[RegisterKind] = "mutor-1d"
    d_min: int = 1
    d_max: int = 4

    def offset_pairs(self) -> list[tuple[int, int]]:
        return offset_pairs(self.kind, self.d_min, self.d_max)

    def offsets_text(self) -> str:
        """The offsets in a few characters, e.g. "d=1..4"."""
        return f"d={self.d_min}..{self.d_max}"


@dataclass(frozen=True)
class RegisterSpec2D(RegisterSpec):
    """MuToR-2D: offsets (Δr, Δc) in {0..D-1}^2 minus (0, 0) with D = d_max, the side of the offset
    square (the paper's (d_h, d_w) in {1..D}^2 minus (1, 1)); anchors x_0 .. x_{N-2}."""
    kind: ClassVar[RegisterKind] = "mutor-2d"
    d_max: int = 4

    def offset_pairs(self) -> list[tuple[int, int]]:
        return offset_pairs(self.kind, 1, self.d_max)

    def offsets_text(self) -> str:
        """The offsets in a few characters, e.g. "D=4"."""
        return f"D={self.d_max}"


NO_REGISTERS = RegisterSpec()


def first_anchor(kind: str) -> int:
    """Body index of the first anchor: -1 (last prefix token) for 1D offsets, else 0."""
    return -1 if kind == "mutor-1d" else 0


def num_anchors(kind: str, grid: tuple[int, int]) -> int:
    return grid[0] * grid[1] - 1 - first_anchor(kind)


def offset_pairs(kind: str, d_min: int, d_max: int) -> list[tuple[int, int]]:
    """Candidate offsets as (dr, dc) pairs: mutor-2d {0..d_max-1}^2 minus (0, 0) in raster order;
    mutor-1d (0, d) for d = d_min..d_max; anything else none."""
    if kind == "mutor-2d":
        return [(r, c) for r in range(d_max) for c in range(d_max) if (r, c) != (0, 0)]
    return [(0, d) for d in range(d_min, d_max + 1)] if kind == "mutor-1d" else []
