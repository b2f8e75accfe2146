"""Sharded checkpoints crafted as a stranger would: a copy of a real one whose pickles call
``os.system("touch MARKER")``, re-signed (meta.pt's file checksums and its own checksum recomputed, as
the attacker who writes the folder can), so that only a reader that never unpickles code stops it.

Kinds (:data:`KINDS`):
  * ``top``: ``.metadata`` is the payload itself.
  * ``nested``: the real metadata, with the payload inside it (a module name of its StorageMeta).
  * ``tensor_properties``: the payload as the properties of a tensor-storage entry of ``.metadata``.
  * ``not_pickle``: ``.metadata`` is JSON text.
  * ``outside``: a storage entry that points at a file outside the folder (``../``).
  * ``bytes_entry``: ``.metadata`` intact; the stored value of a non-tensor entry (the optimizer's
    ``lr``) is a torch file whose pickle is the payload (DCP's own planner loads these with
    ``weights_only=False``).
  * ``tensor_entry``: the same for a tensor entry.
"""
from __future__ import annotations

import io as _io
import os
import pickle
import shutil
from pathlib import Path

import torch

KINDS = ("top", "nested", "tensor_properties", "not_pickle", "outside", "bytes_entry", "tensor_entry")
METADATA_KINDS = KINDS[:5]          # refused when the folder is first looked at (any reader)


class Payload:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _read_own_metadata(folder: Path):
    with open(folder / ".metadata", "rb") as f:    # our own real file, written by torch in the test
        return pickle.load(f)


def _write_metadata(folder: Path, obj) -> None:
    (folder / ".metadata").write_bytes(pickle.dumps(obj))


def _replace_stored_value(folder: Path, md, fqn: str, value) -> None:
    """Append ``torch.save(value)`` to a storage file and point ``fqn``'s entry at it."""
    index = next(i for i in md.storage_data if i.fqn == fqn)
    info = md.storage_data[index]
    buffer = _io.BytesIO()
    torch.save(value, buffer)
    data = buffer.getvalue()
    shard = folder / info.relative_path
    offset = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(data)
    info.offset, info.length = offset, len(data)
    _write_metadata(folder, md)


def _resign(folder: Path) -> None:
    """meta.pt with the SHA-256 of the files as they now are, under a valid content checksum."""
    from mutor2d import io
    from mutor2d.checkpoint import sharded as sharded_checkpoint
    meta = io.read_torch_file(folder / "meta.pt")
    meta = {k: v for k, v in meta.items() if k != io.CHECKSUM_KEY}
    meta["files_sha256"] = sharded_checkpoint.files_sha256(folder)
    torch.save(io.with_checksum(meta), folder / "meta.pt")


def craft(folder: Path, kind: str, marker: Path) -> Path:
    """Turn the sharded checkpoint ``folder`` (in place) into one of ``kind``; -> ``folder``."""
    folder, payload = Path(folder), Payload(marker)
    md = _read_own_metadata(folder)
    if kind == "top":
        _write_metadata(folder, payload)
    elif kind == "nested":
        md.storage_meta.modules = ["model", payload]
        _write_metadata(folder, md)
    elif kind == "tensor_properties":
        key = next(k for k, v in md.state_dict_metadata.items() if hasattr(v, "properties"))
        md.state_dict_metadata[key].properties = payload
        _write_metadata(folder, md)
    elif kind == "not_pickle":
        (folder / ".metadata").write_text('{"state_dict_metadata": {}}')
    elif kind == "outside":
        next(iter(md.storage_data.values())).relative_path = "../../meta.pt"
        _write_metadata(folder, md)
    elif kind == "bytes_entry":
        fqn = next(k for k in md.state_dict_metadata if k.endswith("param_groups.0.lr"))
        _replace_stored_value(folder, md, fqn, payload)
    elif kind == "tensor_entry":               # an EMA tensor when kept: what export and sampling read
        tensors = sorted((not k.startswith("ema."), k) for k, v in md.state_dict_metadata.items()
                         if hasattr(v, "properties"))
        fqn = tensors[0][1]
        _replace_stored_value(folder, md, fqn, payload)
    else:
        raise ValueError(f"kind {kind!r}: expected one of {KINDS}")
    _resign(folder)
    return folder


def crafted_copy(src: Path, dst: Path, kind: str, marker: Path) -> Path:
    """A copy of the sharded checkpoint ``src`` at ``dst``, crafted as ``kind``."""
    shutil.copytree(src, dst)
    return craft(dst, kind, marker)


def names_torch_wrote(folder: Path) -> set[tuple[str, str]]:
    """(module, name) of every callable the ``.metadata`` of our own, real, sharded checkpoint names (read
    with a plain unpickler: the file was written by torch in the test); its stored values checked too."""
    from mutor2d.checkpoint import safe_dcp
    seen = set()

    class Recorder(pickle.Unpickler):
        def find_class(self, module, name):
            seen.add((module, name))
            return super().find_class(module, name)
    with open(Path(folder) / ".metadata", "rb") as f:
        Recorder(f).load()
    safe_dcp.check_entries(folder, safe_dcp.read_metadata(folder))
    return seen


def refused_names(names) -> set[tuple[str, str]]:
    """Those of ``names`` that mutor2d.checkpoint.safe_dcp's unpickler would refuse."""
    from mutor2d.checkpoint import safe_dcp
    return {n for n in names if n not in safe_dcp.ALLOWED and not safe_dcp._is_torch_dtype(*n)}
