"""What every objective shares: the model interface it calls, the batch it reads, the result it
returns, its config base, the masked loss."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..checks import ConfigError, at_least, fraction
from ..config import Variant
from ..model.attention import Visibility
from ..registers import LayoutError, RegisterSpec


class TokenModel(Protocol):
    """What an objective calls on its model: the image GPT (mutor2d.model.gpt.GPT) and a transformers
    causal LM on one batch (mutor2d.lm.model.FramedLM) alike.

    A sequence is P prefix slots, the regular tokens after them (T regular slots in all), then E
    extra (register) slots; positions (B, T + E, 2) are (row, col) ids (mutor2d.registers); vis is
    the visibility rule over all slots (mutor2d.model.attention.Visibility), None = plain causal, E = 0.
    Hidden states are what ``logits`` takes."""
    sparse_logits: bool  # True: logits only at valid rows (token_ce); False: every row, masked (no host sync)

    def prefix_len(self, prefix: Tensor) -> int:
        """P, the slots the prefix (class labels (B,) or prompt (B, P)) takes."""

    def embed(self, tokens: Tensor | None, prefix: Tensor | None, num_extra: int = 0) -> Tensor:
        """(B, P + T_tokens + num_extra, D) input embeddings: prefix, tokens, then extra slots."""

    def hidden(self, h: Tensor, positions: Tensor, vis: Visibility | None = None,
               prefix_len: int | None = None) -> Tensor:
        """Embeddings (B, L, D) -> last hidden states (B, L, D) under ``vis``; ``prefix_len``: the P
        prefix slots at the front (a model with ``prompt_attention: bidirectional`` opens them to each
        other, mutor2d.model.attention.open_prefix; pass it always)."""

    def logits(self, h: Tensor) -> Tensor:
        """Hidden states (..., D) -> logits (..., V)."""

    def head_layers(self, count: int) -> nn.ModuleList | None:
        """``count`` extra head layers for the objective to own (the GPT: fresh blocks), or None when
        the model holds its own (a transformers LM: copies of its last layer, built with it)."""

    def hidden_with_heads(self, h: Tensor, positions: Tensor, heads: nn.ModuleList | None,
                          prefix_len: int | None = None) -> tuple[Tensor, list[Tensor]]:
        """Causal (prompt rule as ``hidden``), no extra slots: (last hidden states (B, T, D), [head k's
        hidden states (B, T, D)]); ``heads`` as ``head_layers`` gave them."""


@dataclass
class Batch:
    """body (B, N) tokens in raster order of ``grid``; prefix: labels (B,) or prompt (B, P);
    lengths (B,) real body lengths for padded 1D data, else None."""
    body: Tensor
    prefix: Tensor
    grid: tuple[int, int]
    lengths: Tensor | None = None


@dataclass
class ObjectiveResult:
    """What one forward of an objective declares.

    loss: scalar to backpropagate. logs: scalar losses worth logging, by name (e.g. "loss_ntp",
    "loss_reg"; the multi-head baseline logs "loss_heads"). counts: valid targets per loss term
    (e.g. "ntp", "reg"), 0-d long tensors. tokens: 0-d tensor, tokens the trunk processed
    (B x (regular + register slots)), for FLOP estimates.
    """
    loss: Tensor
    logs: dict[str, Tensor]
    counts: dict[str, Tensor]
    tokens: Tensor


class ObjectiveConfig(Variant):
    """An ``objective`` variant: its fields and rules, and the loss module it builds. Adding one: a
    subclass with ``@register_variant("objective", NAME)`` beside its module.

    Loss = (1 - reg_weight) * CE_ntp + reg_weight * CE_aux, each a mean over its own valid targets."""
    legacy_keys = frozenset({"reg_weight", "d_min", "d_max", "d_max_2d", "placement", "num_registers",
                             "per_register_offsets", "edge", "multihead_layout", "num_heads"})

    def build(self, model: nn.Module) -> nn.Module:
        """The loss module: ``forward(model, Batch, generator) -> ObjectiveResult`` and ``blocks()``
        (transformer blocks it owns, compiled like the model's); it may hold parameters."""
        raise NotImplementedError

    def register_spec(self) -> RegisterSpec:
        """The register rules of this objective (offsets, anchors, grid fit, draft length)."""
        return RegisterSpec("ntp")

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
        """Raise ConfigError if this objective cannot train on lines 1 x N of any N (text)."""
        try:
            self.register_spec().check_height(1, f"objective {self.name!r}", "a 1 x N line (text)")
        except LayoutError as e:
            raise ConfigError(str(e)) from None

    def describe(self) -> str:
        """Short text of the settings that tell runs of this objective apart (leaderboard rows, plot
        labels): every field as key=value ("" without fields); objectives override it."""
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))

    def check_grid(self, grid: tuple[int, int], prefix_len: int) -> None:
        try:
            self.register_spec().check(grid, prefix_len)
        except LayoutError as e:
            raise ConfigError(str(e)) from None


