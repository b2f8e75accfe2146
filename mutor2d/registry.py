"""Registries: their one decorator shape (``registered``), and named builders.

What a config section describes is made by a function registered under the section's name ("model",
"objective.mutor-2d") as a "module:function" string and imported on first use: a config module names
its builders and imports no implementation (no torch: mutor2d.config);
the implementation imports its config, so imports run one way. ``build(cfg.objective, model)`` calls
the builder of the section's class (a subclass without its own builds as its parent)."""
from __future__ import annotations

import importlib
from typing import Any, Callable


def registered(registry: dict, key: str, attr: str | None = None):
    """Class decorator: put the class into ``registry[key]`` (and set its ``attr`` to ``key``); the
    one shape of every registry's decorator."""
    def add(cls):
        if attr:
            setattr(cls, attr, key)
        registry[key] = cls
        return cls
    return add


BUILDERS: dict[str, str | Callable] = {}   # name -> "module:function", or a function (a plugin's may be either)


def builds(name: str, build: str | Callable | None, **parts: str | Callable):
    """Class decorator: make ``build`` the builder of the class (and its subclasses) under ``name``, and
    each of ``parts`` the builder of that part under NAME.PART (a dataset's ``tokenizer``)."""
    def add(cls):
        if build is not None:
            BUILDERS[name] = build
            cls.builds = name
        BUILDERS.update({f"{name}.{part}": target for part, target in parts.items()})
        return cls
    return add


def resolve(target: str | Callable) -> Callable:
    """A "module:function" string's function, its module imported now (a function: itself)."""
    if isinstance(target, str):
        module, function = target.split(":")
        return getattr(importlib.import_module(module), function)
    return target


def builder(name: str) -> Callable:
    """The builder registered as ``name``, its module imported now."""
    return resolve(BUILDERS[name])


def build(section: Any, *args, **kwargs):
    """What the config ``section`` describes, made by its class's builder: ``build(cfg.objective, model)``,
    ``build(cfg.data, "train")``, ``build(cfg.optim, module, "cuda")``."""
    name = getattr(section, "builds", None)
    if name is None:
        raise TypeError(f"{type(section).__name__} has no builder (register one: build='module:function')")
    return builder(name)(section, *args, **kwargs)
