"""A checkpoint's weights and meta for inference, from a training checkpoint (.pt or sharded), a
safetensors export or a hub folder (all through ``locate.resolve``): ``read_meta`` without weights,
``load_weights`` the state dict, ``open_model`` / ``load_model`` the GPT in eval mode."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .. import config as config_lib
from .. import io
from ..registry import build
from ..run_configs import DEFAULT_TASK, task_of
from . import CheckpointError, load
from . import sharded as sharded_checkpoint
from .locate import resolve


def read_meta(path: str | os.PathLike) -> dict:
    """{"step", "grid", "has_ema", "config", "provenance"} of a checkpoint or safetensors export, without reading weights."""
    path = resolve(path)
    if path.suffix == ".safetensors":
        meta = io.read_safetensors(path, "checkpoint", tensors=False)[1]
        return {"step": int(meta.get("step", 0)), "grid": json.loads(meta.get("grid", "null")),
                "has_ema": meta.get("weights") == "ema", "config": json.loads(meta.get("config", "{}")),
                "provenance": json.loads(meta.get("provenance", "null"))}
    return _meta_of(load(path, mmap=True))


def _meta_of(ckpt: dict) -> dict:
    has_ema = ckpt["has_ema"] if "has_ema" in ckpt else ckpt.get("ema") is not None
    return {"step": int(ckpt["step"]), "grid": ckpt.get("grid"), "has_ema": has_ema,
            "config": ckpt["config"], "provenance": ckpt.get("provenance")}


def load_weights(path: str | os.PathLike, use_ema: bool = True) -> tuple[dict, dict]:
    """(GPT state dict, meta) of a mutor2d checkpoint or safetensors export."""
    path = resolve(path)
    if path.suffix == ".safetensors":
        return io.read_safetensors(path, "checkpoint")[0], read_meta(path)
    if sharded_checkpoint.is_sharded_checkpoint(path):
        weights, ckpt = sharded_checkpoint.read_weights(path, use_ema)
        return weights, _meta_of(ckpt)
    ckpt = load(path)
    meta = _meta_of(ckpt)
    return (ckpt["ema"] if use_ema and meta["has_ema"] else ckpt["model"]), meta


def check_image_run(path: str | os.PathLike, config) -> None:
    """CheckpointError unless ``config`` (a checkpoint's stored config) is an image GPT's: a
    language-model run keeps its model as Hugging Face files in its run folder, a VQ run is a tokenizer."""
    task = task_of(config) if isinstance(config, dict) else DEFAULT_TASK
    if task == "lm":
        p = Path(path)
        run = p.parent.parent if p.parent.name == "checkpoints" else p if p.is_dir() else p.parent
        raise CheckpointError(f"{str(path)!r} is a language-model run; its model is saved as "
                              f"{run}/model.safetensors (or {run}/adapter_model.safetensors under LoRA): use "
                              f"that folder")
    if task != DEFAULT_TASK:
        raise CheckpointError(f"checkpoint {str(path)!r} is a {task} run's (task: {task}); expected an image "
                              f"model's (train.py with an image config)")


REGISTER_KEY = "register_embedding"      # the GPT's learned register token, in runs that trained registers


def open_model(path: str | os.PathLike, use_ema: bool = True, device="cpu"):
    """The GPT of a checkpoint (or export) for inference, read once -> (model in eval mode, ImageRunConfig,
    meta as in ``read_meta``). ``use_ema`` takes the EMA weights when the checkpoint has them. An
    objective from a plugin this process has not imported is kept as stored (config.UnknownVariant):
    plain decoding never uses it, register drafts say in one line that they need it."""
    state, meta = load_weights(path, use_ema)
    check_image_run(path, meta["config"])
    cfg = config_lib.from_dict(meta["config"], lenient=("objective",))
    known = not isinstance(cfg.objective, config_lib.UnknownVariant)
    model = build(cfg.model, register_token=cfg.objective.uses_registers() if known else REGISTER_KEY in state)
    io.check_shapes(model.state_dict(), state, repr(str(path)))
    io.check_finite(state, f"checkpoint {str(path)!r}")
    model.load_state_dict(state, strict=True)
    return model.to(device).eval(), cfg, meta


def load_model(path: str | os.PathLike, use_ema: bool = True, device="cpu"):
    """(model in eval mode, ImageRunConfig, step) of a checkpoint or export; see ``open_model``."""
    model, cfg, meta = open_model(path, use_ema, device)
    return model, cfg, meta["step"]