@dataclass
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
        check_register_fields(self)
        check_weight_schedule(self)
        check_reg_target(self)

    def weight_schedule(self) -> WeightSchedule | None:
        """The schedule of a; None for constant (no step hook: the paper's rule)."""
        if self.reg_weight_schedule == "constant":
            return None
        return WeightSchedule(self.reg_weight_schedule, self.reg_weight, self.reg_weight_final, self.reg_weight_steps)

    def target_rule(self) -> "TargetRule":
        return TargetRule(self.reg_target, self.reg_distill_mix)

    def describe_aux_term(self) -> list[str]:
        """e.g. ["a=0.5"], ["a=0.5->0.0 linear", "self_distill"] or ["a=0.5", "self_distill mix=0.5"]."""
        a = f"a={self.reg_weight}"
        if self.reg_weight_schedule != "constant":
            a += f"->{self.reg_weight_final} {self.reg_weight_schedule}"
        if self.reg_target == "token":
            return [a]
        return [a, "self_distill" + ("" if self.reg_distill_mix == 1.0 else f" mix={self.reg_distill_mix}")]


def check_register_fields(o) -> None:
    """Rules shared by the objectives with registers or extra heads."""
    fraction("objective.reg_weight", o.reg_weight)
    if getattr(o, "placement", "dense") == "sparse":
        at_least("objective.num_registers", o.num_registers, 1)


MAX_D_1D = 1 << 16      # the farthest 1D offset: beyond any sequence length trained here
MAX_D_2D = 256          # the side of the 2D offset square: 256^2 - 1 candidates, past any VQ grid


def check_offsets(o, kind: str) -> None:
    """d_min/d_max rules of 1D offsets (1 <= d_min <= d_max <= MAX_D_1D) or 2D ones
    (2 <= D = d_max <= MAX_D_2D): checked before any rule lists the candidate offsets."""
    if kind == "mutor-1d" and not 1 <= o.d_min <= o.d_max <= MAX_D_1D:
        raise ConfigError(f"objective.d_min/d_max: need 1 <= d_min <= d_max <= {MAX_D_1D}, got {o.d_min}..{o.d_max}")
    if kind == "mutor-2d" and not 2 <= o.d_max <= MAX_D_2D:
        raise ConfigError(f"objective.d_max: need 2 <= D <= {MAX_D_2D} for 2D offsets (D=1 has none), got {o.d_max}")


REG_WEIGHT_SCHEDULES = ("constant", "linear", "cosine")


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


def check_weight_schedule(o) -> None:
    """reg_weight_final in [0, 1] and reg_weight_steps >= 0, both only with a linear or cosine schedule."""
    fraction("objective.reg_weight_final", o.reg_weight_final)
    at_least("objective.reg_weight_steps", o.reg_weight_steps, 0)
    if o.reg_weight_schedule == "constant":
        for key, default in (("reg_weight_final", 0.0), ("reg_weight_steps", 0)):
            if getattr(o, key) != default:
                raise ConfigError(f"objective.{key}={getattr(o, key)}: only with objective.reg_weight_schedule "
                                  f"linear or cosine (it is constant)")


def check_reg_target(o) -> None:
    """reg_distill_mix in [0, 1], and only with reg_target self_distill."""
    fraction("objective.reg_distill_mix", o.reg_distill_mix)
    if o.reg_target == "token" and o.reg_distill_mix != 1.0:
        raise ConfigError(f"objective.reg_distill_mix={o.reg_distill_mix}: only with objective.reg_target "
                          f"self_distill (it is token)")


def check_offset_distribution(dist, count: int, offsets: str) -> None:
    """A list of weights: ``count`` non-negative numbers (one per candidate offset of ``offsets``), not all 0."""
    if isinstance(dist, str):
        return
    if len(dist) != count or min(dist, default=0) < 0 or sum(dist) <= 0:
        raise ConfigError(f"objective.offset_distribution={dist}: expected 'uniform', 'valid-anchors' or {count} "
                          f"non-negative weights, not all 0 (one per candidate offset of {offsets})")


