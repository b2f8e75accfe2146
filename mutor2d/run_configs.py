"""Run kinds by ``task:``: the registry of config roots (``@register_run_config``), each naming the
engine's parts that train it (``kind``, a builder of mutor2d.registry), and finding the root and the
parts of a config's task (a kind of mutor2d is the package ``mutor2d.TASK``; a plugin's registers itself)."""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable

from .checks import ConfigError
from .registry import builder, named, register

DEFAULT_TASK = "image"                                       # a config without ``task:``


def register_run_config(task: str, kind: str | Callable):
    """Class decorator: make a :class:`ConfigRoot` dataclass the config of runs with ``task: TASK``,
    trained with the parts ``kind`` (mutor2d.engine.setup.RunKind: a class, or "module:Class" imported
    on first use, so that the config module imports no implementation)."""
    return register(f"task.{task}", kind, "task")


def run_kind(task: str) -> type:
    """The engine's parts class of ``task``: what its config root names (the engine imports no kind)."""
    run_config_class(task)
    return builder(f"task.{task}")


def task_of(data: dict) -> str:
    return data.get("task", DEFAULT_TASK)


def run_config_class(task: Any) -> type:
    """The config root of ``task``; a kind of mutor2d is the package ``mutor2d.TASK`` (its ``config``
    module registers it: ``known_tasks``), a plugin's registers itself when MUTOR2D_PLUGINS imports it."""
    from .plugins import load_plugins
    load_plugins()
    if isinstance(task, str) and task not in named("task") and task in known_tasks():
        importlib.import_module(f"{__package__}.{task}.config")
    if not isinstance(task, str) or task not in named("task"):
        raise ConfigError(f"task: expected a run kind, one of {known_tasks()}, got {task!r}")
    return named("task")[task]


def known_tasks() -> list[str]:
    """Every task this install knows: the registered ones and the run-kind packages of mutor2d, those
    with a ``config`` module (the root) and a ``run`` module (the engine's parts; other packages'
    ``config`` modules hold sections)."""
    import pkgutil
    here = Path(__file__).parent
    found = {m.name for m in pkgutil.iter_modules([str(here)])
             if m.ispkg and all((here / m.name / f"{part}.py").exists() for part in ("config", "run"))}
    return sorted(found | set(named("task")))
