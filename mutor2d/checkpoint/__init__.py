"""Checkpoint files: written atomically, read without running code.

A training checkpoint is one ``torch.save`` dict holding only tensors and plain containers, so it
loads with ``torch.load(weights_only=True)``: a file that holds any other Python object is refused
with a one-line error and never runs. Layout: the key scheme of mutor2d.checkpoint.state, every entry
at the top level:
  model: the model's state dict; objective: state of the objective module (multi-head heads) or {};
  ema: EMA state dict (absent, or None in older files, without EMA); optimizer: state dict keyed by
  parameter names; step: int; rng: one RNG state per process (mutor2d.engine.rng); health: the loss /
  gradient-norm history of recent healthy updates (mutor2d.engine.health); config: the resolved run
  config as a plain dict (its ``task`` first); grid: [H, W] (None for runs without a grid);
  provenance: the writing session's (mutor2d.provenance; None in older files and on other processes).
  sha256: checksum of all the other entries (mutor2d.io.with_checksum), verified at every full read;
  a mismatch makes the file unreadable. Files written before checksums load with a one-time warning.
Files live in ``RUN/checkpoints/step_XXXXXXXX.pt``, or ``step_XXXXXXXX.dcp/`` folders for sharded runs
(mutor2d.checkpoint.sharded: the same keys, weights as DCP entries); the newest readable one is the
resume point. Written and restored by their parts (mutor2d.checkpoint.state.TrainState).
A failed write (disk full, I/O error) raises CheckpointWriteError (an OSError; train.py exits 74,
EX_IOERR) and leaves the earlier checkpoints as they were.
For sharing, ``python -m mutor2d.checkpoint export CKPT OUT.safetensors`` writes the weights (EMA
when present) with the config and grid as safetensors metadata; ``load_model`` reads both kinds, and
hub folders (``mutor2d.hub``: save_pretrained / from_pretrained) whose weights are such an export.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
from pathlib import Path

from .. import config as config_lib
from .. import io
from . import sharded as sharded_checkpoint
from ..cli import HelpFormatter
from ..registry import build
from ..run_configs import DEFAULT_TASK, task_of

_STEP = re.compile(r"step_(\d+)\.(pt|dcp)$")      # .dcp: a sharded checkpoint (folder)


# an unreadable, unsafe or foreign checkpoint; one-line message naming the file
CheckpointError = io.UnsafeFileError


WRITE_FAILED_EXIT = io.WRITE_FAILED_EXIT     # 74, EX_IOERR (sysexits.h)


class Checkpoint(dict):
    """A loaded checkpoint: reading an entry it lacks (``step``, ``rng``, ``optimizer`` of a file
    that passes its checksum but was not written by the trainer) is a one-line CheckpointError naming
    the file and the entry, not a KeyError. ``get`` and ``in`` work as for any dict, and it pickles as
    a plain mapping."""

    def __init__(self, entries: dict, path: str | os.PathLike):
        super().__init__(entries)
        self.path = str(path)

    def __reduce_ex__(self, protocol):
        """Pickled (torch.save of a loaded checkpoint) as an OrderedDict, which weights-only loading
        accepts: the file names no class of this project."""
        return collections.OrderedDict, (), None, None, iter(self.items())

    def __missing__(self, key):
        raise CheckpointError(f"checkpoint {self.path!r} has no {key!r} entry (a training checkpoint holds "
                              f"model, config, step, optimizer and rng): it was not written by the trainer")


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, I/O error); one-line message naming the folder."""


def save_atomic(obj: dict, path: str | os.PathLike) -> Path:
    """torch.save ``obj`` plus its checksum to a temp file in the same folder, fsync, rename over
    ``path``, fsync the folder. CheckpointWriteError if the disk refuses (the temp file is removed)."""
    path = Path(path)
    stored = io.with_checksum(obj)
    try:
        return io.write_atomic(path, lambda f: io.torch_save(stored, f))
    except OSError as e:
        why = "no space left on the device" if io.is_disk_full(e) else f"{e.strerror or e}"
        error = CheckpointWriteError(f"could not write checkpoint {path.name} into {str(path.parent)!r} ({why}); "
                                     f"the earlier checkpoints are kept: free space, then continue with --resume auto")
        error.errno = e.errno
        raise error from None


def checkpoint_path(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:08d}.pt"


def written_checkpoint(run_dir: str | os.PathLike, step: int) -> Path | None:
    """The checkpoint of ``step`` the run folder holds: ``step_N.pt`` or the sharded ``step_N.dcp/``;
    None when it has neither."""
    path = checkpoint_path(run_dir, step)
    return next((p for p in (path, path.with_suffix(sharded_checkpoint.SUFFIX)) if p.exists()), None)


def checkpoint_step(path: str | os.PathLike) -> int:
    """The step in a checkpoint's name (``step_XXXXXXXX.pt`` or ``.dcp``)."""
    m = _STEP.search(Path(path).name)
    if m is None:
        raise ValueError(f"{str(path)!r} is not named like a checkpoint (step_XXXXXXXX.pt or .dcp)")
    return int(m.group(1))


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Checkpoint files of a run, oldest first."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP.search(p.name))]
    return [p for _, p in sorted(found)]


