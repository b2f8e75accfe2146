"""YAML configs checked into dataclasses when they load.

A run config has one section per concern: model, data, objective, optim, train, sample. A YAML file
may set any subset of a section's fields. ``data`` and ``objective`` are *tagged* sections: their
``name`` picks a small dataclass holding only that variant's fields (``register_variant`` adds one).
Every section has ``check()``; ``load`` and ``from_dict`` run all of them, so a bad value anywhere
fails before a run starts, with a one-line :class:`ConfigError` naming the key.

``--set section.key=value`` overrides are parsed with YAML scalar rules (``--set optim.lr=1e-3``).
``from_dict`` also reads the flat dicts older checkpoints stored (see ``upgrade_legacy``).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
SEED_LIMIT = 2 ** 32               # seeds live in [0, 2^32): numpy, torch and python all take them

PRESETS = {  # model.preset -> (n_layer, n_head, dim)
    "tiny": (2, 2, 64),
    "small": (4, 4, 128),
    "B": (12, 12, 768),
    "L": (24, 16, 1024),
    "XL": (36, 20, 1280),
    "XXL": (48, 24, 1536),
    "3B": (24, 32, 3200),
}


class ConfigError(ValueError):
    """A bad config value; the message is one line naming the key."""


# ----------------------------------------------------------------------------- rules

def fail(key: str, expected: str, value: Any) -> None:
    raise ConfigError(f"{key}: expected {expected}, got {value!r}")


def at_least(key: str, value, low) -> None:
    if value < low:
        fail(key, f">= {low}", value)


def _fraction(key: str, value: float) -> None:
    if not 0 <= value <= 1:
        fail(key, "a number in [0, 1]", value)


def check_seed(key: str, value: int) -> None:
    if not 0 <= value < SEED_LIMIT:
        fail(key, "an integer in [0, 2^32)", value)


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


# ----------------------------------------------------------------------------- plain sections

@dataclass
class ModelConfig:
    """LlamaGen-style decoder. ``preset`` fills n_layer/n_head/dim unless they are set explicitly."""
    preset: Literal["tiny", "small", "B", "L", "XL", "XXL", "3B", "custom"] = "tiny"
    n_layer: int | None = None
    n_head: int | None = None
    dim: int | None = None
    vocab_size: int = 16384
    num_classes: int = 1000          # class-conditional prefix; ignored for prompt prefixes
    prefix: str = "class"            # a conditioning kind of mutor2d.conditioning.CONDITIONING
    rope: Literal["2d", "1d"] = "2d"
    rope_base: float = 10000.0
    cls_rope: Literal["identity", "zeros"] = "identity"  # "zeros" = LlamaGen's class-token rotation
    norm_eps: float = 1e-5
    init_std: float = 0.02
    token_dropout: float = 0.1
    attn_dropout: float = 0.0
    resid_dropout: float = 0.1
    ffn_dropout: float = 0.1
    class_dropout: float = 0.1       # labels dropped to the null class (CFG)
    attention: str = "auto"          # "auto" (flex on CUDA, else sdpa) or a backend of mutor2d.attention.BACKENDS

    def kind(self):
        """The conditioning kind of ``prefix`` (mutor2d.conditioning.CONDITIONING)."""
        from .conditioning import CONDITIONING
        return CONDITIONING[self.prefix]

    def resolved(self) -> tuple[int | None, int | None, int | None]:
        """(n_layer, n_head, dim): explicit values, else the preset's (None for 'custom')."""
        base = PRESETS.get(self.preset, (None, None, None))
        return tuple(v if v is not None else b for v, b in zip((self.n_layer, self.n_head, self.dim), base))

    def check(self) -> None:
        from .attention import BACKENDS
        from .conditioning import CONDITIONING
        if self.prefix not in CONDITIONING:
            fail("model.prefix", f"one of {list(CONDITIONING)}", self.prefix)
        if self.attention not in ("auto", *BACKENDS):
            fail("model.attention", f"one of {['auto', *BACKENDS]}", self.attention)
        if self.preset == "custom" and None in (self.n_layer, self.n_head, self.dim):
            raise ConfigError("model.preset: 'custom' needs model.n_layer, model.n_head and model.dim")
        for k in ("n_layer", "n_head", "dim"):
            if getattr(self, k) is not None:
                at_least(f"model.{k}", getattr(self, k), 1)
        _, heads, dim = self.resolved()
        if dim % heads:
            raise ConfigError(f"model.dim: {dim} is not divisible by model.n_head={heads}")
        step = 4 if self.rope == "2d" else 2   # 2D RoPE: half the pairs rotate by row, half by column
        if (dim // heads) % step:
            raise ConfigError(f"model.rope={self.rope}: needs a head size (model.dim / model.n_head = "
                              f"{dim}/{heads}) divisible by {step}")
        at_least("model.vocab_size", self.vocab_size, 1)
        at_least("model.num_classes", self.num_classes, 1)
        if self.rope_base <= 0:
            fail("model.rope_base", "> 0", self.rope_base)
        if self.norm_eps <= 0:
            fail("model.norm_eps", "> 0", self.norm_eps)
        at_least("model.init_std", self.init_std, 0)
        for k in ("token_dropout", "attn_dropout", "resid_dropout", "ffn_dropout", "class_dropout"):
            _fraction(f"model.{k}", getattr(self, k))


@dataclass
class OptimConfig:
    lr: float = 4e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.05
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0
    grad_clip: float = 1.0           # 0 = no clipping

    def check(self) -> None:
        if self.lr <= 0:
            fail("optim.lr", "> 0", self.lr)
        for b in self.betas:
            if not 0 <= b < 1:
                fail("optim.betas", "values in [0, 1)", list(self.betas))
        for k in ("weight_decay", "warmup_steps", "min_lr", "grad_clip"):
            at_least(f"optim.{k}", getattr(self, k), 0)


@dataclass
class TrainConfig:
    batch_size: int = 64             # global batch (split over processes)
    max_steps: int = 1000
    grad_accum: int = 1
    seed: int = 0
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    log_every: int = 10
    ckpt_every: int = 500
    keep_ckpts: int = 2
    sample_every: int = 0            # 0 = only at the end
    eval_every: int = 0              # online embedded-metric evaluation (digits); 0 = off
    eval_per_class: int = 20         # samples per class for the online evaluation
    ema: bool = False
    ema_decay: float = 0.9999
    compile: bool = False
    tracker: Literal["tensorboard", "wandb", "none"] = "tensorboard"
    out_dir: str = ""                # "" = runs/<config name>; train.py --out wins
    init_from: str = ""              # fresh runs: start from these weights (a mutor2d checkpoint or
                                     # run folder, or a LlamaGen GPT checkpoint); "" = random init
    max_nonfinite: int = 20          # updates in a row with a non-finite loss/gradient (skipped) before
                                     # the run stops with an error
    sharding: Literal["auto", "ddp", "fsdp"] = "auto"   # auto: DDP with several processes; fsdp: FSDP2
                                     # shards each block, then the rest (mutor2d/engine/sharding.py)
    fsdp_offload: bool = False       # fsdp: sharded parameters, gradients and AdamW states live on the CPU
    activation_checkpointing: bool = False   # recompute each block's activations in the backward

    def check(self) -> None:
        for k in ("batch_size", "grad_accum", "log_every", "eval_per_class"):
            at_least(f"train.{k}", getattr(self, k), 1)
        for k in ("max_steps", "ckpt_every", "keep_ckpts", "sample_every", "eval_every", "max_nonfinite"):
            at_least(f"train.{k}", getattr(self, k), 0)
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"train.grad_accum: {self.grad_accum} does not divide "
                              f"train.batch_size={self.batch_size}")
        check_seed("train.seed", self.seed)
        if not 0 < self.ema_decay < 1:
            fail("train.ema_decay", "a number in (0, 1)", self.ema_decay)
        if self.fsdp_offload and self.sharding != "fsdp":
            fail("train.fsdp_offload", "false unless train.sharding=fsdp", self.fsdp_offload)


