"""Sharded checkpoints: ``RUN/checkpoints/step_XXXXXXXX.dcp/``, written by torch.distributed.checkpoint.

Layout (the key scheme of mutor2d.checkpoint.state): the DCP files of the weights (model, objective,
ema when kept, optimizer), plus ``meta.pt`` written by the main process: the other entries and has_ema
(tensors and plain values: it loads with ``weights_only=True``).

Rules:
  * Every process writes its own shards into ``.step_XXXXXXXX.dcp.tmp/``; once all are done the main
    process adds meta.pt and renames the folder: a reader never sees a half-written checkpoint.
  * DCP reshards on load: a checkpoint loads into any process count, sharded (FSDP2 DTensors) or not
    (DDP, one process), and into one process without a process group (export, sampling).
  * Verified like every checkpoint: meta.pt holds the SHA-256 of each file DCP wrote
    (``files_sha256``), checked before the tensors are read; a mismatch is "unreadable" (named and set
    aside by ``--resume auto``, a one-line error elsewhere). meta.pt itself carries io's checksum.
  * A folder written before that scheme (the TrainModule's state under "model": ``model.model.*``,
    ``model.objective.*``; the optimizer's under "optim") is refused in one line naming the change.
  * Nothing in the folder runs code: meta.pt loads with ``weights_only=True``; the rest is read through
    mutor2d.checkpoint.safe_dcp. The checksums guard against corruption, not against a stranger, who
    writes meta.pt too: a crafted folder is refused by those readers, named like an unreadable one.
"""
from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

from .. import io

SUFFIX = ".dcp"
META = "meta.pt"


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    return Path(path).suffix == SUFFIX and Path(path).is_dir()


def remove_stale_temps(folder: Path) -> list[Path]:
    """Delete ``.step_*.dcp.tmp/`` folders left by a save that was killed mid-write."""
    removed = [p for p in Path(folder).glob(f".*{SUFFIX}{io.TEMP_SUFFIX}") if p.is_dir()]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def read_meta(path: str | os.PathLike) -> dict:
    """meta.pt of a sharded checkpoint (with ``"dcp": path``); CheckpointError when it is not one."""
    from . import safe_dcp             # imports DCP (about a second): only when a sharded checkpoint is read
    path = Path(path)
    safe_dcp.read_metadata(path)
    meta = io.read_torch_file(path / META, "checkpoint")
    if not isinstance(meta, dict) or "config" not in meta or "step" not in meta:
        raise io.UnsafeFileError(f"checkpoint {str(path)!r}: {META} is not a mutor2d checkpoint's")
    return {**meta, "dcp": str(path)}


def write(final: Path, state: dict, meta: dict, main: bool) -> Path:
    """Collective: each process saves its part of ``state`` into the temp folder; the main process
    adds ``meta`` and publishes the folder as ``final``. Every process returns once it is published."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    tmp = final.with_name(f".{final.name}{io.TEMP_SUFFIX}")
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save(state, checkpoint_id=tmp)        # returns on the main process after every rank has written
    if main:
        meta = {**meta, "files_sha256": files_sha256(tmp)}
        io.write_atomic(tmp / META, lambda f: torch.save(io.with_checksum(meta), f))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        io._fsync_folder(final.parent)
    dist.barrier()
    return final


def files_sha256(folder: Path) -> dict[str, str]:
    """SHA-256 of every file DCP wrote into ``folder`` (meta.pt aside)."""
    return {f.name: io.file_sha256(f) for f in sorted(Path(folder).iterdir()) if f.is_file() and f.name != META}


def verify(path: Path, meta: dict | None = None):
    """The checked DCP metadata of the checkpoint (``metadata``); CheckpointError when a file differs
    from the SHA-256 meta.pt recorded at save (checkpoints written before file checksums skip this), or
    when a stored value is not plain data. ``meta``: its meta.pt as ``read_meta`` gave it, if read."""
    from . import safe_dcp
    expected = (meta if meta is not None else read_meta(path)).get("files_sha256")
    if expected is not None and files_sha256(path) != expected:
        raise io.UnsafeFileError(f"checkpoint {str(path)!r}: its files do not match the checksum stored at save "
                                 f"(corrupt or changed since)")
    checked = metadata(path)
    safe_dcp.check_entries(path, checked)
    return checked


def metadata(path: Path):
    """The checked DCP metadata of the checkpoint (mutor2d.checkpoint.safe_dcp); one written under the
    key scheme before mutor2d.checkpoint.state's (``optim.*`` entries) is an UnsafeFileError."""
    from . import safe_dcp
    checked = safe_dcp.read_metadata(path)
    if any(k.startswith("optim.") for k in checked.state_dict_metadata):
        raise io.UnsafeFileError(f"checkpoint {str(path)!r} was written by an older version (entries model.model.*, "
                                 f"optim.*; now model.*, objective.*, optimizer.*): this version does not read it")
    return checked


def stored_parts(path: str | os.PathLike) -> set[str]:
    """The parts (mutor2d.checkpoint.state's names) the checkpoint holds entries of."""
    return {k.split(".", 1)[0] for k in metadata(Path(path)).state_dict_metadata}


def load(path: str | os.PathLike, state: dict, verified: bool = False) -> None:
    """Fill the tensors of ``state`` (nested by part as mutor2d.checkpoint.state names them; DTensors or
    plain tensors) from the checkpoint, after checking its files (checksums, plain stored values) unless
    the caller has (``verified``); DCP reads through mutor2d.checkpoint.safe_dcp either way."""
    path = Path(path)
    _read(path, state, metadata(path) if verified else verify(path))


def _read(path: Path, state: dict, checked) -> None:
    """``state``'s tensors from the checkpoint whose checked DCP metadata is ``checked``."""
    from . import safe_dcp
    with warnings.catch_warnings():   # "assuming the intent is to load in a single process": without a group, it is
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        safe_dcp.load(path, state, checked)


def read_weights(path: str | os.PathLike, use_ema: bool = True) -> tuple[dict, dict]:
    """(full GPT state dict on the CPU, meta) of a sharded checkpoint, in this process alone: the EMA
    weights when kept and ``use_ema``, else the model's."""
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = Path(path)
    meta = read_meta(path)
    checked = verify(path, meta)
    part = "ema" if use_ema and meta["has_ema"] else "model"
    weights = {k[len(part) + 1:]: torch.empty(m.size, dtype=m.properties.dtype)
               for k, m in checked.state_dict_metadata.items()
               if k.startswith(f"{part}.") and isinstance(m, TensorStorageMetadata)}
    _read(path, {part: weights}, checked)
    return weights, meta
