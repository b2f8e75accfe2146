"""Training engine: ``setup`` builds a run from its config, ``loop`` runs its steps, ``hooks`` do the
periodic jobs (log, checkpoints, sample grids, online evaluation), ``checkpointer`` finds the resume
point and rotates files, ``data_order`` and ``rng`` make a run reproducible on any process count."""
from pathlib import Path

from .hooks import read_log
from .loop import PREEMPTED_EXIT, Diverged, Preempted, exit_code, run_entry, train
from .optim import param_groups
from ..image.run import TrainModule
from .data_order import StepBatches

__all__ = ["train", "exit_code", "run_entry", "read_log", "Preempted", "Diverged", "PREEMPTED_EXIT", "TrainModule", "param_groups",
           "StepBatches", "default_run_dir"]


def default_run_dir(config_name) -> Path:
    """runs/<config file stem> (runs/default without a config)."""
    stem = Path(str(config_name)).stem if config_name else "default"
    return Path("runs") / stem
