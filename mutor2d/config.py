"""YAML run configs, checked into dataclasses when they load.

A run config has one section per part: model, data, objective, optim, train, sample. Each part's
dataclass lives beside the code it configures and registers itself with one decorator:
``@register_section("model")`` for a plain section, ``@register_variant("objective", "mutor-2d")``
for a variant of a *tagged* section (``name`` picks the variant; only its fields are accepted). A
tagged sub-section nests in a plain one under a dotted name (``sample.decode``: a field of the sample
dataclass whose default is ``make("sample.decode")``).
This module holds only what every part shares: the registry, the run config, ``--set`` overrides,
legacy upgrades and the YAML loader (type and range checks: mutor2d.checks). The first time a config
is built it imports the parts' modules (``PART_MODULES``) and the plugins named in ``MUTOR2D_PLUGINS``,
so no import order matters. Every section has ``check()``; a bad value fails before a run starts,
with a one-line :class:`ConfigError` naming the key.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from .checks import ConfigError, at_most, check_type, fail

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
SECTIONS = ("model", "data", "objective", "optim", "train", "sample")
EVAL_PER_CLASS_LIMIT = 10_000      # train.eval_per_class: samples per class of one online evaluation
PART_MODULES = ("mutor2d.model.gpt", "mutor2d.data.tokens", "mutor2d.data.stargraph", "mutor2d.objectives",
                "mutor2d.engine.optim", "mutor2d.engine.loop", "mutor2d.sampling")


# ----------------------------------------------------------------------------- the registry

PLAIN: dict[str, type] = {}                                   # section -> dataclass
VARIANTS: dict[str, dict[str, type]] = {"data": {}, "objective": {}, "sample.decode": {}}
DEFAULT_VARIANT = {"data": "digits", "objective": "ntp", "sample.decode": "plain"}


def register_section(section: str):
    """Class decorator: make a dataclass the plain section ``section``."""
    def add(cls):
        PLAIN[section] = cls
        return cls
    return add


def register_variant(section: str, name: str):
    """Class decorator: make a dataclass the ``section`` variant picked by ``name: NAME``."""
    def add(cls):
        cls.name = name
        VARIANTS[section][name] = cls
        return cls
    return add


def import_parts() -> None:
    """Import every part's module and every plugin module once, so their sections are registered."""
    from .plugins import load_plugins
    for module in PART_MODULES:
        importlib.import_module(module)
    load_plugins()


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


def variant_class(section: str, name: Any) -> type:
    import_parts()
    variants = VARIANTS[section]
    if not isinstance(name, str) or name not in variants:
        raise ConfigError(f"{section}.name: expected one of {list(variants)}, got {name!r}")
    return variants[name]


def make(section: str, **fields):
    """The checked section ``section`` from keyword fields; a tagged one takes ``name`` (its default
    variant without), e.g. ``make("objective", name="mutor-2d", d_max=3)``."""
    built = build_tagged(section, fields) if section in VARIANTS else build_plain(section, fields)
    built.check()
    return built


# ----------------------------------------------------------------------------- the run

@dataclass
class RunConfig:
    """Every section of an image run; defaults are the registered sections' defaults."""
    model: Any = field(default_factory=lambda: make("model"))
    data: Any = field(default_factory=lambda: make("data"))
    objective: Any = field(default_factory=lambda: make("objective"))
    optim: Any = field(default_factory=lambda: make("optim"))
    train: Any = field(default_factory=lambda: make("train"))
    sample: Any = field(default_factory=lambda: make("sample"))

    def to_dict(self) -> dict:
        """Plain dict (tagged sections lead with their ``name``); ``from_dict`` reads it back."""
        return {s: section_dict(getattr(self, s)) for s in SECTIONS}

    def run_kind(self):
        """The engine's parts for an image run (mutor2d.image.run)."""
        from .image.run import ImageRun
        return ImageRun()

    def check(self) -> "RunConfig":
        """Every section's rules, then the rules across sections."""
        for s in SECTIONS:
            getattr(self, s).check()
        kind = self.model.kind()
        at_most("train.eval_per_class", self.train.eval_per_class, EVAL_PER_CLASS_LIMIT,
                "samples per class of each online evaluation, made in memory")
        if self.train.eval_every and (self.data.name != "digits" or not kind.per_class):
            raise ConfigError(f"train.eval_every: the online evaluation needs data.name=digits with class "
                              f"labels, got data.name={self.data.name!r}, model.conditioning={kind.name!r}")
        if not kind.guidable and self.sample.cfg_scale != 1:
            raise ConfigError(f"sample.cfg_scale={self.sample.cfg_scale}: classifier-free guidance needs "
                              f"a null prefix (model.conditioning={kind.name!r} has none); use 1")
        return self

    def check_data(self, grid: tuple[int, int], prefix_len: int, num_classes: int | None = None) -> None:
        """Rules that need the data: its body grid (H, W), prefix length and class count."""
        self.model.check_grid(grid)
        self.objective.check_grid(grid, prefix_len)
        self.sample.decode.fit(self.objective, grid)
        if num_classes is not None and self.model.kind().per_class:
            self.sample.check_classes(num_classes)