@dataclass
class SampleConfig:
    """Sampling defaults (sample.py flags override them): CFG scale (1 = off), temperature
    (0 = greedy), top_k (0 = off), top_p (1 = off); grid classes, samples per class, seed."""
    cfg_scale: float = 1.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    classes: list[int] = field(default_factory=list)  # empty = a spread of classes
    per_class: int = 4
    seed: int = 0

    def check(self) -> None:
        check_sampling(self.cfg_scale, self.temperature, self.top_k, self.top_p, where="sample")
        for c in self.classes:
            at_least("sample.classes", c, 0)
        at_least("sample.per_class", self.per_class, 1)
        check_seed("sample.seed", self.seed)


# ----------------------------------------------------------------------------- tagged sections

VARIANTS: dict[str, dict[str, type]] = {"data": {}, "objective": {}}
DEFAULT_VARIANT = {"data": "digits", "objective": "ntp"}


def register_variant(section: str, name: str):
    """Class decorator: make a dataclass the ``section`` variant picked by ``name: NAME``."""
    def add(cls):
        cls.name = name
        VARIANTS[section][name] = cls
        return cls
    return add


class Variant:
    """Base of a tagged section's variants: ``name`` is set by ``register_variant``."""
    name: ClassVar[str] = ""

    def check(self) -> None:
        """Raise ConfigError for a bad value (fields are type-checked before)."""

    def check_grid(self, grid: tuple[int, int], prefix_len: int) -> None:
        """Raise ConfigError if this setting cannot work on the data's ``grid`` (H, W)."""

    @classmethod
    def from_legacy(cls, flat: dict) -> dict:
        """This variant's fields out of an old flat section dict (other variants' keys dropped)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return {k: v for k, v in flat.items() if k in names}


class DataVariant(Variant):
    """A ``data`` section: where training tokens come from (builders in mutor2d.data)."""


class ObjectiveVariant(Variant):
    """An ``objective`` section: the training loss (modules in mutor2d.objectives)."""


def variant_class(section: str, name: Any) -> type:
    variants = VARIANTS[section]
    if not isinstance(name, str) or name not in variants:
        raise ConfigError(f"{section}.name: expected one of {list(variants)}, got {name!r}")
    return variants[name]


def DataConfig(name: str = "digits", **fields) -> DataVariant:
    """The checked ``data`` section of variant ``name`` (e.g. ``DataConfig(name="codes", path=...)``)."""
    return _checked(build_tagged("data", {"name": name, **fields}))


def ObjectiveConfig(name: str = "ntp", **fields) -> ObjectiveVariant:
    """The checked ``objective`` section of variant ``name`` (e.g. ``ObjectiveConfig(name="ntp")``)."""
    return _checked(build_tagged("objective", {"name": name, **fields}))


def _checked(section):
    section.check()
    return section


# ----------------------------------------------------------------------------- data variants

@register_variant("data", "digits")
@dataclass
class DigitsDataConfig(DataVariant):
    """scikit-learn's bundled 8x8 digits (10 classes), split 80/20 by ``data_seed``; the 80% may give
    up a validation split, and training may use a nested share of the rest (mutor2d.data.digits_indices)."""
    tokenizer: str = "pixel"         # "pixel" (grey levels) or a VQ checkpoint path
    levels: int = 17                 # pixel tokenizer: number of grey levels
    data_seed: int = 1234
    val_fraction: float = 0.0        # share of the training set held out as split "val" (0 = none)
    train_fraction: float = 1.0      # share of the remaining training images trained on (nested: 0.25 in 0.5)
    num_workers: int = 0

    def check(self) -> None:
        if not self.tokenizer:
            fail("data.tokenizer", "'pixel' or a VQ checkpoint path", self.tokenizer)
        at_least("data.levels", self.levels, 2)
        check_seed("data.data_seed", self.data_seed)
        if not 0 <= self.val_fraction < 1:
            fail("data.val_fraction", "a number in [0, 1) (0 = no validation split)", self.val_fraction)
        if not 0 < self.train_fraction <= 1:
            fail("data.train_fraction", "a number in (0, 1] (1 = all training images)", self.train_fraction)
        at_least("data.num_workers", self.num_workers, 0)


@register_variant("data", "codes")
@dataclass
class CodesDataConfig(DataVariant):
    """Pre-extracted token grids: folders written by tokenizers/extract_codes.py."""
    path: str | None = None          # the train split (required)
    test_path: str | None = None     # the test split (optional)
    tokenizer: str = "pixel"         # the VQ checkpoint that made the codes (to decode sample grids)
    num_workers: int = 0

    def check(self) -> None:
        if not self.path:
            fail("data.path", "the folder written by tokenizers/extract_codes.py", self.path)
        if self.test_path is not None and not self.test_path:
            fail("data.test_path", "a folder or null", self.test_path)
        at_least("data.num_workers", self.num_workers, 0)


@register_variant("data", "stargraph")
@dataclass
class StarGraphDataConfig(DataVariant):
    """Path-star graphs (a 1D task): ``degree`` arms of ``path_len`` nodes out of ``num_nodes``."""
    degree: int = 2
    path_len: int = 5
    num_nodes: int = 50
    num_train: int = 200000
    num_test: int = 2000
    data_seed: int = 1234            # the test split uses data_seed + 1
    reverse_answer: bool = False     # answer goal -> source (the positive control: no planning needed)
    num_workers: int = 0

    def check(self) -> None:
        at_least("data.degree", self.degree, 2)
        at_least("data.path_len", self.path_len, 2)
        need = 1 + self.degree * (self.path_len - 1)
        if self.num_nodes < need:
            raise ConfigError(f"data.num_nodes={self.num_nodes}: data.degree={self.degree} arms of "
                              f"data.path_len={self.path_len} nodes need {need} distinct nodes")
        at_least("data.num_train", self.num_train, 1)
        at_least("data.num_test", self.num_test, 1)
        check_seed("data.data_seed", self.data_seed)
        at_least("data.num_workers", self.num_workers, 0)


# ----------------------------------------------------------------------------- objective variants
# Loss = (1 - reg_weight) * CE_ntp + reg_weight * CE_aux, each a mean over its own valid targets.
# An offset (dr, dc) sends an anchor at cell (r, c) to the target at (r + dr, c + dc); edge
# "geometric" drops targets past the right edge or below the last row, "raster" reads the raster
# sequence instead (target index t + dr*W + dc, dropped only past the end).

def _check_register_fields(o) -> None:
    """Rules shared by the objectives with registers or extra heads."""
    _fraction("objective.reg_weight", o.reg_weight)
    if getattr(o, "placement", "dense") == "sparse":
        at_least("objective.num_registers", o.num_registers, 1)


def _check_1d_offsets(o) -> None:
    if not 1 <= o.d_min <= o.d_max:
        raise ConfigError(f"objective.d_min/d_max: need 1 <= d_min <= d_max, got {o.d_min}..{o.d_max}")


def _check_2d_offsets(o) -> None:
    if o.d_max < 2:
        raise ConfigError(f"objective.d_max: need D >= 2 for 2D offsets (D=1 has none), got {o.d_max}")


def _register_spec_check(o, grid: tuple[int, int], prefix_len: int) -> None:
    from .registers import LayoutError, RegisterSpec   # registers needs torch: import when used
    try:
        RegisterSpec.from_config(o).check(grid, prefix_len)
    except LayoutError as e:
        raise ConfigError(str(e)) from None


@register_variant("objective", "ntp")
@dataclass
class NTPConfig(ObjectiveVariant):
    """Plain next-token prediction: no other field."""

    def check_grid(self, grid, prefix_len):
        _register_spec_check(self, grid, prefix_len)


@dataclass
class RegisterConfig(ObjectiveVariant):
    """Fields of the register objectives. ``placement``: dense (one register per anchor with a valid
    target) or sparse (``num_registers`` random anchors per sequence). One offset per sequence
    unless ``per_register_offsets``. ``edge``: targets past the right edge are invalid (geometric)
    or wrap to the next row (raster)."""
    reg_weight: float = 0.5
    placement: Literal["dense", "sparse"] = "dense"
    num_registers: int = 80
    per_register_offsets: bool = False
    edge: Literal["geometric", "raster"] = "geometric"

    def check(self) -> None:
        _check_register_fields(self)

    def check_grid(self, grid, prefix_len):
        _register_spec_check(self, grid, prefix_len)


@register_variant("objective", "mutor-1d")
@dataclass
class MuToR1DConfig(RegisterConfig):
    """Registers predicting the token d = d_min..d_max (inclusive) ahead on the raster line:
    offsets (0, d)."""
    d_min: int = 1
    d_max: int = 4

    def check(self) -> None:
        super().check()
        _check_1d_offsets(self)


@register_variant("objective", "mutor-2d")
@dataclass
class MuToR2DConfig(RegisterConfig):
    """Registers predicting a token at a 2D offset (dr, dc) in {0..D-1}^2 minus (0, 0), D = d_max
    (in the paper's 1-based notation (d_h, d_w) in {1..D}^2 minus (1, 1), so both d_max are the
    largest d)."""
    d_max: int = 4

    def check(self) -> None:
        super().check()
        _check_2d_offsets(self)

    @classmethod
    def from_legacy(cls, flat: dict) -> dict:
        """Old configs held D as ``d_max_2d`` beside the 1D ``d_min``/``d_max``."""
        return {**super().from_legacy(flat), "d_max": flat["d_max_2d"]}


@register_variant("objective", "multihead")
@dataclass
class MultiHeadConfig(ObjectiveVariant):
    """Multi-token prediction with extra heads (one transformer layer each) instead of registers.
    layout "2d": one head per offset of mutor-2d with D = d_max; "1d": one per d = max(d_min, 2)..d_max
    (d = 1 is the main head). ``num_heads``: keep the first heads only (0 = all)."""
    reg_weight: float = 0.5
    layout: Literal["1d", "2d"] = "2d"
    d_min: int = 1
    d_max: int = 4
    num_heads: int = 0
    edge: Literal["geometric", "raster"] = "geometric"

    def num_offsets(self) -> int:
        return self.d_max ** 2 - 1 if self.layout == "2d" else self.d_max - max(self.d_min, 2) + 1

    def check(self) -> None:
        _check_register_fields(self)
        at_least("objective.d_min", self.d_min, 1)
        if self.layout == "2d":
            _check_2d_offsets(self)
        else:
            _check_1d_offsets(self)
            if self.d_max < 2:
                raise ConfigError(f"objective.d_max: the 1d heads predict d = 2..d_max, got {self.d_max}")
        if not 0 <= self.num_heads <= self.num_offsets():
            raise ConfigError(f"objective.num_heads: expected 0 (all) .. {self.num_offsets()} "
                              f"(the offsets of objective.d_max={self.d_max}), got {self.num_heads}")

    def check_grid(self, grid, prefix_len):
        H, W = grid
        if self.layout == "2d" and H == 1:
            raise ConfigError(f"objective.layout=2d needs a 2D grid, got {H}x{W} (use layout 1d)")
        if self.layout == "2d" and self.d_max > max(H, W):
            raise ConfigError(f"objective.d_max={self.d_max} exceeds the grid {H}x{W}")
        if self.layout == "1d" and max(self.d_min, 2) > (H * W if self.edge == "raster" else W):
            raise ConfigError(f"objective.d_min={self.d_min}: every 1D target falls off the {H}x{W} grid")

    @classmethod
    def from_legacy(cls, flat: dict) -> dict:
        """Old configs named the layout ``multihead_layout`` and held the 2D D as ``d_max_2d``."""
        layout = flat["multihead_layout"]
        d_max = flat["d_max_2d"] if layout == "2d" else flat["d_max"]
        return {**super().from_legacy(flat), "layout": layout, "d_max": d_max}


# ----------------------------------------------------------------------------- the run

SECTIONS = ("model", "data", "objective", "optim", "train", "sample")


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataVariant = field(default_factory=DigitsDataConfig)
    objective: ObjectiveVariant = field(default_factory=NTPConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)

    def to_dict(self) -> dict:
        """Plain dict (tagged sections lead with their ``name``); ``from_dict`` reads it back."""
        out = {}
        for s in SECTIONS:
            section = getattr(self, s)
            d = dataclasses.asdict(section)
            out[s] = {"name": section.name, **d} if s in VARIANTS else d
        out["optim"]["betas"] = list(out["optim"]["betas"])
        return out

    def check(self) -> "RunConfig":
        """Every section's rules, then the rules across sections."""
        for s in SECTIONS:
            getattr(self, s).check()
        if self.train.eval_every and (self.data.name != "digits" or not self.model.kind().per_class):
            raise ConfigError(f"train.eval_every: the online evaluation needs data.name=digits with class "
                              f"labels, got data.name={self.data.name!r}, model.prefix={self.model.prefix!r}")
        if not self.model.kind().guidable and self.sample.cfg_scale != 1:
            raise ConfigError(f"sample.cfg_scale={self.sample.cfg_scale}: classifier-free guidance needs "
                              f"class labels (model.prefix=class); use 1 for prompts")
        return self