def mix(ntp: tuple[Tensor, Tensor], aux: tuple[Tensor, Tensor] | None, reg_weight: float, tokens: Tensor,
        aux_name: str = "reg", parts: dict[str, Tensor] | None = None) -> ObjectiveResult:
    """The one loss rule of every objective, images and text: (1 - a) * CE_ntp + a * L_aux with
    a = ``reg_weight``; ``ntp`` and ``aux`` are (mean loss, valid count) pairs, ``aux`` None for plain
    next-token prediction (loss = CE_ntp). ``parts``: the pieces of L_aux worth logging beside it
    (TargetRule), logged as loss_{aux_name}_{part}."""
    loss_ntp, n_ntp = ntp
    logs, counts, loss = {"loss_ntp": loss_ntp}, {"ntp": n_ntp}, loss_ntp
    if aux is not None:
        logs[f"loss_{aux_name}"], counts[aux_name] = aux
        logs.update({f"loss_{aux_name}_{k}": v for k, v in (parts or {}).items()})
        loss = (1 - reg_weight) * loss_ntp + reg_weight * aux[0]
    return ObjectiveResult(loss, logs, counts, tokens)


def token_ce(model: TokenModel, h: Tensor, targets: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """``masked_ce`` of the model's logits at hidden states h (..., D) against targets, valid of the
    same leading shape: every row masked, or only the valid rows when ``model.sparse_logits``."""
    if model.sparse_logits:
        return masked_ce(model.logits(h[valid]), targets[valid])
    return masked_ce(model.logits(h), targets, valid)


def masked_ce(logits: Tensor, targets: Tensor, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Mean cross-entropy (in float32) over valid positions (0, with a graph, if none) and the count
    of valid positions. logits (..., V), targets and valid of the same leading shape; valid None =
    every position (rows already selected)."""
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="none")
    return masked_mean(ce, None if valid is None else valid.reshape(-1))


def masked_mean(x: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor]:
    """(mean of x over valid positions (0, with a graph, if none), count of valid positions); valid of
    x's shape, None = every position."""
    if valid is None:
        valid = torch.ones(x.shape, dtype=torch.bool, device=x.device)
    n = valid.sum()
    return (x * valid).sum() / n.clamp(min=1), n


@dataclass(frozen=True)
class TargetRule:
    """What the auxiliary term learns at a register (or at head k's anchor) whose target is body token
    x_j (``objective.reg_target``, ``reg_distill_mix``).

    token: CE(q, x_j), the paper's rule. self_distill: (1 - mix) CE(q, x_j) + mix KL(p || q), q the
    register's distribution, p the model's own next-token distribution at regular slot P - 1 + j (the
    slot whose next-token head predicts x_j: Layout.ntp_target), detached (a teacher, no gradient).
    Each piece is a mean over the valid targets, in float32."""
    kind: str = "token"
    mix: float = 1.0

    def loss(self, model: TokenModel, h: Tensor, targets: Tensor, valid: Tensor, regular: Tensor,
             slots: Tensor) -> tuple[tuple[Tensor, Tensor], dict[str, Tensor]]:
        """((mean loss, valid count), parts to log) of hidden states h (B, R, D) with targets, valid and
        teacher slots (B, R); ``regular`` (B, T, D): the regular hidden states the slots index. token:
        ``token_ce``, no parts; self_distill: parts "ce" and "kl"."""
        if self.kind == "token":
            return token_ce(model, h, targets, valid), {}
        teacher = regular.detach().gather(1, slots[..., None].expand(-1, -1, regular.shape[-1]))
        ce, kl, n = self_distill(model, h, teacher, targets, valid)
        return ((1 - self.mix) * ce + self.mix * kl, n), {"ce": ce, "kl": kl}


def self_distill(model: TokenModel, h: Tensor, teacher: Tensor, targets: Tensor,
                 valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(mean CE(q, targets), mean KL(p || q), valid count) over valid rows, in float32: q = softmax of
    the model's logits at h (..., D), p = softmax of its logits at ``teacher`` (..., D), taken without
    a graph; targets and valid of the same leading shape. Every row masked, or only the valid rows
    when ``model.sparse_logits``."""
    if model.sparse_logits:
        h, teacher, targets, valid = h[valid], teacher[valid], targets[valid], None
    logq = F.log_softmax(model.logits(h).float(), dim=-1)
    with torch.no_grad():
        logp = F.log_softmax(model.logits(teacher).float(), dim=-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    ce = -logq.gather(-1, targets[..., None])[..., 0]
    (ce, n), (kl, _) = masked_mean(ce, valid), masked_mean(kl, valid)
    return ce, kl, n
