"""YAML run configs, checked into dataclasses when they load: one config system for every run kind.

A run config names its kind with ``task:`` (image when left out, lm, vq, or a plugin's) and has one
section per part. Each kind's config root (a :class:`ConfigRoot` dataclass, ``@register_run_config``
in ``mutor2d/TASK/config.py``) lists its sections; each part's dataclass lives in the ``config``
module of the package whose code it configures (no torch there: a config is loaded and checked before
torch is imported; its ``build`` imports the code) and registers itself with one decorator:
``@register_section("model")`` for a plain section, ``@register_variant("objective", "mutor-2d")``
for a variant of a *tagged* section (``name`` picks the variant; only its fields are accepted). A
tagged sub-section nests in a plain one under a dotted name (``sample.decode``: a field of the sample dataclass whose default is ``make("sample.decode")``).
This module holds only what every kind shares: the registries, building a config (``from_dict``,
``load``) and writing it (``to_dict``, ``dump``), ``--set`` overrides and the YAML loader (type and
range checks: mutor2d.checks); each section and each root owns its legacy upgrade (``upgrade``). The
first use of a registry imports the config module of every section's home package (``SECTION_HOMES``)
and the plugins named in ``MUTOR2D_PLUGINS``, so no import order matters and no list of modules is kept.
Every section has ``check()``; a bad value fails before a run starts, with a one-line
:class:`ConfigError` naming the key.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from .checks import ConfigError, check_type, fail

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
SECTION_HOMES = {"model": "model", "data": "data", "objective": "objectives", "optim": "engine",
                 "train": "image", "sample": "sampling", "sample.decode": "sampling"}
# where each registered section's parts live: the ``config`` module of that package of mutor2d is
# imported on the first use of the registry, so a new part is one dataclass there (or in a plugin module)


# ----------------------------------------------------------------------------- the registry

PLAIN: dict[str, type] = {}                                   # section -> dataclass
VARIANTS: dict[str, dict[str, type]] = {"data": {}, "objective": {}, "sample.decode": {}}
DEFAULT_VARIANT = {"data": "digits", "objective": "ntp", "sample.decode": "plain"}


def registered(registry: dict, key: str, attr: str | None = None):
    """Class decorator: put the class into ``registry[key]`` (and set its ``attr`` to ``key``); the
    one shape of every registry's decorator."""
    def add(cls):
        if attr:
            setattr(cls, attr, key)
        registry[key] = cls
        return cls
    return add


def register_section(section: str):
    """Class decorator: make a dataclass the plain section ``section``."""
    return registered(PLAIN, section)


def register_variant(section: str, name: str):
    """Class decorator: make a dataclass the ``section`` variant picked by ``name: NAME``."""
    return registered(VARIANTS[section], name, "name")


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
    """Base of a tagged section's variants: ``name`` is set by ``register_variant``. ``legacy_keys``: the
    keys of the flat section configs stored before it was tagged (all variants' keys at once); a
    mapping holding all of them is read by the picked variant's ``from_legacy``."""
    name: ClassVar[str] = ""
    legacy_keys: ClassVar[frozenset] = frozenset()

    def check(self) -> None:
        """Raise ConfigError for a bad value (fields are type-checked before)."""

    def check_grid(self, grid: tuple[int, int], prefix_len: int) -> None:
        """Raise ConfigError if this setting cannot work on the data's ``grid`` (H, W)."""

    @classmethod
    def from_legacy(cls, flat: dict) -> dict:
        """This variant's fields out of an old flat section dict (other variants' keys dropped)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return {k: v for k, v in flat.items() if k in names}


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


# ----------------------------------------------------------------------------- run configs

RUN_CONFIGS: dict[str, type] = {}                             # task -> config root
DEFAULT_TASK = "image"                                       # a config without ``task:``


def register_run_config(task: str):
    """Class decorator: make a :class:`ConfigRoot` dataclass the config of runs with ``task: TASK``."""
    return registered(RUN_CONFIGS, task, "task")


def task_of(data: dict) -> str:
    """The run kind a config mapping names: ``task``, or the legacy ``kind`` key, else the default."""
    return data.get("task", data.get("kind", DEFAULT_TASK))


def run_config_class(task: Any) -> type:
    """The config root of ``task``; a kind of mutor2d is the package ``mutor2d.TASK`` (its ``config``
    module registers it: ``known_tasks``), a plugin's registers itself when MUTOR2D_PLUGINS imports it."""
    from .plugins import load_plugins
    load_plugins()
    if isinstance(task, str) and task not in RUN_CONFIGS and task in known_tasks():
        importlib.import_module(f"{__package__}.{task}.config")
    if not isinstance(task, str) or task not in RUN_CONFIGS:
        raise ConfigError(f"task: expected a run kind, one of {known_tasks()}, got {task!r}")
    return RUN_CONFIGS[task]


def known_tasks() -> list[str]:
    """Every task this install knows: the registered ones and the run-kind packages of mutor2d, those
    with a ``config`` module (the root) and a ``run`` module (the engine's parts; other packages'
    ``config`` modules hold sections)."""
    import pkgutil
    here = Path(__file__).parent
    found = {m.name for m in pkgutil.iter_modules([str(here)])
             if m.ispkg and all((here / m.name / f"{part}.py").exists() for part in ("config", "run"))}
    return sorted(found | set(RUN_CONFIGS))


