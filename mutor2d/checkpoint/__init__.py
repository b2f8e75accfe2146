"""Checkpoint files: written atomically, read without running code.

A training checkpoint is one ``torch.save`` dict holding only tensors and plain containers, so it
loads with ``torch.load(weights_only=True)``: a file that holds any other Python object is refused
with a one-line error and never runs. Its entries, all at the top level, are the key scheme of
mutor2d.checkpoint.state, plus ``sha256``: checksum of all the other entries (mutor2d.io.with_checksum),
verified at every full read; a mismatch makes the file unreadable. Files written before checksums
load with a one-time warning.
Files live in ``RUN/checkpoints/step_XXXXXXXX.pt``, or ``step_XXXXXXXX.dcp/`` folders for sharded runs
(mutor2d.checkpoint.sharded: the same keys, weights as DCP entries); the newest readable one is the
resume point. Written and restored by their parts (mutor2d.checkpoint.state.TrainState).
A failed write (disk full, I/O error) raises CheckpointWriteError (an OSError; train.py exits 74,
EX_IOERR) and leaves the earlier checkpoints as they were.
The package's other modules, one job each: locate (a path, run folder or hub folder -> the file to
read; where outputs go), inference (a checkpoint's weights and meta, the model for sampling), export
(weights as safetensors for sharing) and ``python -m mutor2d.checkpoint export`` (__main__); state,
resume, sharded and safe_dcp for training.
"""
from __future__ import annotations

import collections
import os
import re
import shutil
from pathlib import Path

from .. import io
from . import sharded as sharded_checkpoint

_STEP = re.compile(r"step_(\d+)\.(pt|dcp)$")      # .dcp: a sharded checkpoint (folder)
CheckpointError = io.UnsafeFileError              # unreadable, unsafe or foreign; one-line message naming the file
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
    try:
        return io.write_atomic(path, lambda f: io.torch_save(io.with_checksum(obj), f))
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


def load(path: str | os.PathLike, mmap: bool = False) -> dict:
    """A mutor2d training checkpoint as a dict (see module doc); of a sharded one, its meta
    (mutor2d.checkpoint.sharded: no weights, ``"dcp"`` holds the folder)."""
    if sharded_checkpoint.is_sharded_checkpoint(path):
        meta = sharded_checkpoint.read_meta(path)
        if not mmap:                              # a full read: its files' checksums too
            sharded_checkpoint.verify(Path(path), meta)
        return Checkpoint(meta, path)
    obj = io.read_torch_file(path, "checkpoint", mmap=mmap)     # numpy arrays allowed: older RNG states
    if not isinstance(obj, dict) or "model" not in obj or "config" not in obj:
        raise CheckpointError(f"checkpoint {str(path)!r} is not a mutor2d checkpoint (no 'model'/'config')")
    if not mmap and not io.has_checksum(obj):
        io.warn(f"checkpoint {str(path)!r} has no checksum (written before checksums): loaded unverified", once=True)
    return Checkpoint(obj, path)


def remove(path: Path) -> None:
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
