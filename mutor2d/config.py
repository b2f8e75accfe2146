"""YAML configs validated into dataclasses.

A run config has one section per concern (model, data, objective, optim, train, sample). Every
section is a dataclass; a YAML file may set any subset of its fields. Unknown keys, wrong types and
impossible combinations raise :class:`ConfigError` with a one-line message naming the key.

``--set section.key=value`` overrides are parsed with YAML scalar rules (``--set optim.lr=1e-3``).
"""
from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A bad config value; the message is one line naming the key."""


@dataclass
class ModelConfig:
    """LlamaGen-style decoder. ``preset`` fills n_layer/n_head/dim unless they are set explicitly."""
    preset: Literal["tiny", "small", "B", "L", "XL", "custom"] = "tiny"
    n_layer: int | None = None
    n_head: int | None = None
    dim: int | None = None
    vocab_size: int = 16384
    num_classes: int = 1000          # class-conditional prefix; ignored for prompt prefixes
    prefix: Literal["class", "prompt"] = "class"
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
    attention: Literal["auto", "sdpa", "flex"] = "auto"


@dataclass
class DataConfig:
    """Where training tokens come from. ``name`` picks the dataset builder in mutor2d.data."""
    name: Literal["digits", "codes", "stargraph"] = "digits"
    path: str | None = None          # codes: folder written by tokenizers/extract_codes.py
    test_path: str | None = None     # codes: folder for the test split (optional)
    tokenizer: str = "pixel"         # "pixel" (digits grey levels) or a VQ checkpoint path (digits, codes)
    levels: int = 17                 # pixel tokenizer: number of grey levels
    num_workers: int = 0
    # star graph (1D task)
    degree: int = 2
    path_len: int = 5
    num_nodes: int = 50
    num_train: int = 200000
    num_test: int = 2000
    data_seed: int = 1234
    reverse_answer: bool = False     # answer goal -> source (the positive control: no planning needed)


@dataclass
class ObjectiveConfig:
    """Training objective (DESIGN.md 1.2-1.6).

    name: ntp | mutor-1d | mutor-2d | multihead.
    reg_weight: a in (1-a)*CE_ntp + a*CE_reg.
    d_min..d_max: 1D offsets (Δr=0, Δc=d). d_max_2d: D, 2D offsets {0..D-1}² minus (0,0).
    placement: dense (one register per valid anchor) or sparse (num_registers random anchors).
    edge: geometric (no wrap past the right edge) or raster (target x_{t+Δr·W+Δc}).
    num_heads: multihead baseline: extra heads (0 = as many as offsets: D²-1 in 2D, d_max-1 in 1D).
    """
    name: Literal["ntp", "mutor-1d", "mutor-2d", "multihead"] = "ntp"
    reg_weight: float = 0.5
    d_min: int = 1
    d_max: int = 4
    d_max_2d: int = 4
    placement: Literal["dense", "sparse"] = "dense"
    num_registers: int = 80
    per_register_offsets: bool = False
    edge: Literal["geometric", "raster"] = "geometric"
    multihead_layout: Literal["1d", "2d"] = "2d"
    num_heads: int = 0


@dataclass
class OptimConfig:
    lr: float = 4e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.05
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    min_lr: float = 0.0
    grad_clip: float = 1.0


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


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- validation

def _check_type(key: str, value: Any, tp: Any) -> Any:
    """Return ``value`` coerced to ``tp`` or raise ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_type(key, value, a)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: expected one of {list(args)}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{key}: expected {len(args)} values, got {value!r}")
            return tuple(_check_type(key, v, a) for v, a in zip(value, args))
        inner = args[0] if args else Any
        out = [_check_type(key, v, inner) for v in value]
        return tuple(out) if origin is tuple else out
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp}")


def _type_name(tp: Any) -> str:
    return str(tp).replace("typing.", "")


