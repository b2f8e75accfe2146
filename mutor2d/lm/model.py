"""A transformers causal LM with one register embedding, as the objectives' model (no loss here).

:class:`MutorLM`: the causal LM (maybe peft-wrapped), the register embedding (one hidden-size vector) and
the multi-head baseline's extra decoder layers (:func:`head_layers`); runs ``inputs_embeds`` with
``position_ids`` and a 4D additive mask (B, 1, L, L) or a FlexAttention BlockMask from the visibility rule.
:class:`FramedLM`: a MutorLM on one batch's Frame, the objectives' ``TokenModel``.
"""
from __future__ import annotations

import copy
import inspect
from contextlib import nullcontext

import torch
from torch import Tensor, nn

from ..model.attention import Visibility, causal_rule, open_prefix
from ..objectives.base import Batch
from ..objectives.spec import RegisterSpec
from .packing import Frame, LMBatch, canonical, frame, line_width

LAYERS, NORMS = ("layers", "h"), ("norm", "ln_f")        # decoder attributes: Llama/Gemma/Mistral/Qwen, GPT-2
REGISTER_FILE = "register_embedding.safetensors"         # the register embedding in a saved folder (lm.hf.save)
PROMPT_ATTR = "mutor2d_prompt_attention"                 # a loaded model's prompt rule (lm.hf.with_prompt_attention)


def base_model(lm: nn.Module) -> nn.Module:
    """The transformers model itself (inside a peft wrapper, the adapted base model)."""
    return lm.get_base_model() if hasattr(lm, "get_base_model") else lm


