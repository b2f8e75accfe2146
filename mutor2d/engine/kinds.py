"""The run kinds the engine trains, in one registry keyed by the config's ``task``.

A kind supplies its parts (mutor2d.engine.setup.RunKind) and registers them with
``@register_run_kind(TASK)``; the config of a run with that task is its package's config root
(mutor2d.run_configs.register_run_config). A kind of mutor2d is the package ``mutor2d.TASK`` whose ``run``
module registers its parts; a plugin's registers itself when MUTOR2D_PLUGINS imports it. The engine
imports no kind: it finds the parts of ``cfg.task`` here.
"""
from __future__ import annotations

import importlib

from ..checks import ConfigError
from ..registry import registered
from ..run_configs import known_tasks

RUN_KINDS: dict[str, type] = {}


def register_run_kind(task: str):
    """Class decorator: make a class the engine's parts for runs with ``task: TASK``."""
    return registered(RUN_KINDS, task, "name")


def run_kind(task: str) -> type:
    """The parts class of ``task`` (its package's ``run`` module is imported on first use)."""
    if task not in RUN_KINDS and task.isidentifier():
        package = f"{__package__.rsplit('.', 1)[0]}.{task}"      # mutor2d.TASK
        try:
            importlib.import_module(f"{package}.run")
        except ModuleNotFoundError as e:
            if not (e.name or "").endswith(f".{task}.run") and e.name != package:
                raise
    if task not in RUN_KINDS:
        raise ConfigError(f"task: expected a run kind with engine parts, one of {known_tasks()}, got {task!r}")
    return RUN_KINDS[task]
