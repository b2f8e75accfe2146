"""A checkpoint's weights as one safetensors file for sharing (EMA when present), with the config,
step, grid and provenance as metadata that ``inference.read_meta`` reads back. Only an image GPT's run
exports: a language-model run already keeps Hugging Face files, a VQ run is a tokenizer."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .. import io
from . import CheckpointError
from .inference import check_image_run, load_weights, read_meta


def export_safetensors(path: str | os.PathLike, out: str | os.PathLike, use_ema: bool = True) -> Path:
    """Write a checkpoint's weights (EMA when present and ``use_ema``) as safetensors, config in the metadata."""
    return save_safetensors(*export_parts(path, out, use_ema), out)


def export_parts(path: str | os.PathLike, out: str | os.PathLike, use_ema: bool = True) -> tuple[dict, dict, str]:
    """(weights, meta, "ema" or "model") that ``export_safetensors`` writes to ``out``; refused in one
    line: an output path that is a folder, a checkpoint of another kind of run than an image GPT's."""
    if Path(out).is_dir():
        raise CheckpointError(f"{str(out)!r} is a folder; expected the path of the .safetensors file to write")
    check_image_run(path, read_meta(path)["config"])
    state, meta = load_weights(path, use_ema)
    return state, meta, "ema" if use_ema and meta["has_ema"] else "model"


def save_safetensors(state: dict, meta: dict, weights: str, out: str | os.PathLike) -> Path:
    """``state`` as a safetensors file whose metadata ``read_meta`` reads back: step, grid, config, provenance of
    ``meta`` (as ``read_meta`` gives them) and which weights they are (``weights``: "ema" or "model").
    Written atomically: a failed write (an OSError) leaves no partial file."""
    from safetensors.torch import save
    info = {"step": str(meta["step"]), "grid": json.dumps(meta["grid"]), "config": json.dumps(meta["config"]),
            "provenance": json.dumps(meta.get("provenance")), "weights": weights, "format": "mutor2d"}
    data = save({k: v.detach().contiguous().cpu() for k, v in state.items()}, metadata=info)
    return io.write_atomic(out, lambda f: f.write(data))
