"""A transformers causal LM with one register embedding: the MuToR-1D training forward.

The sequence of a Packed batch (regular slots, then register slots) goes through the model's own
decoder as ``inputs_embeds``: token embeddings for regular slots, the shared register embedding
(one vector of the hidden size, not a new vocabulary entry) for register slots; explicit
``position_ids``; a 4D additive mask (B, 1, L, L) built from the visibility rule (0 = may attend,
dtype min = blocked), or the rule's FlexAttention BlockMask when the model runs
``flex_attention``. Without registers a 2D padding mask is passed instead (the model's own
causal path). Logits are computed only where a loss is taken. Any causal LM whose decoder accepts
``inputs_embeds``, ``position_ids`` and a 4D mask works (Llama, Gemma, Qwen, GPT-2 families).

The multi-head baseline (objective ``multihead``, Gloeckle et al.-style) adds no registers: the
trunk is every decoder layer but the last; the model's own last layer + final norm + LM head is
the d = 1 head, and head k (offset d_k >= 2) is an extra decoder layer on the same trunk output
(the last layer's input, with its mask and rotary embeddings) followed by the shared final norm and
LM head (:func:`head_layers`, :func:`head_targets`).
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from ..objectives.base import ObjectiveResult, masked_ce, mix
from .packing import Packed

LAYERS, NORMS = ("layers", "h"), ("norm", "ln_f")        # decoder attributes: Llama/Gemma/Mistral/Qwen, GPT-2


class MutorLM(nn.Module):
    """lm: a transformers causal LM, possibly wrapped by peft. reg_weight: a in
    Loss = (1 - a) CE_ntp + a CE_reg (used only when the batch has registers)."""

    def __init__(self, lm: nn.Module, reg_weight: float = 0.5, registers: bool = True,
                 heads: nn.ModuleList | None = None, head_offsets: list[int] = ()):
        """heads / head_offsets: the multi-head baseline's extra layers and their offsets d >= 2
        (:func:`head_layers`); then Loss = (1 - a) CE_ntp + a mean_k CE_head_k."""
        super().__init__()
        self.lm = lm
        self.reg_weight = reg_weight
        if heads is not None:
            if len(heads) != len(head_offsets):
                raise ValueError(f"{len(heads)} heads for offsets {list(head_offsets)}: expected one each")
            self.heads, self.head_offsets = heads, [int(d) for d in head_offsets]
        if registers:
            table = self.causal_lm.get_input_embeddings().weight
            std = float(table.detach().float().std())
            self.register_embedding = nn.Parameter(torch.randn(table.shape[1], device=table.device) * std)

    @property
    def causal_lm(self) -> nn.Module:
        """The transformers model itself (inside a peft wrapper, the adapted base model)."""
        return self.lm.get_base_model() if hasattr(self.lm, "get_base_model") else self.lm

    @property
    def has_registers(self) -> bool:
        return hasattr(self, "register_embedding")

    @property
    def has_heads(self) -> bool:
        return hasattr(self, "heads")

    def hidden(self, packed: Packed, trunk: dict | None = None) -> Tensor:
        """(B, T + R, D) last hidden states of every slot. ``trunk``: a dict that receives the
        positional ("args") and keyword ("kwargs") inputs of the last decoder layer."""
        lm = self.causal_lm
        embeds = lm.get_input_embeddings()(packed.input_ids)
        B, R = embeds.shape[0], packed.num_registers
        if R:
            if not self.has_registers:
                raise ValueError("batch has registers but the model was built with registers=False")
            reg = self.register_embedding.to(embeds.dtype).expand(B, R, -1)
            embeds = torch.cat([embeds, reg], dim=1)
            mask = self._register_mask(packed, embeds)
        else:
            mask = packed.real.long()
        grab = None
        if trunk is not None:
            grab = decoder_part(lm, LAYERS)[-1].register_forward_pre_hook(
                lambda module, args, kwargs: trunk.update(args=args, kwargs=kwargs), with_kwargs=True)
        try:
            out = lm.get_decoder()(inputs_embeds=embeds, attention_mask=mask,
                                   position_ids=packed.position_ids, use_cache=False)
        finally:
            if grab is not None:
                grab.remove()
        return out[0]

    def _register_mask(self, packed: Packed, embeds: Tensor):
        """FlexAttention BlockMask when the model runs flex_attention, else the additive 4D mask.

        Sliding-window models: a 4D mask replaces the model's own, so the window is applied here
        (query position - key position < window, positions from ``packed.position_ids``; a register
        counts at its own position id): for every layer (Mistral), or for the "sliding_attention"
        layers through the per-layer-type dict the model accepts (Gemma 2/3, Qwen2 layer_types)."""
        config = self.causal_lm.config
        if getattr(config, "_attn_implementation", None) == "flex_attention":
            return packed.visibility.block_mask()
        allowed = packed.attention_mask()
        window = getattr(config, "sliding_window", None)
        if not window:
            return _additive(allowed, embeds.dtype)
        pos = packed.position_ids
        windowed = _additive(allowed & ((pos[:, None, :, None] - pos[:, None, None, :]) < window), embeds.dtype)
        layer_types = getattr(config, "layer_types", None)
        if layer_types is None:
            return windowed
        return {"full_attention": _additive(allowed, embeds.dtype), "sliding_attention": windowed}

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden (..., D) -> logits (..., V) through the model's output head."""
        lm = self.causal_lm
        logits = lm.get_output_embeddings()(hidden)
        cap = getattr(lm.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def forward(self, packed: Packed) -> ObjectiveResult:
        """The objectives' loss rule (mutor2d.objectives.mix) over the answer's next-token targets and
        the valid registers; logits only where a loss is taken."""
        trunk = {} if self.has_heads else None
        h = self.hidden(packed, trunk)
        T = packed.input_ids.shape[1]
        ntp = masked_ce(self.logits(h[:, :T][packed.ntp_mask]), packed.ntp_targets[packed.ntp_mask])
        aux, aux_name = None, "reg"
        if packed.num_registers:
            valid = packed.reg_valid
            aux = masked_ce(self.logits(h[:, T:][valid]), packed.reg_targets[valid])
        elif self.has_heads:
            aux, aux_name = self.head_loss(packed, trunk), "heads"
        tokens = torch.tensor(packed.position_ids.shape[0] * packed.position_ids.shape[1], device=h.device)
        return mix(ntp, aux, self.reg_weight, tokens, aux_name)

    def head_hidden(self, k: int, trunk: dict) -> Tensor:
        """(B, T, D) head k's normed output on the trunk output (the last layer's inputs ``trunk``)."""
        out = self.heads[k](*trunk["args"], **trunk["kwargs"])
        return decoder_part(self.causal_lm, NORMS)(out[0] if isinstance(out, tuple) else out)

    def head_loss(self, packed: Packed, trunk: dict) -> tuple[Tensor, Tensor]:
        """(mean over heads of each head's mean CE, valid targets of all heads)."""
        losses, count = [], 0
        for k, d in enumerate(self.head_offsets):
            valid, targets = head_targets(packed, d)
            hk = self.head_hidden(k, trunk)[:, :valid.shape[1]]
            loss, n = masked_ce(self.logits(hk[valid]), targets[valid])
            losses.append(loss)
            count = count + n
        return torch.stack(losses).mean(), count


def decoder_part(lm: nn.Module, names: tuple[str, ...]) -> nn.Module:
    """The decoder's layer list or final norm, by its family's attribute name."""
    decoder = lm.get_decoder()
    for name in names:
        if isinstance(getattr(decoder, name, None), nn.Module):
            return getattr(decoder, name)
    raise ValueError(f"objective multihead: the decoder {type(decoder).__name__} has none of {list(names)} "
                     "(expected a Llama-, Gemma-, Mistral-, Qwen- or GPT-2-style decoder)")


def head_layers(lm: nn.Module, offsets: list[int]) -> nn.ModuleList:
    """One extra decoder layer per offset d >= 2, each a trainable copy of the model's own last layer.

    Why a copy: head k sits where the last layer sits (on the trunk output, before the shared final
    norm and LM head), so at the first step every head is the pretrained next-token head and training
    moves it to offset d from a working predictor; a random layer would feed the pretrained norm and
    LM head noise and, through a = reg_weight, pull the shared trunk hard at the start. Call before
    LoRA wraps ``lm`` (the copies are plain, fully trainable layers; the trunk gets the adapters)."""
    last = decoder_part(lm, LAYERS)[-1]
    heads = nn.ModuleList(copy.deepcopy(last) for _ in offsets)
    return heads.requires_grad_(True)


def head_targets(packed: Packed, d: int) -> tuple[Tensor, Tensor]:
    """(valid, targets), both (B, max(T - d + 1, 0)): regular slot s predicts, at offset d, the token
    slot s + d - 1 predicts under next-token prediction (answer token a_{t+d} for anchor a_t, t = -1
    the last prompt token); valid where both slots carry an answer target (in one sequence)."""
    T = packed.input_ids.shape[1]
    n = max(T - d + 1, 0)
    valid = packed.ntp_mask[:, :n] & packed.ntp_mask[:, d - 1:d - 1 + n]
    return valid, packed.ntp_targets[:, d - 1:d - 1 + n]


def _additive(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """bool mask (True = may attend) -> additive float mask (0 / dtype min)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)
