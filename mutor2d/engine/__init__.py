"""Training engine, one for every run kind: ``setup`` builds a run from its config and its kind's
parts (``kinds``: the registry by ``task``), ``loop`` runs its steps, ``hooks`` do the periodic jobs
every kind has (log, checkpoints; a kind adds its own), ``health`` judges each update, ``sharding``
wraps FSDP2, ``data_order`` and ``rng`` make a run reproducible on any process count. Where a run
resumes from and which checkpoints it keeps: mutor2d.checkpoint.resume. The engine imports no kind.
``config`` (the optim and train sections) and ``entry`` (an entry script's exit on a run-ending error)
import no torch, nor does this package until a name of EXPORTS is used: a config is checked and its
errors reported before torch is imported."""
from __future__ import annotations

import importlib
from pathlib import Path

from ..preempt import PREEMPTED_EXIT, Preempted

EXPORTS = {"read_log": "runlog", "read_skips": "runlog", "train": "loop", "exit_code": "entry", "run_entry": "entry", "Diverged": "entry",
           "param_groups": "optim", "StepBatches": "data_order"}
__all__ = [*EXPORTS, "PREEMPTED_EXIT", "Preempted", "default_run_dir"]


def __getattr__(name: str):
    """The names of EXPORTS, imported from their module on first use."""
    if name not in EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{EXPORTS[name]}"), name)


def default_run_dir(config_name) -> Path:
    """runs/<config file stem> (runs/default without a config)."""
    stem = Path(str(config_name)).stem if config_name else "default"
    return Path("runs") / stem
