"""YAML run configs, checked into dataclasses when they load: one config system for every run kind.

A config names its kind with ``task:`` (image when left out, lm, vq, or a plugin's) and has one section
per part. A kind's root (:class:`ConfigRoot`, ``@register_run_config`` in ``mutor2d/TASK/config.py``)
lists its sections; each section's dataclass lives in the torch-free ``config`` module of its package
and registers itself with its builder (mutor2d.registry): ``@register_section("model", build=...)``,
or ``@register_variant("objective", "mutor-2d", build=...)`` for a variant of a *tagged* section
(``name`` picks it), both entries of the one registry. Here: building (``from_dict``, ``load``) and
writing (``to_dict``, ``dump``) a config, ``--set`` overrides. The first lookup imports every ``SECTION_HOMES`` config module
and the MUTOR2D_PLUGINS; a bad value is a one-line :class:`ConfigError` naming the key.

The torch-free rule, stated here once: the config system, every package's ``config`` module and what
they import load without torch, so a bad config (or command line) is one line before the seconds a
torch import takes; a builder named as "module:function" is imported only when the section is built.
``tests/test_layers.py`` and ``tests/test_help.py`` hold it.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import os
import typing
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import yaml

from .checks import ConfigError, check_type, fail
from .config_files import parse_override, read_mapping
from .registry import REGISTRY, named, register
from .run_configs import run_config_class, task_of

SECTION_HOMES = {"model": "model", "data": "data", "objective": "objectives", "optim": "engine",
                 "train": "image", "sample": "sampling", "sample.decode": "sampling"}
# where each registered section's parts live: the ``config`` module of that package of mutor2d is
# imported on the first use of the registry, so a new part is one dataclass there (or in a plugin module)
RENAMED = {"kind": "task", "model.prefix": "model.conditioning", "objective.d_max_2d": "objective.d_max",
           "objective.multihead_layout": "objective.layout", "train.save_every": "train.ckpt_every",
           "train.padding_side": "data.padding_side", "train.group_by_length": "data.group_by_length",
           **{f"train.{k}": f"optim.{k}" for k in ("lr", "betas", "weight_decay", "grad_clip")}}
# keys of configs written by older versions: not read, named in the one-line error that refuses them


# ----------------------------------------------------------------------------- the registry

DEFAULT_VARIANT = {"data": "digits", "objective": "ntp", "sample.decode": "plain"}   # the tagged sections


def register_section(section: str, build: str | Callable | None = None):
    """Class decorator: make a dataclass the plain section ``section``, built by ``build``."""
    return register(section, build)


def register_variant(section: str, name: str, build: str | Callable | None = None, **parts: str | Callable):
    """Class decorator: make a dataclass the ``section`` variant picked by ``name: NAME``, built by
    ``build`` (without: as its parent class); ``parts``: builders of its other parts (mutor2d.registry)."""
    return register(f"{section}.{name}", build, "name", **parts)


_PARTS_IMPORTED = False


def import_parts() -> None:
    """Import every part's config module and every plugin module once, so their sections are registered."""
    from .plugins import load_plugins
    global _PARTS_IMPORTED
    if not _PARTS_IMPORTED:
        _PARTS_IMPORTED = True
        for home in sorted(set(SECTION_HOMES.values())):
            importlib.import_module(f"{__package__}.{home}.config")
    load_plugins()


class Variant:
    """Base of a tagged section's variants: ``name`` is set by ``register_variant``."""
    name: ClassVar[str] = ""

    def check(self) -> None:
        """Raise ConfigError for a bad value (fields are type-checked before)."""

    def check_grid(self, grid: tuple[int, int], prefix_len: int) -> None:
        """Raise ConfigError if this setting cannot work on the data's ``grid`` (H, W)."""


@dataclass
class UnknownVariant(Variant):
    """A tagged section whose variant this process does not know (a plugin's, not imported), kept as
    stored: what a reader that does not need the section holds instead of failing (``from_dict(...,
    lenient=("objective",))``: plain decoding never uses the objective). Whatever needs the variant's
    own rules (``uses_registers``, ``register_spec``) is a one-line ConfigError naming it."""
    section: str = ""
    stored: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.name = self.stored.get("name")

    def missing(self) -> ConfigError:
        return ConfigError(f"{self.section}.name={self.name!r} is not a variant this process knows (a plugin's: "
                           f"name its module in MUTOR2D_PLUGINS); plain decoding does without it, this does not")

    def uses_registers(self) -> bool:
        raise self.missing()

    def register_spec(self):
        raise self.missing()


