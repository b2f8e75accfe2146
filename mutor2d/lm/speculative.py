"""Registers at inference for language models: exact speculative decoding of a fine-tuned Hugging Face
causal LM, its MuToR-1D register embedding (``drafter.Registers``) as the drafter.

One round, per row (x_{n-1} the last emitted token, not yet in the KV cache, at position id s):
  regular inputs [x_{n-1}, d_n, ..., d_{n+K-1}] (K drafts) at position ids s .. s+K; after each
  regular input j (anchor x_t at position id s+j) K registers: the saved register embedding at
  position ids s+j + d - 1 for the trained offsets d = 2..K+1 (``RegisterSpec.draft_offsets``),
  seeing the prompt, x_0..x_t and themselves; nobody sees a register (``attention.Visibility``, the
  training rule), so register (j, d) predicts x_{t+d}. Regular output j is the target distribution
  p_j of token n+j. The drafts are verified by the speculative rule the image decoder runs too
  (``mutor2d.sampling.speculation``: sampled and greedy), so every token follows plain sampling's
  distribution and greedy decoding gives plain greedy's tokens. The next round's drafts (and their
  q) are the registers of the last kept input, so one forward verifies and drafts. The prefill
  drafts x_1..x_K from registers anchored at the last prompt token (MuToR-1D's anchor t = -1). Any
  register embedding is exact (an untrained one only drafts badly); K (``draft``) defaults to the
  checkpoint's useful draft length d_max - 1 and may not exceed it. Without registers the same loop
  decodes plainly, one token per forward.
KV cache: after each forward it is cropped back to the regular inputs (register keys and values
never stay); a draft rejected in one row but kept in another of the batch leaves a hole in the
first row, masked for good (batch 1: the cache is exactly plain decoding's). Rows are left-padded
prompts with Hugging Face's positions (mask cumsum - 1); they advance at their own pace and leave
the batch when done (EOS, a stop string, ``max_new_tokens``: ``rows.Rows``); with ``synced`` (FSDP2)
they stay, ignored, until every process is done. The attention mask is a 4D additive one (sliding
windows applied from position ids as in training), so ``sdpa`` or ``eager`` attention, not flex.

    ids = generate_ids(model, input_ids, attention_mask, 40, registers=load_registers(run), eos=[eos])
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from ..model.attention import NEVER, Visibility, open_prefix
from ..sampling import speculation
from ..sampling.rules import SamplingRules
from ..sampling.speculation import Drafts, emitted, pick, reached
from ..sampling.stats import DecodeStats
from .drafter import Registers
from .model import PROMPT_ATTR, attention_mask, base_model, cache_kwarg, lm_logits, position_limit
from .rows import Rows

GREEDY = SamplingRules(temperature=0.0)


# ----------------------------------------------------------------------------- one forward

class CausalStep:
    """A transformers causal LM as embed -> decoder with a KV cache -> logits (inside a peft
    wrapper, its adapted base model), taking the training forward's inputs (mutor2d.lm.model)."""

    def __init__(self, lm):
        self.base = base_model(lm)
        self.config = self.base.config
        attn = getattr(self.config, "_attn_implementation", None)
        if attn == "flex_attention":
            raise ValueError("attn_implementation='flex_attention': register decoding takes a 4D mask; "
                             "load the model with sdpa or eager")
        self.decoder, self.embed = self.base.get_decoder(), self.base.get_input_embeddings()
        self.cache_arg = cache_kwarg(self.decoder)
        self.device = self.embed.weight.device

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden (..., D) -> logits (..., V) (Gemma 2's soft-capping included)."""
        return lm_logits(self.base, hidden)

    def __call__(self, cache, keys: "CacheKeys", ids: Tensor, pos: Tensor, real: Tensor,
                 register: Tensor | None = None, reg_pos: Tensor | None = None,
                 reg_anchor: Tensor | None = None, open_prefix_len: int = 0) -> Tensor:
        """R regular inputs ids / pos / real (b, R) after the cached keys, then E registers (embedding
        ``register`` (D,) at reg_pos (b, E), each seeing the cache and regular inputs 0..reg_anchor
        (b, E) and itself) -> last hidden states (b, R + E, D). The cache receives all R + E keys.
        ``open_prefix_len``: the prefill of a model with bidirectional prompts (attention.open_prefix)."""
        embeds = self.embed(ids)
        b, R = ids.shape
        E = 0 if reg_pos is None else reg_pos.shape[1]
        L = keys.ok.shape[1]
        j = torch.arange(R, device=ids.device).expand(b, R)
        rank = [torch.where(keys.ok, 0, NEVER), torch.where(real, L + j, NEVER)]
        limit = [torch.where(real, L + j, -1)]
        positions = [pos]
        if E:
            embeds = torch.cat([embeds, register.to(embeds.dtype).expand(b, E, -1)], 1)
            rank.append(torch.full((b, E), NEVER, device=ids.device))
            limit.append(L + reg_anchor)
            positions.append(reg_pos)
        own = (L + torch.arange(R + E, device=ids.device)).expand(b, R + E)
        vis = Visibility(torch.cat(rank, 1), torch.cat(limit, 1), own_key=own)
        if open_prefix_len > 1:
            vis = open_prefix(vis, L + open_prefix_len)
        q_pos = torch.cat(positions, 1)
        mask = attention_mask(self.config, vis, q_pos, embeds.dtype, key_pos=torch.cat([keys.pos, q_pos], 1))
        out = self.decoder(inputs_embeds=embeds, attention_mask=mask, position_ids=q_pos, use_cache=True,
                           **{self.cache_arg: cache})
        return out[0]


@dataclass
class CacheKeys:
    """What each cached slot is: ok (b, L) bool (a real token, not padding or a hole), pos (b, L) its
    position id."""
    ok: Tensor
    pos: Tensor

    def extend(self, ok: Tensor, pos: Tensor) -> "CacheKeys":
        return CacheKeys(torch.cat([self.ok, ok], 1), torch.cat([self.pos, pos], 1))

    def select(self, index: Tensor) -> "CacheKeys":
        return CacheKeys(self.ok[index], self.pos[index])


def new_cache():
    """An empty DynamicCache of full-attention layers (a sliding-window layer would drop keys the
    holes' bookkeeping counts; the window is in the mask)."""
    from transformers import DynamicCache
    return DynamicCache()


# ----------------------------------------------------------------------------- the rounds

def _any(alive: bool, synced: bool, device) -> bool:
    """Whether any row decodes (on any process when ``synced``)."""
    if not synced:
        return alive
    flag = torch.tensor([int(alive)], device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())


class Decoding:
    """One batch being decoded (module doc): ``cache`` and ``keys`` (CacheKeys) of the rows still in it,
    ``rows`` (b,) their indices in the batch, ``token`` (b,) their last emitted token x_{n-1} (not
    cached), ``last_pos`` (b,) the position id of their last cached token, ``n`` (b,) tokens emitted,
    ``drafts`` the next round's (K = 0 without registers), ``state`` the host-side Rows."""

    def __init__(self, lm, registers: Registers | None, rules: SamplingRules, state: Rows, generator=None,
                 stats: DecodeStats | None = None, synced: bool = False, prompt_attention: str = "causal"):
        self.step, self.rules, self.state, self.generator, self.synced = CausalStep(lm), rules, state, generator, synced
        self.bidirectional = prompt_attention == "bidirectional"
        self.stats = stats if stats is not None else DecodeStats()
        dev = self.dev = self.step.device
        self.K = registers.draft if registers is not None else 0
        self.offsets = torch.tensor(registers.offsets if self.K else [], dtype=torch.long, device=dev)
        self.register = registers.embedding.to(dev) if self.K else None
        self.limit = position_limit(self.step.config) or 1 << 30
        self.cache = new_cache()

    def _register_pos(self, anchor_pos: Tensor) -> Tensor:
        """Anchor position ids (b, A) -> their registers' (b, A*K): anchor + d - 1, anchor-major."""
        return (anchor_pos[:, :, None] + self.offsets - 1).flatten(1).clamp(max=self.limit - 1)

    def _new_drafts(self, hidden: Tensor) -> None:
        """Register hidden states (b, K, D) of the last kept input -> the next round's drafts, slots
        within max_new_tokens and the model's positions."""
        i = torch.arange(self.K, device=self.dev)
        valid = ((self.n[:, None] + i) < self.state.max_new) & ((self.last_pos[:, None] + 2 + i) < self.limit)
        q = self.rules.probs(self.step.logits(hidden))
        self.drafts = Drafts.drawn(q, valid, self.rules.greedy, self.generator)

    def prefill(self, input_ids: Tensor, attention_mask: Tensor) -> None:
        """The prompts (B, P), left-padded: x_0 from the last prompt token, drafts x_1..x_K from the
        registers anchored there."""
        input_ids, real = input_ids.to(self.dev), attention_mask.to(self.dev).bool()
        B, P, K = *input_ids.shape, self.K
        pos = (real.long().cumsum(1) - 1).masked_fill(~real, 1)      # Hugging Face's left-padded positions
        self.keys, self.last_pos = CacheKeys(real[:, :0], pos[:, :0]), pos[:, -1]
        self.rows, self.n = torch.arange(B, device=self.dev), torch.ones(B, dtype=torch.long, device=self.dev)
        hidden = self.step(self.cache, self.keys, input_ids, pos, real, self.register,
                           self._register_pos(self.last_pos[:, None]) if K else None,
                           torch.full((B, K), P - 1, device=self.dev), P if self.bidirectional else 0)
        _drop(self.cache, K)
        self.keys = self.keys.extend(real, pos)
        logits = self.step.logits(hidden[:, P - 1])
        self.token = pick(self.rules.probs(logits), self.rules.greedy, self.generator)
        self.stats.add_plain(B, 0, 1, B)
        for b, t in enumerate(self.token.tolist()):
            self.state.emit(b, [t])
        if K:
            self._new_drafts(hidden[:, P:])
        else:
            self.drafts = Drafts.none(B, 0, logits.shape[-1], self.rules.greedy, self.dev)

    def alive(self) -> Tensor:
        """(b,) bool: which rows still decode."""
        return torch.tensor([not self.state.done[r] for r in self.rows.tolist()], dtype=torch.bool, device=self.dev)

    def keep(self, index: Tensor) -> None:
        """Keep only the rows ``index`` (b',) in the batch (cache included)."""
        self.cache.batch_select_indices(index)
        self.keys = self.keys.select(index)
        self.rows, self.token, self.last_pos, self.n = (t[index] for t in
                                                        (self.rows, self.token, self.last_pos, self.n))
        self.drafts = self.drafts.select(index)

    def round(self, alive: Tensor) -> None:
        """One forward: verify the drafts after x_{n-1}, emit the kept tokens and the next one, draft
        again from the registers of the last kept input; then the cache keeps the kept inputs only."""
        b, K, dev = self.rows.shape[0], self.K, self.dev
        j = torch.arange(K + 1, device=dev)
        ids = torch.cat([self.token[:, None], self.drafts.tokens], 1)
        in_pos = self.last_pos[:, None] + 1 + j                               # x_{n-1}, then the drafts
        hidden = self.step(self.cache, self.keys, ids, in_pos.clamp(max=self.limit - 1),
                           torch.ones_like(ids, dtype=torch.bool), self.register,
                           self._register_pos(in_pos) if K else None, j.repeat_interleave(K).expand(b, -1))
        p = self.rules.probs(self.step.logits(hidden[:, :K + 1]))
        kept, token, lead = speculation.verify(p, self.drafts, self.generator)
        furthest = int(kept.max())
        _drop(self.cache, K * (K + 1) + K - furthest)                   # the registers, drafts no row kept
        self.keys = self.keys.extend((j[:furthest + 1] <= kept[:, None]) & alive[:, None], in_pos[:, :furthest + 1])
        self.stats.add_round(alive, reached(lead, self.drafts.valid), lead)
        tokens = emitted(self.drafts.tokens, kept, token)
        for r, toks, k, on in zip(self.rows.tolist(), tokens.tolist(), kept.tolist(), alive.tolist()):
            if on:
                self.state.emit(r, toks[:k + 1])
        self.token, self.n, self.last_pos = token, self.n + kept + 1, self.last_pos + kept + 1
        if K:
            group = hidden[:, K + 1:].unflatten(1, (K + 1, K))[torch.arange(b, device=dev), kept]   # (b, K, D)
            self._new_drafts(group)

    def run(self) -> None:
        """Rounds until every row is done (on every process when synced); done rows leave the batch
        unless synced."""
        while True:
            alive = self.alive()
            if not _any(bool(alive.any()), self.synced, self.dev):
                return
            if not self.synced and not bool(alive.all()):
                self.keep(alive.nonzero()[:, 0])
                alive = alive[alive]
            self.round(alive)


@torch.no_grad()
def generate_ids(lm, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int, *,
                 registers: Registers | None = None, rules: SamplingRules = GREEDY, eos=(), stop=(),
                 tokenizer=None, generator: torch.Generator | None = None, stats: DecodeStats | None = None,
                 synced: bool = False, raw_stop: bool = False, prompt_attention: str | None = None) -> list[list[int]]:
    """New tokens of each left-padded prompt (input_ids, attention_mask (B, P)), register-drafted
    (``registers`` None: plain decoding, one token per forward, by the same loop) -> per row its
    tokens, ending at the first ``eos`` id (kept), at the token completing a ``stop`` string (decoded
    with ``tokenizer``, matched as ``raw_stop`` says: Rows; the caller cuts the text) or after
    ``max_new_tokens``. ``prompt_attention`` bidirectional (None: the rule load_for_inference gave
    ``lm``, else causal): the prefill opens the prompt to itself (registers and decoding as before)."""
    t0 = time.perf_counter()
    prompts = [row[keep.bool()].tolist() for row, keep in zip(input_ids, attention_mask)] if raw_stop else None
    state = Rows(input_ids.shape[0], max_new_tokens, eos, stop, tokenizer, prompts, raw_stop)
    rule = prompt_attention or getattr(lm, PROMPT_ATTR, "causal")
    decoding = Decoding(lm, registers, rules, state, generator, stats, synced, rule)
    decoding.prefill(input_ids, attention_mask)
    decoding.run()
    decoding.stats.tokens += sum(len(o) for o in state.out)
    decoding.stats.seconds += time.perf_counter() - t0
    return state.out


def _drop(cache, n: int) -> None:
    """Remove the last ``n`` slots of every layer of the cache (none for n = 0)."""
    if n:
        cache.crop(-n)


def eos_ids(lm) -> list[int]:
    """The end-of-sequence ids the model's ``generate`` stops at (its generation config's)."""
    config = getattr(lm, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    eos = getattr(lm.config, "eos_token_id", None) if eos is None else eos
    return [] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]
