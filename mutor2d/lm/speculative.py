"""Registers at inference for language models: exact speculative decoding of a fine-tuned Hugging Face
causal LM, its MuToR-1D register embedding as the drafter.

One round, per row (x_{n-1} the last emitted token, not yet in the KV cache, at position id s):
  regular inputs [x_{n-1}, d_n, ..., d_{n+K-1}] (K drafts) at position ids s .. s+K; after each
  regular input j (anchor x_t at position id s+j) K registers: the saved register embedding at
  position ids s+j + d - 1 for the trained offsets d = 2..K+1 (``RegisterSpec.draft_offsets``),
  seeing the prompt, x_0..x_t and themselves; nobody sees a register (``attention.Visibility``, the
  training rule), so register (j, d) predicts x_{t+d}. Regular output j is the target distribution
  p_j of token n+j. Drafts are verified left to right by the standard speculative rule
  (``mutor2d.sampling.speculative.verify``): d ~ q is kept with probability min(1, p(d)/q(d)); at
  the first rejection the token is drawn from normalise(max(p - q, 0)) and the round ends; if all
  are kept one more token comes from the next p. The next round's drafts (and their q) are the
  registers of the last kept input, so one forward verifies and drafts. The prefill drafts x_1..x_K
  from registers anchored at the last prompt token (MuToR-1D's anchor t = -1).
Exactness: p and q both come from ``SamplingRules`` (temperature, top-k, top-p), so every token
follows plain sampling's distribution given the tokens before it; temperature 0 makes p and q
one-hot, computed here directly on argmaxes: plain greedy decoding token for token. Any register
embedding is exact (an untrained one only drafts badly); K (``draft``) defaults to the checkpoint's
useful draft length d_max - 1 and may not exceed it.
KV cache: after each forward it is cropped back to the regular inputs (register keys and values
never stay); a draft rejected in one row but kept in another of the batch leaves a hole in the
first row, masked for good (batch 1: the cache is exactly plain decoding's). Rows are left-padded
prompts with Hugging Face's positions (mask cumsum - 1); they advance at their own pace and leave
the batch when done (EOS, a stop string, ``max_new_tokens``); with ``synced`` (FSDP2) they stay,
ignored, until every process is done. The attention mask is a 4D additive one (sliding windows
applied from position ids as in training), so ``sdpa`` or ``eager`` attention, not flex.

    regs = load_registers("runs/lm_tiny_arith")            # register_embedding + config.yaml's d_max
    ids = generate_ids(model, input_ids, attention_mask, 40, registers=regs, eos=[tok.eos_token_id])
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file
from torch import Tensor

from ..model.attention import NEVER, Visibility, open_prefix
from ..config import make
from ..sampling.auto import can_draft as objective_drafts
from ..sampling.rules import SamplingRules, draw
from ..sampling.speculative import Drafts, useful_draft, verify
from .model import PROMPT_ATTR, REGISTER_FILE, attention_mask, cache_kwarg, position_limit

MODES = ("plain", "registers", "auto")
GREEDY = SamplingRules(temperature=0.0)


# ----------------------------------------------------------------------------- the drafter

@dataclass(frozen=True)
class Registers:
    """A MuToR-1D checkpoint's drafter: ``embedding`` (D,) the trained register embedding and
    ``offsets`` the distances d = 2..K+1 its registers draft (K = ``draft``)."""
    embedding: Tensor
    offsets: tuple[int, ...]

    @property
    def draft(self) -> int:
        return len(self.offsets)


def draft_offsets(objective, draft: int | None = None, key: str = "draft") -> tuple[int, ...]:
    """The first ``draft`` (default: all useful, d_max - 1) offsets d >= 2 of an objective config
    section; a one-line ConfigError when it cannot draft or ``draft`` is too long."""
    K = useful_draft(objective, draft, key, "decode")
    return tuple(d for _, d in objective.register_spec().draft_offsets()[:K])


def run_objective(folder: str | Path):
    """The objective config section of a saved folder: config.yaml in it or, for RUN/step_N, in RUN;
    None when neither has one."""
    folder = Path(folder)
    for where in (folder, folder.parent):
        if (where / "config.yaml").is_file():
            section = (yaml.safe_load((where / "config.yaml").read_text()) or {}).get("objective")
            return make("objective", **section) if isinstance(section, dict) else None
    return None


def load_registers(folder: str | Path, draft: int | None = None, objective=None) -> Registers:
    """The drafter of a saved run folder (or RUN/step_N): its register embedding and the draft offsets
    of ``objective`` (default: the run's config.yaml)."""
    folder = Path(folder)
    if not (folder / REGISTER_FILE).is_file():
        raise ValueError(f"{folder}: no {REGISTER_FILE} (trained without registers); decode plain")
    objective = objective if objective is not None else run_objective(folder)
    if objective is None:
        raise ValueError(f"{folder}: no config.yaml naming the objective (its d_max sets the draft length)")
    embedding = load_file(str(folder / REGISTER_FILE))["register_embedding"]
    return Registers(embedding, draft_offsets(objective, draft))


def registers_of(model, objective, draft: int | None = None) -> Registers:
    """The drafter of a MutorLM being trained (the online evaluation)."""
    offsets = draft_offsets(objective, draft)                 # no registers: a one-line ConfigError
    return Registers(model.register_embedding.detach(), offsets)


def can_draft(folder: str | Path) -> bool:
    """Whether a saved folder has a register embedding whose objective drafts (``--decode auto``)."""
    objective = run_objective(folder) if (Path(folder) / REGISTER_FILE).is_file() else None
    return objective is not None and objective_drafts(objective)


def resolve(decode: str, folder: str | Path) -> str:
    """``plain`` / ``registers`` as given; ``auto``: registers when the folder can draft, else plain."""
    if decode not in MODES:
        raise ValueError(f"--decode {decode!r}: expected one of {', '.join(MODES)}")
    return ("registers" if can_draft(folder) else "plain") if decode == "auto" else decode


# ----------------------------------------------------------------------------- statistics

@dataclass
class DecodeStats:
    """Counts over one or many generate calls: forwards (batched passes), row_forwards (passes per
    row while it decodes), tokens (emitted, up to EOS / the limit), proposed / accepted drafts by
    distance (slot i drafts i + 1 tokens past the next one), seconds (wall)."""
    forwards: int = 0
    row_forwards: int = 0
    tokens: int = 0
    proposed: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def add_round(self, rows: int, reached: Tensor, kept: Tensor) -> None:
        """One forward of ``rows`` decoding rows; reached / kept (rows, K) bool per draft slot."""
        self.forwards += 1
        self.row_forwards += rows
        K = reached.shape[1]
        self.proposed += [0] * (K - len(self.proposed))
        self.accepted += [0] * (K - len(self.accepted))
        for i, (p, a) in enumerate(zip(reached.sum(0).tolist(), kept.sum(0).tolist())):
            self.proposed[i] += p
            self.accepted[i] += a

    def add_plain(self, new: Tensor, ends, seconds: float) -> None:
        """A plain generate call's new tokens (B, T), one token per row per forward: a row's tokens
        run up to its first id in ``ends`` (EOS, padding; counted) or all T."""
        hit = torch.isin(new, torch.tensor(list(ends), dtype=new.dtype, device=new.device))
        all_t = torch.full_like(hit[:, 0], new.shape[1], dtype=torch.long)
        first = torch.where(hit.any(1), hit.long().argmax(1) + 1, all_t)
        tokens = int(first.sum())
        self.forwards, self.row_forwards = self.forwards + new.shape[1], self.row_forwards + tokens
        self.tokens, self.seconds = self.tokens + tokens, self.seconds + seconds

    def summary(self) -> dict:
        """forwards_per_token (1.0 for plain), tokens_per_forward, acceptance_by_distance, tokens_per_s, ..."""
        return {"forwards": self.forwards, "tokens": self.tokens,
                "forwards_per_token": self.row_forwards / self.tokens if self.tokens else None,
                "tokens_per_forward": self.tokens / self.row_forwards if self.row_forwards else None,
                "proposed": self.proposed, "accepted": self.accepted,
                "acceptance_by_distance": [a / p if p else None for a, p in zip(self.accepted, self.proposed)],
                "tokens_per_s": self.tokens / self.seconds if self.seconds else None}


# ----------------------------------------------------------------------------- one forward

class CausalStep:
    """A transformers causal LM as embed -> decoder with a KV cache -> logits (inside a peft
    wrapper, its adapted base model), taking the training forward's inputs (mutor2d.lm.model)."""

    def __init__(self, lm):
        base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
        self.config = base.config
        attn = getattr(self.config, "_attn_implementation", None)
        if attn == "flex_attention":
            raise ValueError("attn_implementation='flex_attention': register decoding takes a 4D mask; "
                             "load the model with sdpa or eager")
        self.decoder, self.embed = base.get_decoder(), base.get_input_embeddings()
        self.head, self.cap = base.get_output_embeddings(), getattr(self.config, "final_logit_softcapping", None)
        self.cache_arg = cache_kwarg(self.decoder)
        self.device = self.embed.weight.device

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden (..., D) -> logits (..., V) (Gemma 2's soft-capping included)."""
        logits = self.head(hidden)
        return torch.tanh(logits / self.cap) * self.cap if self.cap else logits

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


def cache_tensors(cache) -> list[tuple[Tensor, Tensor]]:
    """(keys, values) (b, heads, L, head_dim) of every layer of a DynamicCache."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


# ----------------------------------------------------------------------------- the rounds

def _first_token(rules: SamplingRules, logits: Tensor, generator) -> Tensor:
    """logits (b, V) -> tokens (b,) under the rules."""
    return logits.argmax(-1) if rules.temperature == 0 else draw(rules.probs(logits), generator)


def _drafts(step: CausalStep, rules: SamplingRules, hidden: Tensor, valid: Tensor, generator) -> Drafts:
    """Register hidden states (b, K, D) -> drafts (greedy: argmax, q one-hot left implicit)."""
    logits = step.logits(hidden)
    if rules.temperature == 0:
        return Drafts(logits.argmax(-1), None, valid)
    q = rules.probs(logits)
    return Drafts(draw(q, generator), q, valid)


def _verify(rules: SamplingRules, logits: Tensor, drafts: Drafts, generator) -> tuple[Tensor, Tensor, Tensor]:
    """logits (b, K+1, V) of the regular outputs -> (kept (b,), next token (b,), lead (b, K) kept drafts).
    Greedy: the speculative rule with one-hot p and q, i.e. keep while the draft is the argmax."""
    if rules.temperature == 0:
        target = logits.argmax(-1)
        lead = (drafts.valid & (drafts.tokens == target[:, :-1])).long().cumprod(1).bool()
        kept = lead.sum(1)
        return kept, target.gather(1, kept[:, None])[:, 0], lead
    return verify(rules.probs(logits), drafts, generator)


def _any(alive: bool, synced: bool, device) -> bool:
    """Whether any row decodes (on any process when ``synced``)."""
    if not synced:
        return alive
    flag = torch.tensor([int(alive)], device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())


class Rows:
    """The per-row decoding state on the host: emitted tokens, done flags, the stop rules.

    A row ends at the token that is EOS, that completes a stop string (an occurrence overlapping this
    token) or that reaches ``max_new_tokens``. ``raw_stop``:
    stop strings are matched as transformers' StopStringCriteria matches them in plain ``generate``
    (special tokens' text included, and the prompt's end, ``prompts`` the real prompt ids of each row);
    else in the generated text without special tokens (where plain ``generate`` had no criteria and
    the caller cuts the text). Only a window of the last tokens is decoded."""

    def __init__(self, B: int, max_new_tokens: int, eos=(), stop=(), tokenizer=None, prompts=None,
                 raw_stop: bool = False):
        self.out, self.done = [[] for _ in range(B)], [False] * B
        self.max_new, self.eos, self.stop, self.tokenizer = max_new_tokens, set(eos), list(stop), tokenizer
        if self.stop and tokenizer is None:
            raise ValueError(f"stop={self.stop}: stop strings need the tokenizer")
        self.raw, self.window = raw_stop, 2 * max(map(len, self.stop), default=0) + 4
        self.context = [list(p) for p in prompts] if raw_stop else [[] for _ in range(B)]

    def _completes_stop(self, row: int) -> bool:
        """Whether a stop string occurs in the text of the row's last tokens ending past the text
        before its last token (overlapping that token)."""
        seq = (self.context[row] + self.out[row])[-self.window:]
        now, before = (self.tokenizer.decode(s, skip_special_tokens=not self.raw) for s in (seq, seq[:-1]))
        return any(now.find(s, max(len(before) - len(s) + 1, 0)) >= 0 for s in self.stop)

    def emit(self, row: int, tokens: list[int]) -> None:
        """Append a round's tokens to ``row`` up to the one that ends it (see the class doc)."""
        out = self.out[row]
        for t in tokens:
            out.append(t)
            if t in self.eos or len(out) >= self.max_new or (self.stop and self._completes_stop(row)):
                self.done[row] = True
                return


class Decoding:
    """One batch being decoded (module doc): ``cache`` and ``keys`` (CacheKeys) of the rows still in it,
    ``rows`` (b,) their indices in the batch, ``token`` (b,) their last emitted token x_{n-1} (not
    cached), ``last_pos`` (b,) the position id of their last cached token, ``n`` (b,) tokens emitted,
    ``drafts`` the next round's (None without registers), ``state`` the host-side Rows."""

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
        self.cache, self.drafts = new_cache(), None

    def _register_pos(self, anchor_pos: Tensor) -> Tensor:
        """Anchor position ids (b, A) -> their registers' (b, A*K): anchor + d - 1, anchor-major."""
        return (anchor_pos[:, :, None] + self.offsets - 1).flatten(1).clamp(max=self.limit - 1)

    def _new_drafts(self, hidden: Tensor) -> None:
        """Register hidden states (b, K, D) of the last kept input -> the next round's drafts, slots
        within max_new_tokens and the model's positions."""
        i = torch.arange(self.K, device=self.dev)
        valid = ((self.n[:, None] + i) < self.state.max_new) & ((self.last_pos[:, None] + 2 + i) < self.limit)
        self.drafts = _drafts(self.step, self.rules, hidden, valid, self.generator)

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
        self.token = _first_token(self.rules, self.step.logits(hidden[:, P - 1]), self.generator)
        none = torch.zeros(B, K, dtype=torch.bool)
        self.stats.add_round(B, none, none)
        for b, t in enumerate(self.token.tolist()):
            self.state.emit(b, [t])
        if K:
            self._new_drafts(hidden[:, P:])

    def alive(self) -> Tensor:
        """(b,) bool: which rows still decode."""
        return torch.tensor([not self.state.done[r] for r in self.rows.tolist()], dtype=torch.bool, device=self.dev)

    def keep(self, index: Tensor) -> None:
        """Keep only the rows ``index`` (b',) in the batch (cache included)."""
        self.cache.batch_select_indices(index)
        self.keys = self.keys.select(index)
        self.rows, self.token, self.last_pos, self.n = (t[index] for t in
                                                        (self.rows, self.token, self.last_pos, self.n))
        if self.drafts is not None:
            d = self.drafts
            self.drafts = Drafts(d.tokens[index], None if d.probs is None else d.probs[index], d.valid[index])

    def round(self, alive: Tensor) -> None:
        """One forward: verify the drafts after x_{n-1}, emit the kept tokens and the next one, draft
        again from the registers of the last kept input; then the cache keeps the kept inputs only."""
        b, K, dev = self.rows.shape[0], self.K, self.dev
        j = torch.arange(K + 1, device=dev)
        ids = torch.cat([self.token[:, None], self.drafts.tokens], 1) if K else self.token[:, None]
        in_pos = self.last_pos[:, None] + 1 + j                               # x_{n-1}, then the drafts
        hidden = self.step(self.cache, self.keys, ids, in_pos.clamp(max=self.limit - 1),
                           torch.ones_like(ids, dtype=torch.bool), self.register,
                           self._register_pos(in_pos) if K else None, j.repeat_interleave(K).expand(b, -1))
        logits = self.step.logits(hidden[:, :K + 1])
        if K:
            kept, token, lead = _verify(self.rules, logits, self.drafts, self.generator)
            reached = torch.cat([torch.ones_like(lead[:, :1]), lead[:, :-1]], 1) & self.drafts.valid
        else:
            kept = torch.zeros(b, dtype=torch.long, device=dev)
            token = _first_token(self.rules, logits[:, 0], self.generator)
            lead = reached = torch.zeros(b, 0, dtype=torch.bool, device=dev)
        furthest = int(kept.max())
        _drop(self.cache, K * (K + 1) + K - furthest)                   # the registers, drafts no row kept
        self.keys = self.keys.extend((j[:furthest + 1] <= kept[:, None]) & alive[:, None], in_pos[:, :furthest + 1])
        self.stats.add_round(int(alive.sum()), (reached & alive[:, None]).cpu(), (lead & alive[:, None]).cpu())
        emitted = torch.cat([self.drafts.tokens, token[:, None]], 1).scatter(1, kept[:, None], token[:, None]) \
            if K else token[:, None]
        for r, toks, k, on in zip(self.rows.tolist(), emitted.tolist(), kept.tolist(), alive.tolist()):
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


def record_fields(mode: str, registers: Registers | None, stats: DecodeStats) -> dict:
    """An evaluation record's decoding settings (its ``sampling``): decode, decode_options, decode_stats
    (forwards_per_token among them; 1.0 for plain)."""
    options = {"draft": registers.draft, "offsets": list(registers.offsets)} if registers is not None else {}
    return {"decode": mode, "decode_options": options, "decode_stats": stats.summary()}


def run_decoding(decode: str, model, objective) -> tuple[str, Registers | None]:
    """(mode, drafter) of a MutorLM being trained under ``objective`` for ``eval.decode``: auto means
    registers when the model has a register embedding whose objective drafts, else plain."""
    mode = ("registers" if model.has_registers and objective_drafts(objective) else "plain") if decode == "auto" \
        else decode
    return mode, registers_of(model, objective) if mode == "registers" else None
