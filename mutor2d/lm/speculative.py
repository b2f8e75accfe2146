"""Decoding a Hugging Face causal LM by the image decoder's round loop (mutor2d.sampling.rounds): plain
(K = 0) or exact speculative decoding with a MuToR-1D checkpoint's registers as the drafter.

Frame (``HFStep.frame``): left-padded prompts at HF's positions (mask cumsum - 1), then new tokens on a
line (1, max_new_tokens). The KV cache keeps the regular inputs some row kept, never registers: a draft one
row rejected and another kept is a masked hole in the first (batch 1: exactly plain decoding's cache).
The 4D additive mask applies sliding windows from position ids: ``sdpa`` or ``eager``, not flex.

    ids = generate_ids(model, input_ids, attention_mask, 40, registers=load_registers(run), eos=[eos])
"""
from __future__ import annotations

import time
import torch
from torch import Tensor

from ..config import make
from ..model.attention import NEVER, open_prefix
from ..model.extras import register_visibility
from ..objectives.spec import NO_REGISTERS
from ..registry import build
from ..sampling.rounds import Ends, Extras, Frame, decode
from ..sampling.rules import SamplingRules
from ..sampling.stats import DecodeStats
from .drafter import Registers
from .model import PROMPT_ATTR, attention_mask, base_model, cache_kwarg, lm_logits, position_limit
from .rows import Rows

GREEDY = SamplingRules(temperature=0.0)


def new_cache():
    """An empty DynamicCache of full-attention layers (the sliding window is in the mask)."""
    from transformers import DynamicCache
    return DynamicCache()


class HFStep:
    """A transformers causal LM over left-padded prompts (B, P) being decoded (``rounds.Step``); ``register``
    (D,): the registers' embedding; cached slot l is ``ok`` (b, L) at position id ``key_pos`` (b, L)."""

    def __init__(self, lm, input_ids: Tensor, attention_mask: Tensor, register: Tensor | None = None,
                 bidirectional: bool = False):
        self.base = base_model(lm)
        self.config = self.base.config
        if getattr(self.config, "_attn_implementation", None) == "flex_attention":
            raise ValueError("attn_implementation='flex_attention': register decoding takes a 4D mask; "
                             "load the model with sdpa or eager")
        self.decoder, self.embed = self.base.get_decoder(), self.base.get_input_embeddings()
        self.cache_arg, self.device = cache_kwarg(self.decoder), self.embed.weight.device
        self.ids, self.real = input_ids.to(self.device), attention_mask.to(self.device).bool()
        self.batch, self.P = self.ids.shape
        self.pos = (self.real.long().cumsum(1) - 1).masked_fill(~self.real, 1)   # Hugging Face's left-padded positions
        self.register = None if register is None else register.to(self.device)
        self.open = self.P if bidirectional else 0
        self.cache, self.ok, self.key_pos = new_cache(), self.real[:, :0], self.pos[:, :0]

    def prefill(self, extras: Extras | None) -> Tensor:
        """The prompts (the cache keeps them all, not the registers) -> hidden states (B, P + E, D)."""
        hidden = self._run(self.ids, self.pos, self.real, extras, self.open)
        self._crop(hidden.shape[1] - self.P)
        self._keep(self.real, self.pos)
        return hidden

    def forward(self, tokens: Tensor, index, positions: Tensor, extras: Extras | None) -> Tensor:
        self.new = positions[..., 1]                    # the regular inputs' position ids, for ``commit``
        hidden = self._run(tokens, self.new, torch.ones_like(tokens, dtype=torch.bool), extras)
        self.added = hidden.shape[1]                    # the slots this forward put into the cache
        return hidden

    def logits(self, hidden: Tensor) -> Tensor:
        return lm_logits(self.base, hidden)

    def commit(self, kept: Tensor, active: Tensor) -> None:
        """Crop the cache to the regular inputs some row kept; ``ok`` marks which each row keeps."""
        furthest = int(kept.max())
        self._crop(self.added - furthest - 1)
        j = torch.arange(furthest + 1, device=kept.device)
        self._keep((j <= kept[:, None]) & active[:, None], self.new[:, :furthest + 1])

    def _crop(self, n: int) -> None:
        """Remove the last ``n`` slots of every layer of the cache."""
        if n:
            self.cache.crop(-n)

    def _keep(self, ok: Tensor, pos: Tensor) -> None:
        self.ok, self.key_pos = torch.cat([self.ok, ok], 1), torch.cat([self.key_pos, pos], 1)

    def frame(self, max_new_tokens: int, K: int) -> Frame:
        """Each row's prompt positions, then new token t at prompt_len + t, clamped; ``room``: those that fit."""
        limit, length = position_limit(self.config) or 1 << 30, self.real.sum(1)
        new = (length[:, None] + torch.arange(max_new_tokens + K, device=self.device)).clamp(max=limit - 1)
        line = torch.cat([self.pos, new], 1)
        return Frame((1, max_new_tokens), self.P, torch.stack([torch.zeros_like(line), line], -1), limit - length)

    def select(self, index: Tensor) -> None:
        self.cache.batch_select_indices(index)
        self.ok, self.key_pos = self.ok[index], self.key_pos[index]

    def _run(self, ids: Tensor, pos: Tensor, real: Tensor, extras: Extras | None, open_prefix_len: int = 0) -> Tensor:
        """Regular ids / pos / real (b, R), then ``extras``' registers -> hidden (b, R + E, D); all keys cached."""
        embeds, (b, R), L = self.embed(ids), ids.shape, self.ok.shape[1]
        j = L + torch.arange(R, device=ids.device).expand(b, R)
        rank = torch.cat([torch.where(self.ok, 0, NEVER), torch.where(real, j, NEVER)], 1)
        reads, positions = torch.zeros(b, 0, dtype=torch.long, device=ids.device), [pos]
        if extras is not None:
            E = extras.reads.shape[1]
            embeds = torch.cat([embeds, self.register.to(embeds.dtype).expand(b, E, -1)], 1)
            reads, positions = L + extras.reads, [pos, extras.positions[..., 1]]
        own = (L + torch.arange(R + reads.shape[1], device=ids.device)).expand(b, -1)
        vis = register_visibility(rank, torch.where(real, j, -1), reads, own)
        if open_prefix_len > 1:
            vis = open_prefix(vis, L + open_prefix_len)
        q_pos = torch.cat(positions, 1)
        mask = attention_mask(self.config, vis, q_pos, embeds.dtype, key_pos=torch.cat([self.key_pos, q_pos], 1))
        return self.decoder(inputs_embeds=embeds, attention_mask=mask, position_ids=q_pos, use_cache=True,
                            **{self.cache_arg: self.cache})[0]


