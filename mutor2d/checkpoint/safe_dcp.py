"""Reading torch.distributed.checkpoint (DCP) folders without running code that a stranger wrote.

DCP's own reader unpickles ``.metadata`` with a plain ``pickle.load``, and the non-tensor entries of a
state (the optimizer's ``lr``, ``betas``, ...) with ``torch.load(weights_only=False)``: a crafted folder
runs whatever its pickles name. Here, rules:

  * ``.metadata`` is read by :class:`MetadataUnpickler`, which resolves only the names in
    :data:`ALLOWED` (DCP's metadata dataclasses, ``torch.Size``, torch's dtypes and layouts, a path
    class): the ones torch writes for every state of this project (model, objective, EMA, optimizer;
    sharded and replicated; tested). Any other name is refused before anything is built from the
    file, with one line naming the file and the class. Constructing an allowed class runs no code
    of the file's choosing (dataclass fields, a tuple, a path).
  * The result must have DCP's shape: a ``Metadata`` whose storage entries are plain file names inside
    the folder at non-negative offsets, with no stream transforms (this project writes none).
  * Every stored value (one torch file per entry, inside the storage files) names no callable beyond
    torch's weights-only set (:func:`check_entries`, read from the pickles' opcodes, nothing run):
    part of a sharded checkpoint's full verification, so ``--resume auto`` sets a crafted one aside.
  * ``dcp.load`` is handed :class:`CheckedReader`, which returns that checked object instead of reading
    ``.metadata`` again, and :class:`PlainLoadPlanner`, which reads non-tensor entries with
    ``weights_only=True``; tensor entries DCP itself reads with ``weights_only=True``. A refusal raised
    inside ``dcp.load`` comes back as the one-line error, not DCP's wrapped report.
"""
from __future__ import annotations

import pickle
import re
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _create_file_view, _StorageInfo

from ..io import UnsafeFileError

METADATA_FILE = ".metadata"
_DCP_CLASSES = ("Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
                "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")
ALLOWED = {("torch.distributed.checkpoint.metadata", name) for name in _DCP_CLASSES} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),      # looks a layout up by its name in torch's namespace
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),   # checkpoint_id
}
_PLAIN_FILE = re.compile(r"[A-Za-z0-9_][\w.-]*")