def check_against_grid(cfg: RunConfig, grid: tuple[int, int], prefix_len: int,
                       num_classes: int | None = None) -> None:
    """Rules that need the data: its body grid (H, W), the prefix length and the class count.

    model.rope=1d rotates by column only, so on a grid with H > 1 two rows would share positions:
    an error. The objective checks its own settings against the grid (e.g. offsets that fall off).
    """
    H, W = grid
    if cfg.model.rope == "1d" and H > 1:
        raise ConfigError(f"model.rope=1d: the data is a {H}x{W} grid; use model.rope=2d (1d is for H = 1)")
    cfg.objective.check_grid((H, W), prefix_len)
    if num_classes is not None and cfg.model.kind().per_class:
        bad = [c for c in cfg.sample.classes if c >= num_classes]
        if bad:
            raise ConfigError(f"sample.classes: {bad[0]} is not a class of the data (0..{num_classes - 1})")


# ----------------------------------------------------------------------------- type checking

YAML_BOOL_WORDS = {False: ("no", "off", "false"), True: ("yes", "on", "true")}


def check_type(key: str, value: Any, tp: Any) -> Any:
    """Return ``value`` coerced to ``tp`` or raise ConfigError naming ``key``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is not type(None):
                try:
                    return check_type(key, value, a)
                except ConfigError:
                    pass
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if isinstance(value, bool):            # YAML 1.1 reads no/off/yes/on as booleans
            value = next((a for a in args if isinstance(a, str) and a in YAML_BOOL_WORDS[value]), value)
        if not any(value == a and type(value) is type(a) for a in args):
            fail(key, f"one of {list(args)}", value)
        return value
    if origin in (list, tuple):
        return _check_sequence(key, value, origin, args)
    checks = {bool: _as_bool, int: _as_int, float: _as_float, str: _as_str}
    if tp is Any:
        return value
    if tp not in checks:
        raise ConfigError(f"{key}: unsupported type {tp}")
    return checks[tp](key, value)


def _check_sequence(key: str, value: Any, origin, args) -> Any:
    if not isinstance(value, (list, tuple)):
        fail(key, "a list", value)
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            fail(key, f"{len(args)} values", value)
        return tuple(check_type(key, v, a) for v, a in zip(value, args))
    inner = args[0] if args else Any
    out = [check_type(key, v, inner) for v in value]
    return tuple(out) if origin is tuple else out


def _as_bool(key, value):
    if not isinstance(value, bool):
        fail(key, "true/false", value)
    return value


def _as_int(key, value):
    if isinstance(value, bool) or not isinstance(value, int):
        fail(key, "an integer", value)
    return value


def _as_float(key, value):
    """A finite number; YAML 1.1 reads "1e-3" as a string, so numeric strings are accepted."""
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        fail(key, "a number", value)
    try:
        number = float(number)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        fail(key, "a finite number", value)
    return number


def _as_str(key, value):
    if not isinstance(value, str):
        fail(key, "a string", value)
    return value


def _type_name(tp: Any) -> str:
    return str(tp).replace("typing.", "")


# ----------------------------------------------------------------------------- building

def build_section(cls, data: Any, prefix: str, context: str = ""):
    """Dataclass ``cls`` from a mapping, every field type-checked; unknown keys are errors."""
    if not isinstance(data, dict):
        fail(prefix.rstrip(".") or "config", "a mapping", data)
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    for k in data:
        if k not in fields:
            known = ", ".join((["name"] if context else []) + fields) or "none"
            raise ConfigError(f"unknown config key '{prefix}{k}'{context} (known: {known})")
    return cls(**{k: check_type(prefix + k, v, hints[k]) for k, v in data.items()})


def build_tagged(section: str, data: Any):
    """The variant of a tagged section that ``data['name']`` picks (default DEFAULT_VARIANT)."""
    if not isinstance(data, dict):
        fail(section, "a mapping", data)
    name = data.get("name", DEFAULT_VARIANT[section])
    cls = variant_class(section, name)
    rest = {k: v for k, v in data.items() if k != "name"}
    if LEGACY_KEYS[section] <= set(rest):
        rest = cls.from_legacy(rest)
    return build_section(cls, rest, f"{section}.", context=f" for {section}.name={name}")


# The flat sections every checkpoint stored before data and objective were tagged: all the keys of
# every variant at once. A dict holding all of them is upgraded by its variant's ``from_legacy``.
LEGACY_KEYS = {
    "data": frozenset({"path", "test_path", "tokenizer", "levels", "num_workers", "degree", "path_len",
                       "num_nodes", "num_train", "num_test", "data_seed", "reverse_answer"}),
    "objective": frozenset({"reg_weight", "d_min", "d_max", "d_max_2d", "placement", "num_registers",
                            "per_register_offsets", "edge", "multihead_layout", "num_heads"}),
}
_build, _check_type = build_section, check_type   # old private names, used by older callers
SECTION_TYPES = {"model": ModelConfig, "optim": OptimConfig, "train": TrainConfig, "sample": SampleConfig}


def from_dict(data: dict | None) -> RunConfig:
    """A fully checked RunConfig from a plain dict (a YAML file, a checkpoint's stored config)."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        fail("config", "a mapping of sections", data)
    kwargs = {}
    for s, value in data.items():
        if s not in SECTIONS:
            raise ConfigError(f"unknown config section '{s}' (known: {', '.join(SECTIONS)})")
        if s in VARIANTS:
            kwargs[s] = build_tagged(s, value)
        else:
            kwargs[s] = build_section(SECTION_TYPES[s], value, f"{s}.")
    return RunConfig(**kwargs).check()


# ----------------------------------------------------------------------------- files and overrides

def resolve_path(name: str | os.PathLike) -> Path:
    """``name`` as a path if it exists, else ``configs/name`` (``.yaml`` may be omitted)."""
    p = Path(name)
    if p.exists():
        return p
    for cand in (CONFIG_DIR / p, CONFIG_DIR / f"{p}.yaml"):
        if cand.exists():
            return cand
    raise ConfigError(f"config '{name}' not found (looked for it as a path and under {CONFIG_DIR})")


def parse_override(item: str) -> tuple[list[str], Any]:
    """``section.key=value`` -> (["section", "key"], parsed value)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``--set section.key=value`` items in order. Switching a tagged section to another variant
    (``--set objective.name=ntp`` on a mutor-2d file) keeps only the fields the new variant has."""
    for item in overrides or []:
        keys, value = parse_override(item)
        node = data
        for k in keys[:-1]:
            if node is data and k not in SECTIONS:
                raise ConfigError(f"--set {item}: unknown config section '{k}'")
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item}: '{k}' is not a section")
        if len(keys) == 2 and keys[0] in VARIANTS and keys[1] == "name" and value != node.get("name"):
            _switch_variant(node, keys[0], value)
        node[keys[-1]] = value
    return data


def _switch_variant(section: dict, name: str, new: Any) -> None:
    """Drop the fields of ``section`` (a dict) that variant ``new`` does not have (unknown names are
    left for the variant check to report)."""
    if isinstance(new, str) and new in VARIANTS[name]:
        keep = {f.name for f in dataclasses.fields(VARIANTS[name][new])}
        for k in [k for k in section if k != "name" and k not in keep]:
            del section[k]


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; a syntax error is a one-line ConfigError with the file's line number."""
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({what})") from None


def load(name: str | os.PathLike | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML config (by path or name under configs/), apply ``--set`` overrides, check it."""
    data: Any = {}
    if name is not None:
        path = resolve_path(name)
        data = read_yaml(path) or {}
        if not isinstance(data, dict):
            fail(str(path), "a mapping of sections", data)
    return from_dict(apply_overrides(data, overrides or []))


def dump(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
