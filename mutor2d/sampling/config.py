"""The ``sample`` section (SampleConfig: the per-token rules' settings, grid classes, seed) and its
tagged sub-section ``sample.decode``, whose variants are the decoding modes (plain, registers, jacobi,
auto; DecodeConfig subclasses), each registered once with the builder of its drafter
(``mutor2d.sampling.drafters``): the one registry of ``--decode`` for images and text
(``decode_modes``). Settings only: no torch and no decoder here (a config is checked before torch
is imported)."""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional

from ..checks import ConfigError, at_least, at_most, check_seed, fail
from ..config import UnknownVariant, Variant, make, register_section, register_variant
from ..objectives.spec import NO_REGISTERS, RegisterSpec
from ..registry import named
from .values import PER_CLASS_LIMIT

WINGS = ("image", "text")        # the decoders: images (mutor2d.sampling), language models (mutor2d.lm)


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
    """A decoding mode, the ``sample.decode`` section: its fields and rules; ``wings`` the decoders
    that run it (``WINGS``); its builder (``register_variant(..., build=)``) makes its drafter from the
    fitted mode, the checkpoint's RegisterSpec, the body grid, the rows and the device. Adding one:
    docs/EXTENDING.md, "A decoding mode"."""
    wings: ClassVar[tuple[str, ...]] = ("image",)

    def key(self, field_name: str, names: dict[str, str] | None = None) -> str:
        """The name of a field in messages: ``names[field]`` (a flag) if given, else its config key."""
        return (names or {}).get(field_name) or f"sample.decode.{field_name}"

    def check(self, names: dict[str, str] | None = None) -> None:
        """Raise ConfigError (one line, naming ``self.key(field, names)``) for a bad value."""

    def fit(self, objective, grid: tuple[int, int], names: dict[str, str] | None = None) -> "DecodeConfig":
        """These settings for a checkpoint trained with ``objective`` (its config section, or its
        RegisterSpec; None = unknown) on ``grid`` (H, W): defaults that depend on them filled in;
        ConfigError (one line) where they cannot work there."""
        return self


def checkpoint_spec(objective) -> RegisterSpec:
    """The register rules a checkpoint drafts with: its objective section's RegisterSpec (a register
    objective's section is one), NO_REGISTERS without registers or for an objective this process does
    not know (a plugin's, not imported: ``UnknownVariant``)."""
    if objective is None or isinstance(objective, UnknownVariant) or not objective.uses_registers():
        return NO_REGISTERS
    return objective if isinstance(objective, RegisterSpec) else objective.register_spec()


def decode_modes(wing: str = "image") -> list[str]:
    """The registered decoding modes (``sample.decode`` variants, plugins included) that the ``wing``
    decoder runs (one of ``WINGS``), in registration order: the choices of its ``--decode``."""
    make("sample.decode")                               # imports the parts and plugins once
    return [name for name, cls in named("sample.decode").items() if wing in cls.wings]


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
        if bad := [c for c in self.classes if c >= count]:
            raise ConfigError(f"sample.classes: {bad[0]} is not {what} (0..{count - 1})")


@register_variant("sample.decode", "plain", build="mutor2d.sampling.drafters:Drafter")
@dataclass
class PlainDecode(DecodeConfig):
    """One token per forward pass; no field."""
    wings: ClassVar[tuple[str, ...]] = WINGS


@register_variant("sample.decode", "registers", build="mutor2d.sampling.drafters:RegisterDrafter")
@dataclass
class RegisterDecode(DecodeConfig):
    """Register drafts: ``draft`` K tokens per round (null = the checkpoint's useful draft length),
    registers after ``anchors`` every regular input of a round or the last one only; ``fill``:
    Jacobi guesses where no register drafts. Text: ``draft`` only (flag ``--draft``)."""
    wings: ClassVar[tuple[str, ...]] = WINGS
    draft: Optional[int] = None
    anchors: Literal["every", "last"] = "every"
    fill: bool = True

    def check(self, names=None):
        if self.draft is not None and self.draft < 1:
            fail(self.key("draft", names), "an integer >= 1 (null = the checkpoint's useful draft length)",
                 self.draft)

    def fit(self, objective, grid, names=None):
        draft = useful_draft(objective, self.draft, self.key("draft", names), self.key("name", names))
        return dataclasses.replace(self, draft=draft)


@register_variant("sample.decode", "jacobi", build="mutor2d.sampling.drafters:JacobiDrafter")
@dataclass
class JacobiDecode(DecodeConfig):
    """Speculative Jacobi decoding (training-free) with a window of ``window`` guessed tokens."""
    window: int = 4

    def check(self, names=None):
        if self.window < 1:
            fail(self.key("window", names), "an integer >= 1", self.window)

    def fit(self, objective, grid, names=None):
        N = grid[0] * grid[1]
        if self.window > N - 1:
            raise ConfigError(f"{setting(self.key('window', names), self.window)}: a {grid[0]}x{grid[1]} grid "
                              f"has {N} tokens, so a window guesses at most {N - 1} (the first comes from the prefix)")
        return self


@register_variant("sample.decode", "auto", build="mutor2d.sampling.drafters:build_auto")
@dataclass
class AutoDecode(DecodeConfig):
    """The fastest exact mode this checkpoint can run here, chosen when decoding starts; no field.
    Images: the fastest of plain, registers and jacobi (their default draft and window) at the batch
    size and device type, from the measured crossover (``sampling.auto.auto_decode``; registers only
    where the checkpoint's registers draft, ``can_draft``). Text: registers where the checkpoint's
    registers draft (``can_draft``), else plain (the language-model decoder runs no jacobi)."""
    wings: ClassVar[tuple[str, ...]] = WINGS


def useful_draft(objective, draft: int | None, key: str = "sample.decode.draft",
                 mode_key: str = "sample.decode.name") -> int:
    """The register draft length K for a checkpoint trained with ``objective`` (its config section):
    ``draft``, or None for all its useful draft offsets (``RegisterSpec.draft_offsets()``: D - 2 for
    mutor-2d, d_max - 1 for mutor-1d with d_min <= 2). A one-line ConfigError when the checkpoint
    has no registers, or ``draft`` exceeds the useful length (``key`` names it in the message)."""
    name = getattr(objective, "name", None) or getattr(objective, "kind", None)
    if objective is None or not objective.uses_registers():
        raise ConfigError(f"{setting(mode_key, 'registers')}: this checkpoint has no registers to draft with "
                          f"(objective {name or 'unknown'}); use jacobi or plain")
    spec = checkpoint_spec(objective)
    if spec.register_visibility != "isolated":
        raise ConfigError(f"{setting(mode_key, 'registers')}: drafts run isolated registers; this checkpoint trained "
                          f"with objective.register_visibility={spec.register_visibility}; use jacobi or plain")
    useful = len(spec.draft_offsets())
    d_min = f"d_min={spec.d_min}, " if spec.kind == "mutor-1d" else ""
    trained = f"objective {name}, {d_min}d_max={spec.d_max}"
    if useful == 0:
        raise ConfigError(f"{setting(mode_key, 'registers')}: this checkpoint's registers never learned offset "
                          f"(0, 2), so they cannot draft ({trained}); use jacobi or plain")
    if draft is not None and draft > useful:
        raise ConfigError(f"{setting(key, draft)}: this checkpoint's registers draft at most {useful} "
                          f"token{'s' if useful != 1 else ''} ({trained})")
    return useful if draft is None else draft