def section_dict(section) -> dict:
    """A section as plain YAML-safe data (tuples as lists); a variant leads with its ``name``."""
    def plain(v):
        if dataclasses.is_dataclass(v):
            return section_dict(v)
        return [plain(x) for x in v] if isinstance(v, (list, tuple)) else v
    d = {f.name: plain(getattr(section, f.name)) for f in dataclasses.fields(section)}
    return {"name": section.name, **d} if isinstance(section, Variant) else d


# ----------------------------------------------------------------------------- building

def build_section(cls, data: Any, prefix: str, context: str = ""):
    """Dataclass ``cls`` from a mapping, every field type-checked; unknown keys are errors."""
    if not isinstance(data, dict):
        fail(prefix.rstrip(".") or "config", "a mapping", data)
    data = cls.upgrade(dict(data)) if hasattr(cls, "upgrade") else data
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    for k in data:
        if k not in fields:
            known = ", ".join((["name"] if context else []) + fields) or "none"
            raise ConfigError(f"unknown config key '{prefix}{k}'{context} (known: {known})")
    return cls(**{k: build_tagged(prefix + k, v) if prefix + k in VARIANTS else check_type(prefix + k, v, hints[k])
                  for k, v in data.items()})


def build_over(default, data: Any, prefix: str):
    """A section of ``default``'s type: ``data``'s fields over ``default``'s values (a run kind's defaults)."""
    if data is not None and not isinstance(data, dict):
        fail(prefix.rstrip("."), "a mapping", data)
    return build_section(type(default), {**section_dict(default), **(data or {})}, prefix)


def build_plain(section: str, data: Any):
    import_parts()
    return build_section(PLAIN[section], data, f"{section}.")


def build_tagged(section: str, data: Any):
    """The variant of a tagged section that ``data['name']`` picks (default DEFAULT_VARIANT)."""
    if not isinstance(data, dict):
        fail(section, "a mapping", data)
    name = data.get("name", DEFAULT_VARIANT[section])
    cls = variant_class(section, name)
    rest = {k: v for k, v in data.items() if k != "name"}
    if section in LEGACY_KEYS and LEGACY_KEYS[section] <= set(rest):
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


def from_dict(data: dict | None) -> RunConfig:
    """A fully checked RunConfig from a plain dict (a YAML file, a checkpoint's stored config)."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        fail("config", "a mapping of sections", data)
    kwargs = {}
    for s, value in data.items():
        if s not in SECTIONS:
            raise ConfigError(f"unknown config section '{s}' (known: {', '.join(SECTIONS)})")
        kwargs[s] = build_tagged(s, value) if s in VARIANTS else build_plain(s, value)
    return RunConfig(**kwargs).check()


# ----------------------------------------------------------------------------- files and overrides

def resolve_path(name: str | os.PathLike) -> Path:
    """``name`` as a path if it exists, else ``configs/name`` (``.yaml`` may be omitted); a folder is
    a one-line ConfigError."""
    p = Path(name)
    if p.is_dir():
        raise ConfigError(f"config {str(name)!r} is a folder; expected a YAML file (or a name under {CONFIG_DIR})")
    if p.exists():
        return p
    for cand in (CONFIG_DIR / p, CONFIG_DIR / f"{p}.yaml"):
        if cand.exists():
            return cand
    raise ConfigError(f"config '{name}' not found (looked for it as a path and under {CONFIG_DIR})")


def parse_override(item: str) -> tuple[list[str], Any]:
    """``section.key=value`` -> (["section", "key"], value parsed with YAML scalar rules)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str], sections=SECTIONS) -> dict:
    """Apply ``--set section.key=value`` items in order. Switching a tagged section to another variant
    (``--set objective.name=ntp`` on a mutor-2d file) keeps only the fields the new variant has."""
    for item in overrides or []:
        keys, value = parse_override(item)
        node = data
        for k in keys[:-1]:
            if node is data and k not in sections:
                raise ConfigError(f"--set {item}: unknown config section '{k}'")
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item}: '{k}' is not a section")
        tagged = ".".join(keys[:-1])
        if tagged in VARIANTS and keys[-1] == "name" and value != node.get("name"):
            _switch_variant(node, tagged, value)
        node[keys[-1]] = value
    return data


def _switch_variant(section: dict, name: str, new: Any) -> None:
    """Drop the fields of ``section`` (a dict; ``name`` its dotted name) that variant ``new`` lacks."""
    import_parts()
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


def read_mapping(name: str | os.PathLike) -> dict:
    """The YAML config ``name`` (a path or a name under configs/) as a dict of sections; an empty file
    (nothing but comments) is a ConfigError, not the default run."""
    path = resolve_path(name)
    data = read_yaml(path)
    if data is None:
        raise ConfigError(f"config {str(path)!r} is empty; expected a mapping of sections "
                          f"({', '.join(SECTIONS)}; '{{}}' for every default)")
    if not isinstance(data, dict):
        fail(str(path), "a mapping of sections", data)
    return data


def load(name: str | os.PathLike | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML config (by path or name under configs/), apply ``--set`` overrides, check it."""
    data = read_mapping(name) if name is not None else {}
    return from_dict(apply_overrides(data, overrides or []))


def dump(cfg) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