def variant_class(section: str, name: Any) -> type:
    import_parts()
    variants = named(section)
    if not isinstance(name, str) or name not in variants:
        raise ConfigError(f"{section}.name: expected one of {list(variants)}, got {name!r}")
    return variants[name]


def make(section: str, **fields):
    """The checked section ``section`` from keyword fields; a tagged one takes ``name`` (its default
    variant without), e.g. ``make("objective", name="mutor-2d", d_max=3)``."""
    built = build_tagged(section, fields) if section in DEFAULT_VARIANT else build_plain(section, fields)
    built.check()
    return built


class ConfigRoot:
    """Base of a run kind's config: a dataclass with one field per section (``sections`` in order).

    One way to build and dump every kind: ``from_dict`` builds each section over the kind's default
    for it (``build``; a tagged section picks its variant) and runs ``check``; ``to_dict`` gives the
    plain mapping back, ``task`` first."""
    task: ClassVar[str] = ""
    sections: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def default(cls, section: str):
        return {f.name: f for f in dataclasses.fields(cls)}[section].default_factory()

    @classmethod
    def build(cls, section: str, value: Any):
        default = cls.default(section)
        if isinstance(default, Variant):                  # a tagged section: ``name`` picks the variant
            return build_tagged(section, value)
        return build_over(default, value, f"{section}.")

    @classmethod
    def from_dict(cls, data: Any, lenient: tuple[str, ...] = ()):
        """A fully checked config of this kind from a plain mapping (a YAML file, a checkpoint's config);
        the tagged sections named in ``lenient`` may hold a variant this process does not know."""
        if not isinstance(data, (dict, type(None))):
            fail("config", "a mapping of sections", data)
        data = dict(data or {})
        task = data.pop("task", cls.task)
        if task != cls.task:
            fail("task", repr(cls.task), task)
        sections = {}
        for s, value in data.items():                       # in the mapping's order: the first error is named
            if s not in cls.sections:
                raise ConfigError(f"unknown config section '{s}' ({renamed(s)}known: task, {', '.join(cls.sections)})")
            sections[s] = (s in lenient and unknown_variant(s, value)) or cls.build(s, value)
        return cls(**sections).check()

    @classmethod
    def load(cls, source: Any = None, overrides: list[str] | None = None):
        """A config of this kind from a YAML path or name under configs/, a mapping (not modified) or
        a config, with ``--set section.key=value`` overrides applied in order."""
        data = source.to_dict() if isinstance(source, ConfigRoot) else copy.deepcopy(source) \
            if isinstance(source, dict) else read_mapping(source) if source is not None else {}
        return cls.from_dict(apply_overrides(data, overrides or [], sections=("task", *cls.sections)))

    def to_dict(self) -> dict:
        """Plain dict, ``task`` first (tagged sections lead with their ``name``); ``from_dict`` reads it back."""
        return {"task": self.task, **{s: section_dict(getattr(self, s)) for s in self.sections}}

    def check(self):
        """Every section's rules; a kind adds the rules across its sections."""
        for s in self.sections:
            getattr(self, s).check()
        return self


def section_dict(section) -> dict:
    """A section as plain YAML-safe data (tuples as lists); a variant leads with its ``name``."""
    def plain(v):
        if dataclasses.is_dataclass(v):
            return section_dict(v)
        return [plain(x) for x in v] if isinstance(v, (list, tuple)) else v
    if isinstance(section, UnknownVariant):
        return dict(section.stored)
    d = {f.name: plain(getattr(section, f.name)) for f in dataclasses.fields(section)}
    return {"name": section.name, **d} if isinstance(section, Variant) else d


# ----------------------------------------------------------------------------- building

def renamed(key: str) -> str:
    """For the error refusing ``key``: what an older version's key is called now ("" for others)."""
    return f"written by an older version: now '{RENAMED[key]}'; " if key in RENAMED else ""


