"""The per-token sampling rules, on float32 logits of one position.

  1. classifier-free guidance (class prefixes only): one forward over [cond; uncond] rows where
     the uncond half uses the null prefix, logits = u + s·(c − u);
  2. temperature: logits / T; T == 0 means greedy decoding (argmax; top-k/top-p are moot);
  3. top-k: keep the k largest logits (0 = off);
  4. top-p: keep the smallest set of most likely tokens whose probability mass reaches p (1 = off);
  5. draw one token from the softmax with ``generator`` (the only source of randomness).
Every decoding mode applies the same rules (speculative modes to draft and target alike).

``SampleConfig`` is the ``sample`` config section: these settings, the grid and seed, and the decoding
mode ``sample.decode``, a tagged sub-section whose variants (``DecodeConfig`` subclasses) register
beside their decoders (plain.py, speculative.py).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..checks import ConfigError, at_least, at_most, check_seed, fail
from ..config import Variant, make, register_section
from ..sample_values import PER_CLASS_LIMIT


def check_sampling(cfg_scale: float, temperature: float, top_k: int, top_p: float,
                   where: str = "sample", names: dict[str, str] | None = None) -> None:
    """The one place for sampling rules: CFG scale >= 0 (1 = off), temperature >= 0 (0 = greedy),
    top_k integer >= 0 (0 = off), top_p in (0, 1] (1 = off); all finite. The key in a message is
    ``names[field]`` if given (e.g. a command-line flag), else ``where.field`` (``field`` if
    ``where`` is empty). Raises ConfigError (a ValueError)."""
    def key(f: str) -> str:
        return (names or {}).get(f) or (f"{where}.{f}" if where else f)

    def number(v) -> bool:
        return not isinstance(v, bool) and isinstance(v, numbers.Real) and math.isfinite(v)

    if not number(cfg_scale) or cfg_scale < 0:
        fail(key("cfg_scale"), "a finite number >= 0 (1 = off)", cfg_scale)
    if not number(temperature) or temperature < 0:
        fail(key("temperature"), "a finite number >= 0 (0 = greedy)", temperature)
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 0:
        fail(key("top_k"), "an integer >= 0 (0 = off)", top_k)
    if not number(top_p) or not 0 < top_p <= 1:
        fail(key("top_p"), "a number in (0, 1] (1 = off)", top_p)


def setting(key: str, value) -> str:
    """How a message names a setting: ``--draft 5`` for a flag, ``sample.decode.draft=5`` for a key."""
    return f"{key} {value}" if key.startswith("-") else f"{key}={value}"


class DecodeConfig(Variant):
    """A decoding mode, the ``sample.decode`` section: its fields, rules and decoder. Adding one: a
    dataclass subclass registered with ``@register_variant("sample.decode", NAME)`` beside its code,
    implementing ``run``; ``sample.py --decode NAME`` and ``--set sample.decode.name=NAME`` pick it."""

    def key(self, field_name: str, names: dict[str, str] | None = None) -> str:
        """The name of a field in messages: ``names[field]`` (a flag) if given, else its config key."""
        return (names or {}).get(field_name) or f"sample.decode.{field_name}"

    def check(self, names: dict[str, str] | None = None) -> None:
        """Raise ConfigError (one line, naming ``self.key(field, names)``) for a bad value."""

    def fit(self, objective, grid: tuple[int, int], names: dict[str, str] | None = None) -> "DecodeConfig":
        """These settings for a checkpoint trained with ``objective`` (its config section, whose
        ``register_spec()`` gives the register rules; None = unknown) on ``grid`` (H, W): defaults
        that depend on them filled in; ConfigError (one line) where they cannot work there."""
        return self

    def run(self, model, prefix: Tensor, grid: tuple[int, int], rules: "SamplingRules", generator,
            stats: dict | None, objective) -> Tensor:
        """Bodies (B, H*W) in raster order for ``prefix``; every token must follow the distribution
        ``rules.probs`` gives for the tokens before it. ``stats``, if a dict, receives the counts."""
        raise NotImplementedError


@register_section("sample")
@dataclass
class SampleConfig:
    """Sampling defaults (sample.py flags override them): CFG scale (1 = off), temperature
    (0 = greedy), top_k (0 = off), top_p (1 = off); grid classes, samples per class, seed, whether a
    grid PNG names its rows in a left margin (``labels``); the decoding mode (``decode``, a
    DecodeConfig; its ``name`` picks the variant)."""
    cfg_scale: float = 1.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    classes: list[int] = field(default_factory=list)  # empty = a spread of classes
    per_class: int = 4
    seed: int = 0
    labels: bool = True
    decode: Any = field(default_factory=lambda: make("sample.decode"))

    def check(self, names: dict[str, str] | None = None) -> None:
        """Every rule of the section; ``names`` maps a field to the flag that set it (for messages)."""
        check_sampling(self.cfg_scale, self.temperature, self.top_k, self.top_p, where="sample", names=names)
        self.decode.check(names)
        for c in self.classes:
            at_least("sample.classes", c, 0)
        at_least("sample.per_class", self.per_class, 1)
        at_most("sample.per_class", self.per_class, PER_CLASS_LIMIT, "columns of a grid")
        check_seed("sample.seed", self.seed)

    def check_classes(self, count: int, what: str) -> None:
        """Every grid row must index one of ``count`` choices (0..count-1); ``what`` names one in the
        message ("a class of the data")."""
        bad = [c for c in self.classes if c >= count]
        if bad:
            raise ConfigError(f"sample.classes: {bad[0]} is not {what} (0..{count - 1})")


def guide(cond: Tensor, uncond: Tensor, scale: float) -> Tensor:
    """Classifier-free guidance on logits: u + s·(c − u)."""
    return uncond + scale * (cond - uncond)


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """logits (..., V) -> copy with the tokens outside top-k / the top-p nucleus set to -inf.

    top-p keeps, in order of decreasing probability, every token whose predecessors' mass is
    still below p (so the most likely token always survives and the kept mass is >= p)."""
    out = logits
    V = logits.shape[-1]
    if 0 < top_k < V:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def draw(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One token per row of ``probs`` (..., V) -> (...,) long, drawn with ``generator``."""
    flat = probs.reshape(-1, probs.shape[-1])
    if generator is not None and generator.device != flat.device:
        out = torch.multinomial(flat.to(generator.device), 1, generator=generator).to(flat.device)
    else:
        out = torch.multinomial(flat, 1, generator=generator)
    return out.view(probs.shape[:-1])