class ConfigRoot:
    """Base of a run kind's config: a dataclass with one field per section (``sections`` in order).

    One way to build, dump and upgrade every kind: ``from_dict`` applies the kind's legacy ``upgrade``,
    builds each section over the kind's default for it (``build``; a tagged section picks its variant)
    and runs ``check``; ``to_dict`` gives the plain mapping back, ``task`` first."""
    task: ClassVar[str] = ""
    sections: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def upgrade(cls, data: dict) -> dict:
        """The mapping of a config written by an older version, in today's layout (default: as is)."""
        return data

    @classmethod
    def default(cls, section: str):
        """This kind's default value of ``section``."""
        return {f.name: f for f in dataclasses.fields(cls)}[section].default_factory()

    @classmethod
    def build(cls, section: str, value: Any):
        """Section ``section`` of this kind from its mapping ``value``."""
        default = cls.default(section)
        if isinstance(default, Variant):                  # a tagged section: ``name`` picks the variant
            return build_tagged(section, value)
        return build_over(default, value, f"{section}.")

    @classmethod
    def from_dict(cls, data: Any, lenient: tuple[str, ...] = ()):
        """A fully checked config of this kind from a plain mapping (a YAML file, a checkpoint's config);
        the tagged sections named in ``lenient`` may hold a variant this process does not know."""
        data = {} if data is None else data
        if not isinstance(data, dict):
            fail("config", "a mapping of sections", data)
        data = cls.upgrade(dict(data))
        task = data.pop("task", cls.task)
        if task != cls.task:
            fail("task", repr(cls.task), task)
        sections = {}
        for s, value in data.items():                       # in the mapping's order: the first error is named
            if s not in cls.sections:
                raise ConfigError(f"unknown config section '{s}' (known: task, {', '.join(cls.sections)})")
            sections[s] = (s in lenient and unknown_variant(s, value)) or cls.build(s, value)
        return cls(**sections).check()

    @classmethod
    def load(cls, source: Any = None, overrides: list[str] | None = None):
        """A config of this kind from a YAML path or name under configs/, a mapping (not modified) or
        a config, with ``--set section.key=value`` overrides applied in order."""
        data = source.to_dict() if isinstance(source, ConfigRoot) else copy.deepcopy(source) \
            if isinstance(source, dict) else read_mapping(source) if source is not None else {}
        return cls.from_dict(apply_overrides(cls.upgrade(data), overrides or [], sections=("task", *cls.sections)))

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

def build_section(cls, data: Any, prefix: str, context: str = ""):
    """Dataclass ``cls`` from a mapping, every field type-checked; unknown keys are errors."""
    if not isinstance(data, dict):
        fail(prefix.rstrip(".") or "config", "a mapping", data)
    data = cls.upgrade(dict(data)) if hasattr(cls, "upgrade") else data
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    for k in data:
        if k not in fields:
            known = (["name"] if context else []) + fields
            close = difflib.get_close_matches(str(k), known, n=1)
            hint = f"did you mean '{prefix}{close[0]}'? " if close else ""
            raise ConfigError(f"unknown config key '{prefix}{k}'{context} ({hint}known: {', '.join(known) or 'none'})")
    return cls(**{k: build_tagged(prefix + k, v) if prefix + k in VARIANTS else check_type(prefix + k, v, hints[k])
                  for k, v in data.items()})


def build_over(default, data: Any, prefix: str):
    """A section of ``default``'s type: ``data``'s fields over ``default``'s values (a run kind's defaults)."""
    if data is not None and not isinstance(data, dict):
        fail(prefix.rstrip("."), "a mapping", data)
    cls = type(default)
    data = cls.upgrade(dict(data or {})) if hasattr(cls, "upgrade") else data or {}
    return build_section(cls, {**section_dict(default), **data}, prefix)


def build_plain(section: str, data: Any):
    import_parts()
    return build_section(PLAIN[section], data, f"{section}.")


def unknown_variant(section: str, data: Any) -> UnknownVariant | None:
    """An UnknownVariant holding ``data`` when it names a variant of the tagged ``section`` that no
    registered one has; None otherwise (build it as usual)."""
    if section not in VARIANTS or not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    import_parts()
    return None if data["name"] in VARIANTS[section] else UnknownVariant(section=section, stored=dict(data))


def build_tagged(section: str, data: Any):
    """The variant of a tagged section that ``data['name']`` picks (default DEFAULT_VARIANT)."""
    if not isinstance(data, dict):
        fail(section, "a mapping", data)
    name = data.get("name", DEFAULT_VARIANT[section])
    cls = variant_class(section, name)
    rest = {k: v for k, v in data.items() if k != "name"}
    if cls.legacy_keys and cls.legacy_keys <= set(rest):
        rest = cls.from_legacy(rest)
    return build_section(cls, rest, f"{section}.", context=f" for {section}.name={name}")


def from_dict(data: Any, lenient: tuple[str, ...] = ()):
    """The checked run config of a plain mapping (a YAML file, a checkpoint's stored config), of the
    kind its ``task`` names (default: image); ``lenient``: see ConfigRoot.from_dict."""
    if not isinstance(data, (dict, type(None))):
        fail("config", "a mapping of sections", data)
    return run_config_class(task_of(data or {})).from_dict(data, lenient)


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
                          f"('{{}}' for every default)")
    if not isinstance(data, dict):
        fail(str(path), "a mapping of sections", data)
    return data


def load(name: str | os.PathLike | dict | None = None, overrides: list[str] | None = None):
    """A YAML config (a path or a name under configs/, or a mapping, which is not modified) with
    ``--set section.key=value`` overrides -> the checked config of the kind its ``task`` names."""
    data = copy.deepcopy(name) if isinstance(name, dict) else read_mapping(name) if name is not None else {}
    return run_config_class(task_of(data)).load(data, overrides)


def dump(cfg) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
