"""The registry: every name a config can hold is one entry of ``REGISTRY``, entered by one decorator.

A name is dotted: a plain section ("model"), a tagged section's variant ("objective.mutor-2d",
"sample.decode.jacobi"), a run kind ("task.image"), a variant's part ("data.photos.tokenizer"). Its
entry holds the config class and the builder of what the class describes, a "module:function" string
imported on first use: a config module names its builders and imports no implementation (no torch:
mutor2d.config); the implementation imports its config, so imports run one way. ``build(cfg.objective,
model)`` calls the builder of the section's class (a subclass without its own builder: its parent's)."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Entry:
    cls: type | None                     # the config class the name stands for (None: a part, a builder only)
    build: str | Callable | None         # "module:function", or a function; None: the parent class's builder


REGISTRY: dict[str, Entry] = {}


def register(name: str, build: str | Callable | None = None, attr: str | None = None, **parts: str | Callable):
    """Class decorator: enter the class as ``name`` with its builder (the class's ``builds`` names the
    entry), its ``attr`` set to the name's last part (a variant's ``name``, a run kind's ``task``), and
    each of ``parts`` as NAME.PART (a dataset's ``tokenizer``)."""
    def add(cls):
        if attr:
            setattr(cls, attr, name.rsplit(".", 1)[-1])
        if build is not None:
            cls.builds = name
        REGISTRY[name] = Entry(cls, build)
        REGISTRY.update({f"{name}.{part}": Entry(None, target) for part, target in parts.items()})
        return cls
    return add


def named(prefix: str) -> dict[str, type]:
    """The classes entered one level below ``prefix`` by their last name, in registration order:
    ``named("objective")`` the objective variants, ``named("task")`` the run kinds' config roots."""
    n = len(prefix) + 1
    return {key[n:]: e.cls for key, e in REGISTRY.items()
            if key.startswith(prefix + ".") and "." not in key[n:] and e.cls is not None}


def resolve(target: str | Callable) -> Callable:
    """A "module:function" string's function, its module imported now (a function: itself)."""
    if isinstance(target, str):
        module, function = target.split(":")
        return getattr(importlib.import_module(module), function)
    return target


def builder(name: str) -> Callable:
    """The builder entered as ``name``, its module imported now."""
    return resolve(REGISTRY[name].build)


def build(section: Any, *args, **kwargs):
    """What the config ``section`` describes, made by its class's builder: ``build(cfg.objective, model)``,
    ``build(cfg.data, "train")``, ``build(cfg.optim, module, "cuda")``."""
    name = getattr(section, "builds", None)
    if name is None:
        raise TypeError(f"{type(section).__name__} has no builder (register one: build='module:function')")
    return builder(name)(section, *args, **kwargs)
