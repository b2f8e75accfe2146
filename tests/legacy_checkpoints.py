"""Checkpoints as the trainer wrote them before the key scheme of mutor2d.checkpoint.state, made from a
real run's state: the writers of ``mutor2d.engine.hooks.save_checkpoint`` and
``mutor2d.engine.sharding.save_sharded`` as they were (commit 1ee71de), kept here so that tests can
check that such files still resume and sample.

  * ``.pt``: model, ema (None without EMA), objective, optimizer, step, rng, config, grid, health, the
    tensors on the CPU.
  * sharded: DCP entries {"model": the TrainModule's state (``model.*``, ``objective.*``), "optim": the
    optimizer's, "ema"}, and meta.pt with step, rng, config, grid, has_ema, health.
"""
from __future__ import annotations

from pathlib import Path


def write(run, step: int) -> Path | None:
    """Collective: ``run``'s (a built RunState) checkpoint of ``step`` in the old layout, into its run
    folder; its path (None on the other processes of a .pt save)."""
    from accelerate.utils import gather_object
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from mutor2d import checkpoint as ckpt_lib
    from mutor2d.checkpoint import sharded as sharded_checkpoint
    from mutor2d.engine.rng import rng_state
    from mutor2d.engine.sharding import ema_part, is_sharded

    ema = ema_part(run.ema).state_dict() if run.ema is not None else None
    meta = {"step": step, "rng": gather_object([rng_state(run.layout_gen, run.device)]), "config": run.cfg.to_dict(),
            "grid": list(run.grid) if run.grid else None, "health": run.health.state_dict()}
    path = ckpt_lib.checkpoint_path(run.run_dir, step)
    if is_sharded(run.module):
        model, optim = get_state_dict(run.module, run.optimizer.optimizer)
        state = {"model": model, "optim": optim, **({"ema": ema} if ema is not None else {})}
        return sharded_checkpoint.write(path.with_suffix(sharded_checkpoint.SUFFIX), state,
                                        {**meta, "has_ema": ema is not None}, run.main)
    full, optim = get_state_dict(run.module, run.optimizer.optimizer,
                                 options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not run.main:
        return None
    split = {k: {n[len(k) + 1:]: v for n, v in full.items() if n.startswith(k + ".")} for k in ("model", "objective")}
    return ckpt_lib.save_atomic({"model": run.kind.trainable_state(split["model"]), "ema": ema,
                                 "objective": split["objective"], "optimizer": optim, **meta}, path)


def rewritten(cfg, resume: Path, run_dir: Path) -> Path | None:
    """Every process: the run of ``cfg`` restored from checkpoint ``resume``, written in the old layout
    into ``run_dir`` at the same step; as ``write``."""
    from mutor2d.engine.kinds import run_kind
    from mutor2d.engine.setup import build_run
    run = build_run(cfg, run_dir, str(resume), run_kind(cfg.task)())
    return write(run, run.start)
