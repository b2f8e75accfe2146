"""Training engine, one for every run kind: ``setup`` builds a run from its config and its kind's
parts (``kinds``: the registry by ``task``), ``loop`` runs its steps, ``hooks`` do the periodic jobs
every kind has (log, checkpoints; a kind adds its own), ``health`` judges each update, ``sharding``
wraps FSDP2, ``data_order`` and ``rng`` make a run reproducible on any process count. Where a run
resumes from and which checkpoints it keeps: mutor2d.checkpoint.resume. The engine imports no kind."""
from pathlib import Path

from .hooks import read_log
from .loop import PREEMPTED_EXIT, Diverged, Preempted, exit_code, run_entry, train
from .optim import param_groups
from .data_order import StepBatches

__all__ = ["train", "exit_code", "run_entry", "read_log", "Preempted", "Diverged", "PREEMPTED_EXIT", "param_groups",
           "StepBatches", "default_run_dir"]


def default_run_dir(config_name) -> Path:
    """runs/<config file stem> (runs/default without a config)."""
    stem = Path(str(config_name)).stem if config_name else "default"
    return Path("runs") / stem
