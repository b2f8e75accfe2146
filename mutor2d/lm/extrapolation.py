"""Position extrapolation of a fine-tuned language model: teacher-forced NLL (nats) per answer position.

Regular pathway only (no registers), under the run's prompt attention. Trained limits
(``trained_lengths``): the longest training answer of the run, then of each base run down the chain;
bins "inside" (k < own limit), "base range" (k < a base's limit) and "beyond".
"""
from __future__ import annotations

from itertools import accumulate
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from .. import config
from ..evaluation.extrapolation import Curve, ExtrapolationError, curve_from
from ..model.attention import NEVER, Visibility, open_prefix
from . import hf
from .model import attention_mask, position_limit
from .prompts import tokenize
from .records import load_records


def run_config(run: Path):
    """The config of a language-model run folder (RUN/config.yaml; one-line errors otherwise)."""
    path = Path(run) / "config.yaml"
    if not path.is_file():
        raise ExtrapolationError(f"--run {run}: no config.yaml (not a train.py run folder)")
    task = (yaml.safe_load(path.read_text()) or {}).get("task")
    if task != "lm":
        raise ExtrapolationError(f"--run {run}: task {task!r} in config.yaml, expected 'lm'")
    return config.load(path)


def trained_lengths(run: Path, tokenizer) -> list[dict]:
    """[{"run", "data", "longest_answer"}] of the run and each LM-run base down its ``model.hf`` chain."""
    chain, run = [], Path(run)
    while True:
        cfg = run_config(run)
        d = cfg.data
        if not Path(d.path).is_file():
            raise ExtrapolationError(f"--run {run}: its training data {d.path} is not there (paths are "
                                     "read from the working directory)")
        chain.append({"run": str(run), "data": d.path, "longest_answer": longest_answer(d, tokenizer)})
        base = Path(cfg.model.hf or "")
        if not (base / "config.yaml").is_file():
            return chain
        run = base


LONGEST: dict[tuple, int] = {}      # (data settings, vocabulary) -> longest answer: runs of one study share a base


def longest_answer(d, tokenizer) -> int:
    """The longest answer in tokens of the training file of data section ``d``, as training cut it."""
    settings = (d.name, d.path, d.max_prompt_len, d.max_answer_len, d.add_eos)
    key = (*settings, Path(d.path).stat().st_mtime_ns, tuple(sorted(tokenizer.get_vocab().items())))
    if key not in LONGEST:
        pairs = tokenize(load_records(*settings[:2]), tokenizer, *settings[2:])
        LONGEST[key] = max(len(a) for _, a in pairs)
    return LONGEST[key]


def edges_and_bins(chain: list[dict]) -> tuple[list[int], list[str]]:
    """The trained limits (the longest answer so far down the chain, where it grows) and the bin names."""
    edges = list(dict.fromkeys(accumulate((link["longest_answer"] for link in chain), max)))   # each once
    middle = ["base range"] if len(edges) == 2 else [f"base range {k}" for k in range(1, len(edges))]
    return edges, ["inside", *middle[:len(edges) - 1], "beyond"]


def prompt_visibility(prompt_len: Tensor, length: Tensor, L: int, rule: str) -> Visibility:
    """The rule over right-padded rows of width L: causal, each prompt opened under "bidirectional"."""
    i = torch.arange(L)[None]
    real = i < length[:, None]
    causal = Visibility(torch.where(real, i, NEVER), torch.where(real, i, -1))
    return open_prefix(causal, prompt_len) if rule == "bidirectional" else causal


@torch.no_grad()
def answer_token_nll(lm, examples: list[tuple[list[int], list[int]]], rule: str,
                     batch_size: int = 64) -> list[Tensor]:
    """[(prompt ids, answer ids)] -> per example the (len(answer),) NLL of each answer token (nats)."""
    out = []
    for i in range(0, len(examples), batch_size):
        part = examples[i:i + batch_size]
        P = torch.tensor([len(p) for p, _ in part])
        N = torch.tensor([len(p) + len(a) for p, a in part])
        ids = pad_sequence([torch.tensor(p + a, dtype=torch.long) for p, a in part], batch_first=True)
        L = ids.shape[1]
        pos = torch.arange(L).expand(len(part), -1)
        dtype = lm.get_input_embeddings().weight.dtype
        mask = attention_mask(lm.config, prompt_visibility(P, N, L, rule), pos, dtype)
        logits = lm(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
        nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")   # (B, L - 1)
        out += [nll[b, P[b] - 1:N[b] - 1] for b in range(len(part))]
    return out


def answer_curve(run: str, records: list[dict]) -> tuple[Curve, list[dict]]:
    """(NLL per answer position of the run's saved model on ``records``, the trained chain)."""
    run = Path(run)
    cfg = run_config(run)
    tok = hf.load_tokenizer(run)
    chain = trained_lengths(run, tok)
    examples = tokenize(records, tok, cfg.data.max_prompt_len, 10 ** 9, cfg.data.add_eos)
    lm = hf.load_for_inference(run)
    longest, limit = max(len(p) + len(a) for p, a in examples), position_limit(lm.config)
    if limit is not None and longest > limit:
        raise ExtrapolationError(f"--data: sequences up to {longest} tokens, the model in {run} declares {limit} "
                                 "positions (max_position_embeddings)")
    nll = answer_token_nll(lm, examples, hf.saved_prompt_attention(run))
    padded = pad_sequence(nll, batch_first=True)
    valid = torch.arange(padded.shape[1])[None] < torch.tensor([len(x) for x in nll])[:, None]
    return curve_from(padded, valid, *edges_and_bins(chain)), chain
