"""A transformers causal LM with one register embedding: the MuToR-1D training forward.

The sequence of a Packed batch (regular slots, then register slots) goes through the model's own
decoder as ``inputs_embeds``: token embeddings for regular slots, the shared register embedding
(one vector of the hidden size, not a new vocabulary entry) for register slots; explicit
``position_ids``; a 4D additive mask (B, 1, L, L) built from the visibility rule (0 = may attend,
dtype min = blocked), or the rule's FlexAttention BlockMask when the model runs
``flex_attention``. Without registers a 2D padding mask is passed instead (the model's own
causal path). Logits are computed only where a loss is taken. Any causal LM whose decoder accepts
``inputs_embeds``, ``position_ids`` and a 4D mask works (Llama, Gemma, Qwen, GPT-2 families).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..objectives.base import ObjectiveResult, masked_ce, mix
from .packing import Packed


class MutorLM(nn.Module):
    """lm: a transformers causal LM, possibly wrapped by peft. reg_weight: a in
    Loss = (1 - a) CE_ntp + a CE_reg (used only when the batch has registers)."""

    def __init__(self, lm: nn.Module, reg_weight: float = 0.5, registers: bool = True):
        super().__init__()
        self.lm = lm
        self.reg_weight = reg_weight
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

    def hidden(self, packed: Packed) -> Tensor:
        """(B, T + R, D) last hidden states of every slot."""
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
        out = lm.get_decoder()(inputs_embeds=embeds, attention_mask=mask,
                               position_ids=packed.position_ids, use_cache=False)
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
        h = self.hidden(packed)
        T = packed.input_ids.shape[1]
        ntp = masked_ce(self.logits(h[:, :T][packed.ntp_mask]), packed.ntp_targets[packed.ntp_mask])
        reg = None
        if packed.num_registers:
            valid = packed.reg_valid
            reg = masked_ce(self.logits(h[:, T:][valid]), packed.reg_targets[valid])
        tokens = torch.tensor(packed.position_ids.shape[0] * packed.position_ids.shape[1], device=h.device)
        return mix(ntp, reg, self.reg_weight, tokens)


def _additive(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """bool mask (True = may attend) -> additive float mask (0 / dtype min)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)
