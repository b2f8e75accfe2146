"""Where a checkpoint is: a checkpoint file, a run folder (its newest readable checkpoint) or a hub
folder written by ``mutor2d.hub`` (its model.safetensors, an export) -> the one path to read; and
where outputs made from it go by default."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .. import io
from . import latest_valid
from . import sharded as sharded_checkpoint


HUB_WEIGHTS = "model.safetensors"      # the weights of a hub folder (mutor2d.hub)


def is_hub_folder(path: str | os.PathLike) -> bool:
    """A folder written by ``mutor2d.hub`` (save_pretrained): config.json with format mutor2d, and its weights."""
    p = Path(path)
    if not (p / "config.json").is_file() or not (p / HUB_WEIGHTS).is_file():
        return False
    try:
        return json.loads((p / "config.json").read_text()).get("format") == "mutor2d"
    except (OSError, ValueError, AttributeError):
        return False


def resolve(path: str | os.PathLike) -> Path:
    """A checkpoint file, a run folder (its newest readable checkpoint), or a hub folder written by
    ``mutor2d.hub`` (``save_pretrained``: its model.safetensors, an export)."""
    p = Path(path)
    if sharded_checkpoint.is_sharded_checkpoint(p):
        return p
    if is_hub_folder(p):
        return io.verified_weights(p / HUB_WEIGHTS, p / "config.json")
    if p.is_dir():
        found = latest_valid(p)
        if found is None:
            raise FileNotFoundError(f"no readable checkpoint under {io.shown_path(p)}")
        return found
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint {io.shown_path(p)} does not exist{rotation_hint(p)}")
    return p


def rotation_hint(p: Path) -> str:
    """What to say of a missing step checkpoint whose run folder holds others: rotation removed it
    (train.keep_ckpts), and which remain."""
    folder = p.parent
    if folder.name != "checkpoints" or not folder.is_dir():
        return ""
    kept = sorted(q.name for q in folder.iterdir() if q.name.startswith("step_") and q.suffix in (".pt", ".dcp"))
    if not kept:
        return ""
    shown = ", ".join(kept[-3:]) + (f" and {len(kept) - 3} older" if len(kept) > 3 else "")
    return (f" (a run keeps only its newest train.keep_ckpts checkpoints, and train.keep_every's multiples; "
            f"{str(folder)!r} holds {shown})")


def output_dir(path: str | os.PathLike, what: str = "samples") -> Path:
    """Where outputs made from checkpoint ``path`` (a resolved file or sharded folder) go by default:
    RUN/<what>/ for a checkpoint of a run folder (RUN/checkpoints/...), else <dir>/<stem>_<what>/
    beside it (an export, a hub folder's weights, a copied .pt), never the current folder."""
    p = Path(path)
    return p.parent.parent / what if p.parent.name == "checkpoints" else p.parent / f"{p.stem}_{what}"