def lm_logits(lm: nn.Module, hidden: Tensor) -> Tensor:
    """hidden (..., D) -> logits (..., V) through the model's output head (Gemma 2's soft-capping included)."""
    logits = lm.get_output_embeddings()(hidden)
    cap = getattr(lm.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def cache_kwarg(module) -> str:
    """The KV cache keyword of a model or decoder: ``cache`` since transformers 5.24, ``past_key_values`` before."""
    forward = type(base_model(module)).forward
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def position_limit(config) -> int | None:
    """The positions ``config`` declares (max_position_embeddings or n_positions); None if none."""
    config = getattr(config, "text_config", None) or config
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


class MutorLM(nn.Module):
    """lm: a transformers causal LM, possibly wrapped by peft. registers: add the register
    embedding; heads: the multi-head baseline's extra layers (:func:`head_layers`); prompt_attention:
    "causal", or "bidirectional" (prompt tokens see the whole prompt: attention.open_prefix)."""

    def __init__(self, lm: nn.Module, registers: bool = True, heads: nn.ModuleList | None = None,
                 prompt_attention: str = "causal"):
        super().__init__()
        self.lm, self.prompt_attention = lm, prompt_attention
        if heads is not None:
            self.heads = heads
        if registers:
            table = self.causal_lm.get_input_embeddings().weight
            std = float(table.detach().float().std())
            self.register_embedding = nn.Parameter(torch.randn(table.shape[1], device=table.device) * std)

    @property
    def causal_lm(self) -> nn.Module:
        """The transformers model itself (inside a peft wrapper, the adapted base model)."""
        return base_model(self.lm)

    @property
    def has_registers(self) -> bool:
        return hasattr(self, "register_embedding")

    def head_layers(self, count: int) -> None:
        """The extra head layers an objective asks for: this model holds its own (built with it,
        before LoRA, :func:`head_layers`), so None; a ValueError if it holds another number."""
        have = len(getattr(self, "heads", ()))
        if count != have:
            raise ValueError(f"the objective asks for {count} extra head layers, the model was built with "
                             f"{have} (ObjectiveConfig.num_head_layers)")

    def embed(self, ids: Tensor, num_extra: int = 0) -> Tensor:
        """ids (B, T) -> (B, T + num_extra, D): token embeddings, then the register embedding."""
        embeds = self.causal_lm.get_input_embeddings()(ids)
        if not num_extra:
            return embeds
        if not self.has_registers:
            raise ValueError("num_extra > 0 needs a model built with registers=True")
        reg = self.register_embedding.to(embeds.dtype).expand(embeds.shape[0], num_extra, -1)
        return torch.cat([embeds, reg], dim=1)

    def decode(self, embeds: Tensor, position_ids: Tensor, vis: Visibility | None, real: Tensor,
               trunk: dict | None = None) -> Tensor:
        """(B, L, D) last hidden states (after the final norm) of slots ``embeds`` (B, L, D); vis None = causal
        over ``real`` (B, T); ``trunk``: receives the last decoder layer's "args" and "kwargs"."""
        lm = self.causal_lm
        mask = real.long() if vis is None else attention_mask(lm.config, vis, position_ids, embeds.dtype)
        grab = nullcontext() if trunk is None else decoder_part(lm, LAYERS)[-1].register_forward_pre_hook(
            lambda module, args, kwargs: trunk.update(args=args, kwargs=kwargs), with_kwargs=True)
        with grab:                                  # a hook handle removes itself on exit
            return lm.get_decoder()(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids,
                                    use_cache=False)[0]

    def head_hidden(self, k: int, trunk: dict) -> Tensor:
        """(B, L, D) head k's normed output on the trunk output (the last layer's inputs ``trunk``)."""
        out = self.heads[k](*trunk["args"], **trunk["kwargs"])
        return decoder_part(self.causal_lm, NORMS)(out[0] if isinstance(out, tuple) else out)

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden (..., D) -> logits (..., V) through the model's output head."""
        return lm_logits(self.causal_lm, hidden)


class FramedLM:
    """A MutorLM on one batch's frame: the objectives' TokenModel over the canonical frame (T_can regular
    slots, then E extra); ``hidden`` runs the physical sequence and returns canonical hidden states (zeros
    on canonical padding); logits only at valid rows."""
    sparse_logits = True

    def __init__(self, model: MutorLM, frame: Frame, prefix_width: int):
        """prefix_width: P_max, the canonical prefix (prompts left-padded to it)."""
        self.model, self.frame, self.prefix_width = model, frame, prefix_width

    def prefix_len(self, prefix: Tensor) -> int:
        return prefix.shape[1]

    def head_layers(self, count: int) -> None:
        return self.model.head_layers(count)

    def embed(self, tokens: Tensor | None, prefix: Tensor | None, num_extra: int = 0) -> Tensor:
        """(B, P + T_tokens + num_extra, D) input embeddings of prefix + tokens + extra slots."""
        ids = [t for t in (prefix, tokens) if t is not None and t.shape[1] > 0]
        return self.model.embed(torch.cat(ids, dim=1), num_extra)

    def hidden(self, h: Tensor, positions: Tensor, vis: Visibility | None = None,
               prefix_len: int | None = None) -> Tensor:
        """Embeddings (B, T_can + E, D), line position ids (B, T_can + E, 2), rule (None: causal, E = 0)
        -> last hidden states (B, T_can + E, D). The prefix is the frame's (``prefix_len`` unused)."""
        return self._canonical(self.model.decode(*self._physical(h, positions, vis)))

    def hidden_with_heads(self, h: Tensor, positions: Tensor, heads: None = None,
                          prefix_len: int | None = None) -> tuple[Tensor, list[Tensor]]:
        """Causal (prompt rule as ``hidden``), no extra slots: (last hidden states (B, T_can, D),
        [head k's (B, T_can, D)]) of the model's own heads (``heads`` is None: :meth:`MutorLM.head_layers`)."""
        trunk = {}
        out = self.model.decode(*self._physical(h, positions, None), trunk)
        heads = [self.model.head_hidden(k, trunk) for k in range(len(self.model.heads))]
        return self._canonical(out), [self._canonical(x) for x in heads]

    def logits(self, h: Tensor) -> Tensor:
        return self.model.logits(h)

    def _physical(self, h: Tensor, positions: Tensor, vis: Visibility | None):
        """(embeddings (B, T + E, D), position ids (B, T + E), rule or None, real (B, T)) of the physical sequence."""
        f, T_can = self.frame, self.frame.num_canonical
        regular = vis.num_regular if vis is not None and vis.num_regular is not None else h.shape[1]
        if regular != T_can or (vis is None and h.shape[1] != T_can):
            raise ValueError(f"{h.shape[1]} slots with {regular} regular ones: expected the {T_can} canonical "
                             "regular slots of the batch's frame, then the extra ones (with a visibility rule)")
        embeds = torch.cat([f.regular(h[:, :T_can], 0.0), h[:, T_can:]], dim=1)
        rule = self._prompt_rule(vis, h)
        physical = f.visibility(rule) if rule is not None else None
        return embeds, f.positions(positions[..., 1]), physical, f.real

    def _prompt_rule(self, vis: Visibility | None, h: Tensor) -> Visibility | None:
        """The canonical rule under the model's ``prompt_attention`` (None: causal)."""
        if self.model.prompt_attention == "causal" or self.prefix_width < 2:
            return vis
        return open_prefix(vis if vis is not None else causal_rule(h.shape[0], h.shape[1], h.device),
                           self.prefix_width)

    def _canonical(self, out: Tensor) -> Tensor:
        T = self.frame.num_regular
        return torch.cat([self.frame.canonical(out[:, :T]), out[:, T:]], dim=1)


def frame_batch(model: MutorLM, batch: LMBatch, spec: RegisterSpec, padding_side: str,
                device) -> tuple[FramedLM, Batch]:
    """(the model on ``batch``'s frame, the batch in the canonical frame) on ``device``, as wide as ``spec`` needs."""
    width = line_width(spec, int(batch.answer_len.max()))
    prefix, body = canonical(batch, width)
    f = frame(batch.prompt_len, batch.answer_len, width, padding_side).to(device)
    body, prefix, lengths = (t.to(device, non_blocking=True) for t in (body, prefix, batch.answer_len.long()))
    return FramedLM(model, f, prefix.shape[1]), Batch(body, prefix, (1, width), lengths)


def decoder_part(lm: nn.Module, names: tuple[str, ...]) -> nn.Module:
    """The decoder's layer list or final norm, by its family's attribute name."""
    decoder = lm.get_decoder()
    for name in names:
        if isinstance(getattr(decoder, name, None), nn.Module):
            return getattr(decoder, name)
    raise ValueError(f"objective multihead: the decoder {type(decoder).__name__} has none of {list(names)} "
                     "(expected a Llama-, Gemma-, Mistral-, Qwen- or GPT-2-style decoder)")


def head_layers(lm: nn.Module, count: int) -> nn.ModuleList:
    """``count`` extra decoder layers, each a trainable copy of the model's own last layer (so every head
    starts as the pretrained next-token head). Call before LoRA wraps ``lm``."""
    last = decoder_part(lm, LAYERS)[-1]
    return nn.ModuleList(copy.deepcopy(last) for _ in range(count)).requires_grad_(True)


def attention_mask(config, vis: Visibility, pos: Tensor, dtype: torch.dtype, key_pos: Tensor | None = None):
    """The FlexAttention BlockMask (flex_attention models) or additive 4D mask for rule ``vis``; sliding
    windows applied here from positions ``pos`` (B, Lq) and ``key_pos`` (B, Lk) (default ``pos``)."""
    if getattr(config, "_attn_implementation", None) == "flex_attention":
        return vis.block_mask()
    allowed = vis.dense_mask()
    if not (window := getattr(config, "sliding_window", None)):
        return _additive(allowed, dtype)
    key_pos = pos if key_pos is None else key_pos
    windowed = _additive(allowed & ((pos[:, None, :, None] - key_pos[:, None, None, :]) < window), dtype)
    if getattr(config, "layer_types", None) is None:
        return windowed
    return {"full_attention": _additive(allowed, dtype), "sliding_attention": windowed}


def _additive(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """bool mask (True = may attend) -> additive float mask (0 / dtype min)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)