def _is_torch_dtype(module: str, name: str) -> bool:
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`ALLOWED` names and torch dtypes (``torch.float32``, ...)."""

    def __init__(self, file, where: str):
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str):
        if (module, name) in ALLOWED or _is_torch_dtype(module, name):
            return super().find_class(module, name)
        raise UnsafeFileError(f"checkpoint {self.where!r} refused: its pickle names {module}.{name}, which is not "
                              f"one of DCP's metadata classes (it could run code); nothing was run")

    def persistent_load(self, pid):
        raise UnsafeFileError(f"checkpoint {self.where!r} refused: its pickle asks for a persistent object "
                              f"({str(pid)[:60]}), which DCP metadata never holds; nothing was run")


def read_metadata(folder: str | Path) -> dcp_metadata.Metadata:
    """The checked DCP metadata of ``folder`` (rules above); UnsafeFileError (one line) otherwise."""
    path = Path(folder) / METADATA_FILE
    where = str(path)
    if not path.is_file():
        raise UnsafeFileError(f"checkpoint {str(folder)!r} is not a finished sharded checkpoint (no {METADATA_FILE})")
    try:
        with open(path, "rb") as f:
            found = MetadataUnpickler(f, where).load()
    except UnsafeFileError:
        raise
    except Exception as e:                      # not a pickle, cut short, or wrong arguments to a class
        first = " ".join(str(e).split())[:160]
        raise UnsafeFileError(f"checkpoint {where!r} is not a DCP metadata file ({type(e).__name__}: {first})") from None
    check_shape(found, Path(folder), where)
    return found


def check_shape(found, folder: Path, where: str) -> None:
    """UnsafeFileError unless ``found`` is a Metadata whose storage entries name plain files of
    ``folder`` at non-negative offsets, without stream transforms."""
    def refuse(what: str):
        raise UnsafeFileError(f"checkpoint {where!r} refused: {what}")
    if type(found) is not dcp_metadata.Metadata:
        refuse(f"it holds a {type(found).__name__}, expected DCP's Metadata")
    if not isinstance(found.state_dict_metadata, dict) or not isinstance(found.storage_data, dict):
        refuse("its state_dict_metadata and storage_data are not dicts")
    for key, entry in found.state_dict_metadata.items():
        if not isinstance(key, str) or type(entry) not in (dcp_metadata.TensorStorageMetadata,
                                                            dcp_metadata.BytesStorageMetadata):
            refuse(f"entry {str(key)[:80]!r} is a {type(entry).__name__}, expected a storage entry")
    for index, info in found.storage_data.items():
        if type(index) is not dcp_metadata.MetadataIndex or type(info) is not _StorageInfo:
            refuse(f"a storage entry is a {type(info).__name__}, expected DCP's _StorageInfo")
        name = info.relative_path
        if not isinstance(name, str) or not _PLAIN_FILE.fullmatch(name) or not (folder / name).is_file():
            refuse(f"entry {index.fqn!r} points at {str(name)[:80]!r}, expected a file inside the folder")
        if not all(isinstance(v, int) and v >= 0 for v in (info.offset, info.length)):
            refuse(f"entry {index.fqn!r} has offset {info.offset!r} and length {info.length!r}, "
                   f"expected non-negative integers")
        if info.transform_descriptors:
            refuse(f"entry {index.fqn!r} asks for stream transforms {info.transform_descriptors!r}, "
                   f"which this project never writes")


def check_entries(folder: str | Path, checked: dcp_metadata.Metadata) -> None:
    """UnsafeFileError unless every stored value of ``folder`` is a torch file whose pickle names only
    what ``torch.load(weights_only=True)`` allows (opcodes read; no tensor data, nothing run)."""
    for index, info in checked.storage_data.items():
        with open(Path(folder) / info.relative_path, "rb") as f:
            view = _create_file_view(f, info.offset, info.length)
            if not _is_zip(view):
                raise UnsafeFileError(f"checkpoint {str(folder)!r} is unreadable: entry {index.fqn!r} is not a torch file")
            try:
                names = torch.serialization.get_unsafe_globals_in_checkpoint(view)
            except Exception as e:
                raise UnsafeFileError(f"checkpoint {str(folder)!r} is unreadable: entry {index.fqn!r} "
                                      f"({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None
        if names:
            raise UnsafeFileError(f"checkpoint {str(folder)!r} refused: its entry {index.fqn!r} calls "
                                  f"{', '.join(names[:4])}, which could run code; nothing was run")


class CheckedReader(FileSystemReader):
    """DCP's file reader over a folder whose metadata was already read by :func:`read_metadata`."""

    def __init__(self, folder: str | Path, checked: dcp_metadata.Metadata):
        super().__init__(str(folder))
        self.checked = checked

    def read_metadata(self, *args, **kwargs) -> dcp_metadata.Metadata:
        if self.checked.storage_meta is None:
            self.checked.storage_meta = dcp_metadata.StorageMeta()
        self.checked.storage_meta.load_id = self.load_id
        return self.checked


class PlainLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor entries with ``torch.load(weights_only=True)``."""

    def __init__(self, folder: str | Path):
        super().__init__()
        self.folder = str(folder)

    def load_bytes(self, read_item, value) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, map_location="cpu", weights_only=True)
        except Exception as e:
            value.seek(0)
            names = torch.serialization.get_unsafe_globals_in_checkpoint(value) if _is_zip(value) else []
            what = f"calls {', '.join(names[:4])}, which could run code" if names else type(e).__name__
            raise UnsafeFileError(f"checkpoint {self.folder!r} refused: its entry {fqn!r} is not plain data "
                                  f"({what}); nothing was run") from None
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def _is_zip(buffer) -> bool:
    start = buffer.read(4)
    buffer.seek(0)
    return start == b"PK\x03\x04"


def load(folder: str | Path, state: dict, checked: dcp_metadata.Metadata) -> None:
    """``dcp.load(state)`` from ``folder`` whose metadata :func:`read_metadata` gave as ``checked``, by
    the rules above; UnsafeFileError (one line) on a refusal or an entry DCP cannot read."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    try:
        dcp.load(state, storage_reader=CheckedReader(folder, checked), planner=PlainLoadPlanner(folder))
    except CheckpointException as e:
        raise _first_failure(e, folder) from None


def _first_failure(error, folder) -> UnsafeFileError:
    """The one-line error behind DCP's per-rank failure report."""
    failures = [f[0] if isinstance(f, tuple) else f for f in error.failures.values()]
    refused = next((f for f in failures if isinstance(f, UnsafeFileError)), None)
    if refused is not None:
        return refused
    first = failures[0] if failures else error
    if isinstance(first, pickle.UnpicklingError):
        named = re.findall(r"GLOBAL ([\w.]+)", str(first))
        what = f"it calls {', '.join(dict.fromkeys(named))}, which could run code" if named else "not a tensor"
        return UnsafeFileError(f"checkpoint {str(folder)!r} refused: a tensor entry is not plain tensor data "
                               f"({what}); nothing was run")
    text = " ".join(str(first).split())[:200]
    return UnsafeFileError(f"checkpoint {str(folder)!r} is unreadable ({type(first).__name__}: {text})")