class TextEnds(Ends):
    """Rows end where ``state`` (rows.Rows) says and leave the batch, unless ``synced``."""

    def __init__(self, state: Rows, K: int, synced: bool = False):
        super().__init__(state.max_new, K)
        self.state, self.synced, self.leaves = state, synced, not synced

    def emit(self, rows, tokens, count, n):
        for r, toks, c in zip(rows.tolist(), tokens.tolist(), count.tolist()):
            self.state.emit(r, toks[:c])            # nothing when c = 0
        return torch.tensor([not self.state.done[r] for r in rows.tolist()], dtype=torch.bool, device=rows.device)

    def more(self, active, rounds):
        """Whether any row decodes (on any process when synced)."""
        if not self.synced:
            return bool(active.any())
        flag = active.any().long()[None]
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())


@torch.no_grad()
def generate_ids(lm, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int, *,
                 registers: Registers | None = None, rules: SamplingRules = GREEDY, eos=(), stop=(),
                 tokenizer=None, generator: torch.Generator | None = None, stats: DecodeStats | None = None,
                 synced: bool = False, raw_stop: bool = False, prompt_attention: str | None = None) -> list[list[int]]:
    """New tokens of each left-padded prompt (B, P), register-drafted (``registers`` None: plain) -> per row
    its tokens, ending at the first ``eos`` (kept), a completed ``stop`` string (Rows) or ``max_new_tokens``."""
    t0 = time.perf_counter()
    prompts = [row[keep.bool()].tolist() for row, keep in zip(input_ids, attention_mask)] if raw_stop else None
    state = Rows(input_ids.shape[0], max_new_tokens, eos, stop, tokenizer, prompts, raw_stop)
    bidirectional = (prompt_attention or getattr(lm, PROMPT_ATTR, "causal")) == "bidirectional"
    step = HFStep(lm, input_ids, attention_mask, None if registers is None else registers.embedding, bidirectional)
    mode = make("sample.decode", name="registers", draft=registers.draft) if registers else make("sample.decode")
    drafter = build(mode, registers.spec if registers else NO_REGISTERS, (1, max_new_tokens), step.batch, step.device)
    stats = stats if stats is not None else DecodeStats()
    decode(step, drafter, step.frame(max_new_tokens, drafter.K), rules, generator, stats,
           TextEnds(state, drafter.K, synced))
    stats.tokens += sum(len(o) for o in state.out)
    stats.seconds += time.perf_counter() - t0
    return state.out


def eos_ids(lm) -> list[int]:
    """The end-of-sequence ids the model's ``generate`` stops at (its generation config's)."""
    eos = getattr(getattr(lm, "generation_config", None), "eos_token_id", None)
    eos = getattr(lm.config, "eos_token_id", None) if eos is None else eos
    return [] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]