def sample_logits(logits: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  generator: torch.Generator | None = None) -> Tensor:
    """logits (B, V) -> tokens (B,). temperature 0 = greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = filter_logits(logits.float() / temperature, top_k, top_p).softmax(-1)
    return draw(probs, generator)


@dataclass(frozen=True)
class SamplingRules:
    """The per-token rules of one run (checked settings). ``guided``: the model runs [cond; uncond]
    rows (CFG)."""
    cfg_scale: float = 1.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    guided: bool = False

    @classmethod
    def of(cls, cfg_scale: float = 1.0, temperature: float = 1.0, top_k: int = 0,
           top_p: float = 1.0) -> "SamplingRules":
        """The rules of checked settings; guidance is on when the scale is not 1."""
        return cls(cfg_scale, temperature, top_k, top_p, guided=cfg_scale != 1.0)

    def combine(self, logits: Tensor) -> Tensor:
        """Model logits (rows, ..., V) -> the logits the rules sample from (B, ..., V)."""
        if not self.guided:
            return logits
        B = logits.shape[0] // 2
        return guide(logits[:B], logits[B:], self.cfg_scale)

    def probs(self, logits: Tensor) -> Tensor:
        """Combined logits (..., V) -> the distribution each token is drawn from (..., V);
        greedy: one-hot at the argmax."""
        if self.temperature == 0:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        return filter_logits(logits.float() / self.temperature, self.top_k, self.top_p).softmax(-1)