def build_section(cls, data: Any, prefix: str, context: str = ""):
    """Dataclass ``cls`` from a mapping, every field type-checked; unknown keys are errors."""
    if not isinstance(data, dict):
        fail(prefix.rstrip(".") or "config", "a mapping", data)
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    for k in data:
        if k not in fields:
            known = (["name"] if context else []) + fields
            close = difflib.get_close_matches(str(k), known, n=1)
            hint = renamed(prefix + str(k)) or (f"did you mean '{prefix}{close[0]}'? " if close else "")
            raise ConfigError(f"unknown config key '{prefix}{k}'{context} ({hint}known: {', '.join(known) or 'none'})")
    return cls(**{k: build_tagged(prefix + k, v) if prefix + k in DEFAULT_VARIANT else check_type(prefix + k, v, hints[k])
                  for k, v in data.items()})


def build_over(default, data: Any, prefix: str):
    """A section of ``default``'s type: ``data``'s fields over ``default``'s values (a run kind's defaults)."""
    if data is not None and not isinstance(data, dict):
        fail(prefix.rstrip("."), "a mapping", data)
    return build_section(type(default), {**section_dict(default), **(data or {})}, prefix)


def build_plain(section: str, data: Any):
    import_parts()
    return build_section(REGISTRY[section].cls, data, f"{section}.")


def unknown_variant(section: str, data: Any) -> UnknownVariant | None:
    """An UnknownVariant holding ``data`` when it names a variant of the tagged ``section`` that no
    registered one has; None otherwise (build it as usual)."""
    if section not in DEFAULT_VARIANT or not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    import_parts()
    return None if data["name"] in named(section) else UnknownVariant(section=section, stored=dict(data))


def build_tagged(section: str, data: Any):
    """The variant of a tagged section that ``data['name']`` picks (default DEFAULT_VARIANT)."""
    if not isinstance(data, dict):
        fail(section, "a mapping", data)
    name = data.get("name", DEFAULT_VARIANT[section])
    cls = variant_class(section, name)
    rest = {k: v for k, v in data.items() if k != "name"}
    return build_section(cls, rest, f"{section}.", context=f" for {section}.name={name}")


def from_dict(data: Any, lenient: tuple[str, ...] = ()):
    """The checked run config of a plain mapping (a YAML file, a checkpoint's stored config), of the
    kind its ``task`` names (default: image); ``lenient``: see ConfigRoot.from_dict."""
    if not isinstance(data, (dict, type(None))):
        fail("config", "a mapping of sections", data)
    return run_config_class(task_of(data or {})).from_dict(data, lenient)


# ----------------------------------------------------------------------------- overrides

def apply_overrides(data: dict, overrides: list[str], sections: tuple[str, ...] | None = None) -> dict:
    """Apply ``--set section.key=value`` items in order. Switching a tagged section to another variant
    (``--set objective.name=ntp`` on a mutor-2d file) keeps only the fields the new variant has."""
    for item in overrides or []:
        keys, value = parse_override(item)
        node = data
        for k in keys[:-1]:
            if node is data and sections is not None and k not in sections:
                raise ConfigError(f"--set {item}: unknown config section '{k}'")
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item}: '{k}' is not a section")
        tagged = ".".join(keys[:-1])
        if tagged in DEFAULT_VARIANT and keys[-1] == "name" and value != node.get("name"):
            _switch_variant(node, tagged, value)
        node[keys[-1]] = value
    return data


def _switch_variant(section: dict, name: str, new: Any) -> None:
    """Drop the fields of ``section`` (a dict; ``name`` its dotted name) that variant ``new`` lacks."""
    import_parts()
    if isinstance(new, str) and new in named(name):
        keep = {f.name for f in dataclasses.fields(named(name)[new])}
        for k in [k for k in section if k != "name" and k not in keep]:
            del section[k]


def load(name: str | os.PathLike | dict | None = None, overrides: list[str] | None = None):
    """A YAML config (a path or a name under configs/, or a mapping, which is not modified) with
    ``--set section.key=value`` overrides -> the checked config of the kind its ``task`` names."""
    data = name if isinstance(name, dict) else read_mapping(name) if name is not None else {}
    return run_config_class(task_of(data)).load(data, overrides)             # which copies a mapping


def dump(cfg) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