def safe_load(path: str | os.PathLike, what: str = "checkpoint", mmap: bool = False, allow=()):
    """torch.load with weights_only=True (numpy arrays of plain dtypes and ``allow`` permitted: older
    checkpoints pickled their numpy RNG state); any failure is a one-line error naming ``path``."""
    return io.read_torch_file(path, what, allow=allow, mmap=mmap)


def load(path: str | os.PathLike, mmap: bool = False) -> dict:
    """A mutor2d training checkpoint as a dict (see module doc); of a sharded one, its meta
    (mutor2d.checkpoint.sharded: no weights, ``"dcp"`` holds the folder)."""
    if sharded_checkpoint.is_sharded_checkpoint(path):
        meta = sharded_checkpoint.read_meta(path)
        if not mmap:                              # a full read: its files' checksums too
            sharded_checkpoint.verify(Path(path), meta)
        return Checkpoint(meta, path)
    obj = safe_load(path, mmap=mmap)
    if not isinstance(obj, dict) or "model" not in obj or "config" not in obj:
        raise CheckpointError(f"checkpoint {str(path)!r} is not a mutor2d checkpoint (no 'model'/'config')")
    if not mmap and not io.has_checksum(obj):
        io.warn(f"checkpoint {str(path)!r} has no checksum (written before checksums): loaded unverified", once=True)
    return Checkpoint(obj, path)


def remove(path: Path) -> None:
    """Delete a checkpoint file or sharded checkpoint folder."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def is_readable(path: str | os.PathLike) -> bool:
    """Cheap validity check (memory-mapped: tensor data is not read)."""
    try:
        load(path, mmap=True)
        return True
    except (CheckpointError, FileNotFoundError):
        return False


def latest_valid(run_dir: str | os.PathLike) -> Path | None:
    """Newest readable checkpoint of ``run_dir``; None if there is none."""
    return next((p for p in reversed(list_checkpoints(run_dir)) if is_readable(p)), None)


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
            raise FileNotFoundError(f"no readable checkpoint under {str(p)!r}")
        return found
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint {str(p)!r} does not exist{rotation_hint(p)}")
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
    if p.parent.name == "checkpoints":
        return p.parent.parent / what
    return p.parent / f"{p.stem}_{what}"


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


REGISTER_KEY = "register_embedding"      # the GPT's learned register token, in runs that trained registers


def open_model(path: str | os.PathLike, use_ema: bool = True, device="cpu"):
    """The GPT of a checkpoint (or export) for inference, read once -> (model in eval mode, ImageRunConfig,
    meta as in ``read_meta``). ``use_ema`` takes the EMA weights when the checkpoint has them. An
    objective from a plugin this process has not imported is kept as stored (config.UnknownVariant):
    plain decoding never uses it, register drafts say in one line that they need it."""
    state, meta = load_weights(path, use_ema)
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


def check_image_run(path: str | os.PathLike, config) -> None:
    """CheckpointError unless ``config`` (a checkpoint's stored config) is an image GPT's: a
    language-model run keeps its model as Hugging Face files in its run folder, a VQ run is a tokenizer."""
    task = task_of(config) if isinstance(config, dict) else DEFAULT_TASK
    if task == "lm":
        p = Path(path)
        run = p.parent.parent if p.parent.name == "checkpoints" else p if p.is_dir() else p.parent
        raise CheckpointError(f"{str(path)!r} is a language-model run; its model is already saved as "
                              f"{run}/model.safetensors (or {run}/adapter_model.safetensors under LoRA): share "
                              f"that folder")
    if task != DEFAULT_TASK:
        raise CheckpointError(f"{str(path)!r} is a run of task {task!r}, not an image GPT: nothing to export")


def save_safetensors(state: dict, meta: dict, weights: str, out: str | os.PathLike) -> Path:
    """``state`` as a safetensors file whose metadata ``read_meta`` reads back: step, grid, config, provenance of
    ``meta`` (as ``read_meta`` gives them) and which weights they are (``weights``: "ema" or "model").
    Written atomically: a failed write (an OSError) leaves no partial file."""
    from safetensors.torch import save
    info = {"step": str(meta["step"]), "grid": json.dumps(meta["grid"]), "config": json.dumps(meta["config"]),
            "provenance": json.dumps(meta.get("provenance")), "weights": weights, "format": "mutor2d"}
    data = save({k: v.detach().contiguous().cpu() for k, v in state.items()}, metadata=info)
    return io.write_atomic(out, lambda f: f.write(data))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m mutor2d.checkpoint", formatter_class=HelpFormatter,
                                 description="Export a checkpoint's weights as safetensors for sharing.")
    sub = ap.add_subparsers(dest="cmd", required=True, help="what to do (export: one safetensors file)")
    ex = sub.add_parser("export", help="CKPT (file or run folder) -> OUT.safetensors", formatter_class=HelpFormatter,
                        description="Write a checkpoint's weights (EMA when it has them), config, step and grid as "
                                    "one safetensors file.")
    ex.add_argument("ckpt", help="checkpoint file, sharded checkpoint folder or run folder (its newest checkpoint)")
    ex.add_argument("out", help="the .safetensors file to write")
    ex.add_argument("--no-ema", action="store_true", help="export the raw weights even when EMA exists")
    return ap


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    try:
        parts = export_parts(args.ckpt, args.out, use_ema=not args.no_ema)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    with io.exit_on_write_error(args.out):
        out = save_safetensors(*parts, args.out)
    print(f"wrote {out}")