def _build(cls, data: dict, prefix: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown config key '{prefix}{unknown[0]}' (known: {', '.join(sorted(names))})")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            kwargs[f.name] = _build(tp, data[f.name], f"{prefix}{f.name}.")
        else:
            kwargs[f.name] = _check_type(prefix + f.name, data[f.name], tp)
    return cls(**kwargs)


def validate(cfg: RunConfig) -> RunConfig:
    """Checks that need more than one field. Grid-dependent checks live in registers.RegisterSpec."""
    o, m, t, op = cfg.objective, cfg.model, cfg.train, cfg.optim
    _positive("objective.reg_weight", o.reg_weight, allow_zero=True, upper=1.0)
    if o.d_min < 1 or o.d_max < o.d_min:
        raise ConfigError(f"objective.d_min/d_max: need 1 <= d_min <= d_max, got {o.d_min}..{o.d_max}")
    if o.d_max_2d < 2:
        raise ConfigError(f"objective.d_max_2d: need D >= 2 (D=1 has no offsets), got {o.d_max_2d}")
    if o.placement == "sparse" and o.num_registers < 1:
        raise ConfigError(f"objective.num_registers: sparse placement needs K >= 1, got {o.num_registers}")
    if o.num_heads < 0:
        raise ConfigError(f"objective.num_heads: expected >= 0, got {o.num_heads}")
    if m.preset == "custom" and None in (m.n_layer, m.n_head, m.dim):
        raise ConfigError("model.preset: 'custom' needs model.n_layer, model.n_head and model.dim")
    dim = m.dim
    if dim is not None and m.n_head is not None and dim % m.n_head:
        raise ConfigError(f"model.dim: {dim} is not divisible by model.n_head={m.n_head}")
    for k in ("token_dropout", "attn_dropout", "resid_dropout", "ffn_dropout", "class_dropout"):
        _positive(f"model.{k}", getattr(m, k), allow_zero=True, upper=1.0)
    _positive("data.num_train", cfg.data.num_train)
    _positive("data.num_test", cfg.data.num_test)
    _positive("optim.lr", op.lr)
    _positive("train.batch_size", t.batch_size)
    _positive("train.max_steps", t.max_steps, allow_zero=True)
    _positive("train.grad_accum", t.grad_accum)
    if t.batch_size % t.grad_accum:
        raise ConfigError(f"train.grad_accum: {t.grad_accum} does not divide train.batch_size={t.batch_size}")
    _check_train(t, op)
    return cfg


def _check_train(t: TrainConfig, op: OptimConfig) -> None:
    """Settings of the train and optim sections (mutor2d.training)."""
    _positive("optim.weight_decay", op.weight_decay, allow_zero=True)
    _positive("optim.min_lr", op.min_lr, allow_zero=True)
    _positive("optim.grad_clip", op.grad_clip, allow_zero=True)
    _positive("optim.warmup_steps", op.warmup_steps, allow_zero=True)
    for b in op.betas:
        if not 0 <= b < 1:
            raise ConfigError(f"optim.betas: expected values in [0, 1), got {list(op.betas)}")
    _positive("train.log_every", t.log_every)
    for k in ("ckpt_every", "keep_ckpts", "sample_every", "eval_every"):
        _positive(f"train.{k}", getattr(t, k), allow_zero=True)
    _positive("train.eval_per_class", t.eval_per_class)
    if not 0 < t.ema_decay < 1:
        raise ConfigError(f"train.ema_decay: expected a number in (0, 1), got {t.ema_decay!r}")


def _positive(key, value, allow_zero=False, upper=None):
    if value < 0 or (value == 0 and not allow_zero) or (upper is not None and value > upper):
        bound = f"in [0, {upper}]" if upper is not None else (">= 0" if allow_zero else "> 0")
        raise ConfigError(f"{key}: expected {bound}, got {value!r}")


def from_dict(data: dict) -> RunConfig:
    return validate(_build(RunConfig, data or {}, ""))


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
    for item in overrides or []:
        keys, value = parse_override(item)
        node = data
        for k in keys[:-1]:
            if k not in {f.name for f in dataclasses.fields(RunConfig)} and node is data:
                raise ConfigError(f"--set {item}: unknown config section '{k}'")
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item}: '{k}' is not a section")
        node[keys[-1]] = value
    return data


def load(name: str | os.PathLike | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML config (by path or name under configs/) and apply ``--set`` overrides."""
    data: dict = {}
    if name is not None:
        path = resolve_path(name)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    return from_dict(apply_overrides(data, overrides or []))


def dump(cfg: RunConfig) -> str:
    d = cfg.to_dict()
    d["optim"]["betas"] = list(d["optim"]["betas"])
    return yaml.safe_dump(d, sort_keys=False)
