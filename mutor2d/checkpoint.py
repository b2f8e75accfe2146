"""Checkpoint files: one ``torch.save`` dict per checkpoint, written atomically.

Layout of a checkpoint dict:
  model: GPT state dict; ema: EMA state dict or None; objective: state of the objective module
  (multihead heads) or {}; optimizer, scheduler: state dicts; step: int; rng: RNG states;
  config: the resolved RunConfig as a plain dict.
Files live in ``RUN_DIR/checkpoints/step_XXXXXXXX.pt``; the newest valid one is the resume point.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import torch

from . import config as config_lib
from .model import GPT
from .registers import RegisterSpec

_STEP = re.compile(r"step_(\d+)\.pt$")


def save_atomic(obj, path: str | os.PathLike) -> Path:
    """torch.save to a temp file in the same folder, fsync, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def checkpoint_path(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:08d}.pt"


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Checkpoint files of a run, oldest first."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP.search(p.name))]
    return [p for _, p in sorted(found)]


def load(path: str | os.PathLike, map_location="cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:  # truncated or foreign file
        raise ValueError(f"checkpoint {str(path)!r} is unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict) or "model" not in obj or "config" not in obj:
        raise ValueError(f"checkpoint {str(path)!r} is not a mutor2d checkpoint (no 'model'/'config')")
    return obj


def latest_valid(run_dir: str | os.PathLike) -> Path | None:
    """Newest checkpoint of ``run_dir`` that loads; None if there is none."""
    for p in reversed(list_checkpoints(run_dir)):
        try:
            load(p)
            return p
        except ValueError:
            continue
    return None


def resolve(path: str | os.PathLike) -> Path:
    """A checkpoint file, or a run folder (its newest valid checkpoint)."""
    p = Path(path)
    if p.is_dir():
        found = latest_valid(p)
        if found is None:
            raise FileNotFoundError(f"no valid checkpoint under {str(p)!r}")
        return found
    return p


def load_model(path: str | os.PathLike, use_ema: bool = True, device="cpu"):
    """Build the GPT of a checkpoint for inference -> (model in eval mode, RunConfig, step).
    ``use_ema`` takes the EMA weights when the checkpoint has them."""
    ckpt = load(resolve(path))
    cfg = config_lib.from_dict(ckpt["config"])
    spec = RegisterSpec.from_config(cfg.objective)
    model = GPT(cfg.model, register_token=spec.uses_registers)
    state = ckpt["ema"] if use_ema and ckpt.get("ema") is not None else ckpt["model"]
    model.load_state_dict(state, strict=True)
    return model.to(device).eval(), cfg, int(ckpt["step"])
