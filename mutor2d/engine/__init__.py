"""Training engine, one for every run kind: ``setup`` builds a run from its config and its kind's
parts (``kinds``: the registry by ``task``), ``loop`` runs its steps, ``hooks`` do the periodic jobs
every kind has (log, checkpoints; a kind adds its own), ``health`` judges each update, ``sharding``
wraps FSDP2, ``data_order`` and ``rng`` make a run reproducible on any process count. Where a run
resumes from and which checkpoints it keeps: mutor2d.checkpoint.resume. The engine imports no kind.
``config`` (the optim and train sections) and ``entry`` (an entry script's exit on a run-ending error)
import no torch, nor does this package: a config is checked and its errors reported before torch is
imported."""
from __future__ import annotations

from pathlib import Path


def default_run_dir(config_name) -> Path:
    """runs/<config file stem> (runs/default without a config)."""
    return Path("runs") / (Path(str(config_name)).stem if config_name else "default")
