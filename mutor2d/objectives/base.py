"""What every objective shares: the model interface it calls, the batch it reads, the result it
returns, what its auxiliary term learns, the masked loss."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..model.attention import Visibility


class TokenModel(Protocol):
    """What an objective calls on its model: the image GPT (mutor2d.model.gpt.GPT) and a transformers
    causal LM on one batch (mutor2d.lm.model.FramedLM) alike.

    A sequence is P prefix slots, the regular tokens after them (T regular slots in all), then E
    extra (register) slots; positions (B, T + E, 2) are (row, col) ids (mutor2d.objectives.layout); vis is
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


def target_rule(cfg) -> TargetRule:
    """The TargetRule of an objective config with an auxiliary term (``reg_target``, ``reg_distill_mix``)."""
    return TargetRule(cfg.reg_target, cfg.reg_distill_mix)


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
