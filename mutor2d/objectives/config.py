"""The ``objective`` section: every objective's config variant (``objective.name``), its fields and
rules, and the name of the builder of its loss (token_prediction, multihead: they import their
config from here). No torch here (the rule: mutor2d.config)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from ..checks import ConfigError, at_least, fraction
from ..config import Variant, register_variant
from .spec import MAX_D_1D, MAX_D_2D, NO_REGISTERS, RegisterSpec, RegisterSpec1D, RegisterSpec2D


class ObjectiveConfig(Variant):
    """An ``objective`` variant: its fields and rules. Adding one: a subclass with
    ``@register_variant("objective", NAME, build="module:function")`` here (or in a plugin); the
    builder takes (config, model) and returns the loss module: ``forward(model, Batch, generator) ->
    ObjectiveResult`` and ``blocks()`` (transformer blocks it owns, compiled like the model's); it may
    hold parameters.

    Loss = (1 - reg_weight) * CE_ntp + reg_weight * CE_aux, each a mean over its own valid targets."""

    def register_spec(self) -> RegisterSpec:
        """The register rules of this objective (offsets, anchors, grid fit, draft length)."""
        return NO_REGISTERS

    def uses_registers(self) -> bool:
        """Whether the model needs its register embedding."""
        return False

    def num_head_layers(self) -> int:
        """Extra head layers the loss module asks its model for (``TokenModel.head_layers``); a
        transformers LM builds them with the model (mutor2d.lm.hf.build)."""
        return 0

    @classmethod
    def line_defaults(cls) -> dict:
        """Field defaults on 1D data only (text: a language-model config), e.g. a 1D layout."""
        return {}

    def check_line(self) -> None:
        """Raise a LayoutError (a ConfigError) if this objective cannot train on lines 1 x N of any N (text)."""
        self.register_spec().check_height(1, f"objective {self.name!r}", "a 1 x N line (text)")

    def describe(self) -> str:
        """Short text of the settings that tell runs of this objective apart (leaderboard rows, plot
        labels): every field as key=value ("" without fields); objectives override it."""
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))

    def check_grid(self, grid: tuple[int, int], prefix_len: int) -> None:
        self.register_spec().check_layout(grid, prefix_len)


@dataclass(frozen=True)
class AuxTermConfig(ObjectiveConfig):
    """Fields of the objectives with an auxiliary term beside next-token prediction (the registers'
    or the extra heads'): its weight a and a's schedule, and what the term learns.

    ``reg_weight_schedule``: a = reg_weight throughout (constant), or linear / cosine from reg_weight
    to ``reg_weight_final`` over ``reg_weight_steps`` updates (0: the run), then held (WeightSchedule).
    ``reg_target``: token (CE to the target body token, the paper's rule) or self_distill (the KL
    divergence from the model's own detached next-token distribution at the target's predictor slot,
    mixed with that CE by ``reg_distill_mix``: 1 = pure KL; TargetRule)."""
    reg_weight: float = 0.5
    reg_weight_schedule: Literal["constant", "linear", "cosine"] = "constant"
    reg_weight_final: float = 0.0
    reg_weight_steps: int = 0
    reg_target: Literal["token", "self_distill"] = "token"
    reg_distill_mix: float = 1.0

    def check(self) -> None:
        """a, a's final value and reg_distill_mix in [0, 1]; the schedule's fields only with a linear or
        cosine schedule, the mix only with self_distill; sparse placement has a register."""
        fraction("objective.reg_weight", self.reg_weight)
        if getattr(self, "placement", "dense") == "sparse":
            at_least("objective.num_registers", self.num_registers, 1)
        fraction("objective.reg_weight_final", self.reg_weight_final)
        at_least("objective.reg_weight_steps", self.reg_weight_steps, 0)
        for key, default in (("reg_weight_final", 0.0), ("reg_weight_steps", 0)):
            if self.reg_weight_schedule == "constant" and getattr(self, key) != default:
                raise ConfigError(f"objective.{key}={getattr(self, key)}: only with objective.reg_weight_schedule "
                                  f"linear or cosine (it is constant)")
        fraction("objective.reg_distill_mix", self.reg_distill_mix)
        if self.reg_target == "token" and self.reg_distill_mix != 1.0:
            raise ConfigError(f"objective.reg_distill_mix={self.reg_distill_mix}: only with objective.reg_target "
                              f"self_distill (it is token)")

    def weight_schedule(self) -> WeightSchedule | None:
        """The schedule of a; None for constant (no step hook: the paper's rule)."""
        if self.reg_weight_schedule == "constant":
            return None
        return WeightSchedule(self.reg_weight_schedule, self.reg_weight, self.reg_weight_final, self.reg_weight_steps)

    def describe_aux_term(self) -> list[str]:
        """e.g. ["a=0.5"], ["a=0.5->0.0 linear", "self_distill"] or ["a=0.5", "self_distill mix=0.5"]."""
        a = f"a={self.reg_weight}"
        if self.reg_weight_schedule != "constant":
            a += f"->{self.reg_weight_final} {self.reg_weight_schedule}"
        if self.reg_target == "token":
            return [a]
        return [a, "self_distill" + ("" if self.reg_distill_mix == 1.0 else f" mix={self.reg_distill_mix}")]


def check_offsets(o, kind: str) -> None:
    """d_min/d_max rules of 1D offsets (1 <= d_min <= d_max <= MAX_D_1D) or 2D ones
    (2 <= D = d_max <= MAX_D_2D): checked before any rule lists the candidate offsets."""
    if kind == "mutor-1d" and not 1 <= o.d_min <= o.d_max <= MAX_D_1D:
        raise ConfigError(f"objective.d_min/d_max: need 1 <= d_min <= d_max <= {MAX_D_1D}, got {o.d_min}..{o.d_max}")
    if kind == "mutor-2d" and not 2 <= o.d_max <= MAX_D_2D:
        raise ConfigError(f"objective.d_max: need 2 <= D <= {MAX_D_2D} for 2D offsets (D=1 has none), got {o.d_max}")


@dataclass(frozen=True)
class WeightSchedule:
    """The loss weight a(s) of update s = 0, 1, ...: a pure function of the config and s, so resumed
    and sharded runs agree. constant: ``start``; linear / cosine: from ``start`` at s = 0 to
    ``final`` at s = S and after, S = ``steps`` (0: the run's max_steps)."""
    kind: str = "constant"
    start: float = 0.5
    final: float = 0.0
    steps: int = 0

    def at(self, step: int, max_steps: int) -> float:
        """a(step); a linear progress p = min(step / S, 1), cosine (1 - cos(pi p)) / 2."""
        if self.kind == "constant":
            return self.start
        span = self.steps or max_steps
        p = min(step / span, 1.0) if span > 0 else 1.0
        if self.kind == "cosine":
            p = (1 - math.cos(math.pi * p)) / 2
        return self.start + (self.final - self.start) * p


@register_variant("objective", "ntp", build="mutor2d.objectives.token_prediction:build_ntp")
@dataclass
class NTPConfig(ObjectiveConfig):
    """Plain next-token prediction: no other field."""


REGISTERS = "mutor2d.objectives.token_prediction:build_registers"   # mutor-1d's and mutor-2d's builder


class RegisterObjective:
    """What the register objectives add to their RegisterSpec and AuxTermConfig fields (the spec's
    fields are the config's: ``placement``, ``num_registers``, ``per_register_offsets``, ``edge``,
    ``offset_distribution``, ``register_visibility``, ``d_min`` / ``d_max``; mutor2d.objectives.spec)."""

    def check(self) -> None:
        """The aux term's rules, the offsets', and a list of weights: one non-negative number per
        candidate offset, not all 0."""
        super().check()
        check_offsets(self, self.kind)
        dist, count = self.offset_distribution, len(self.offset_pairs())
        if not isinstance(dist, str) and (len(dist) != count or min(dist, default=0) < 0 or sum(dist) <= 0):
            raise ConfigError(f"objective.offset_distribution={list(dist)}: expected 'uniform', 'valid-anchors' or "
                              f"{count} non-negative weights, not all 0 (one per candidate offset of "
                              f"{self.offsets_text()})")

    def register_spec(self) -> RegisterSpec:
        """This section: it is the spec."""
        return self

    def describe(self) -> str:
        """e.g. "a=0.5, D=4, sparse K=80", "a=0.5, self_distill mix=0.5, D=4, dense" or
        "a=0.5, d=2..4, dense, raster, per-register offsets"."""
        parts = self.describe_aux_term() + [self.offsets_text(),
                                            f"sparse K={self.num_registers}" if self.placement == "sparse" else "dense"]
        parts += [self.edge] if self.edge != "geometric" else []
        parts += ["per-register offsets"] if self.per_register_offsets else []
        dist = self.offset_distribution
        parts += [] if dist == "uniform" else [f"offsets {list(dist) if isinstance(dist, tuple) else dist}"]
        parts += [] if self.register_visibility == "isolated" else [self.register_visibility]
        return ", ".join(parts)


@register_variant("objective", "mutor-1d", build=REGISTERS)
@dataclass(frozen=True)
class MuToR1DConfig(RegisterSpec1D, RegisterObjective, AuxTermConfig):
    """Registers predicting the token d = d_min..d_max (inclusive) ahead on the raster line:
    offsets (0, d); d_max is the farthest token ahead (RegisterSpec1D)."""


@register_variant("objective", "mutor-2d", build=REGISTERS)
@dataclass(frozen=True)
class MuToR2DConfig(RegisterSpec2D, RegisterObjective, AuxTermConfig):
    """Registers predicting a token at a 2D offset (dr, dc) in {0..D-1}^2 minus (0, 0), D = d_max,
    the side of the offset square (RegisterSpec2D)."""


@register_variant("objective", "multihead", build="mutor2d.objectives.multihead:MultiHead")
@dataclass(frozen=True)
class MultiHeadConfig(AuxTermConfig):
    """Multi-token prediction with extra heads (one transformer layer each) instead of registers;
    a's schedule and the heads' target rule as the register objectives' (base.AuxTermConfig).
    layout "2d": one head per offset of mutor-2d with D = d_max; "1d": one per d = max(d_min, 2)..d_max
    (d = 1 is the main head). ``num_heads``: keep the first heads only (0 = all)."""
    layout: Literal["1d", "2d"] = "2d"
    d_min: int = 1
    d_max: int = 4
    num_heads: int = 0
    edge: Literal["geometric", "raster"] = "geometric"

    def register_spec(self) -> RegisterSpec:
        """The heads' offsets follow the register rules of the same layout (dense, d >= 2 in 1D)."""
        if self.layout == "2d":
            return RegisterSpec2D(d_max=self.d_max, edge=self.edge)
        return RegisterSpec1D(d_min=max(self.d_min, 2), d_max=self.d_max, edge=self.edge)

    def check(self) -> None:
        super().check()
        check_offsets(self, self.register_spec().kind)
        if self.layout == "1d" and self.d_max < 2:
            raise ConfigError(f"objective.d_max: the 1d heads predict d = 2..d_max, got {self.d_max}")
        count = len(self.register_spec().offset_pairs())
        if not 0 <= self.num_heads <= count:
            raise ConfigError(f"objective.num_heads: expected 0 (all) .. {count} "
                              f"(the offsets of objective.d_max={self.d_max}), got {self.num_heads}")

    def num_head_layers(self) -> int:
        return len(self.register_spec().offset_pairs()[: self.num_heads or None])

    @classmethod
    def line_defaults(cls) -> dict:
        """Text is a line: layout 1d."""
        return {"layout": "1d"}

    def describe(self) -> str:
        """e.g. "a=0.5, heads=all, 2d D=4", "a=0.5->0.0 cosine, self_distill, heads=all, 2d D=4" or
        "a=0.5, heads=2, 1d d=2..4, raster"."""
        parts = self.describe_aux_term() + [f"heads={self.num_heads or 'all'}",
                                            f"{self.layout} {self.register_spec().offsets_text()}"]
        return ", ".join(parts + ([self.edge] if self.edge != "geometric" else []))
