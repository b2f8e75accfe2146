"""File helpers shared by the project: atomic writes, and reading torch files without running code.

Atomic writes: a reader sees the old file or the new one, never a half-written one. Rule: write to a temp file in the destination's folder (``.NAME.XXXX.tmp``), flush and fsync it,
``os.replace`` it over the destination, then fsync the folder so the rename itself survives a crash.
A failed write removes its temp file; one killed mid-write (SIGKILL) leaves it behind, and
:func:`remove_stale_temps` deletes such leftovers at the next start.

Safe reading (:func:`read_torch_file`): ``torch.load(weights_only=True)`` accepts tensors, numbers,
strings and plain containers only, plus the classes a caller allows explicitly. A pickle that names
any other callable (a payload) is refused with a one-line error naming the file and the callables;
nothing from it runs. numpy arrays are always allowed (plain data: RNG states of older files).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable

import numpy as np
import torch

TEMP_SUFFIX = ".tmp"


_WARNED: set[str] = set()


def warn(message: str, once: bool = False) -> None:
    """``warning: MESSAGE`` as one line on stderr (with ``once``, only the first time in this process)."""
    if once:
        if message in _WARNED:
            return
        _WARNED.add(message)
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open folders: the rename is all we get
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, write_fn: Callable[[BinaryIO], Any]) -> Path:
    """Call ``write_fn(f)`` on a binary temp file beside ``path``, then move it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_folder(path.parent)
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) atomically."""
    data = text.encode("utf-8")
    return write_atomic(path, lambda f: f.write(data))


def write_json_atomic(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    """Write ``obj`` as JSON (plus a final newline) atomically. NaN/inf are refused (not JSON)."""
    return write_text_atomic(path, json.dumps(obj, indent=indent, allow_nan=False) + "\n")


def remove_stale_temps(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Delete temp files left in ``folder`` by killed writes (of ``name`` only, if given).

    Call it only when no other process is writing into ``folder``. Returns the removed paths."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    pattern = f".{name}.*{TEMP_SUFFIX}" if name else f".*{TEMP_SUFFIX}"
    removed = []
    for p in folder.glob(pattern):
        if p.is_file():
            p.unlink()
            removed.append(p)
    return removed


# ----------------------------------------------------------------------------- safe reading

class UnsafeFileError(ValueError):
    """A torch file that is unreadable or would need arbitrary code to load; one-line message."""


def numpy_globals() -> list:
    """What numpy arrays of plain dtypes need to unpickle (no code runs: they are data)."""
    core = getattr(np, "_core", None) or np.core
    dtypes = [type(np.dtype(t)) for t in (np.uint32, np.int64, np.float64, np.uint8)]
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, *dtypes]


def _qualname(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _named_globals(path: Path) -> list[str]:
    """Callables the pickle inside ``path`` names (read from its opcodes; nothing is executed)."""
    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:
        return []


def read_torch_file(path: str | os.PathLike, what: str = "file", allow: Iterable = (), mmap: bool = False):
    """``torch.load(path, weights_only=True)`` on CPU, numpy arrays and ``allow`` (classes or
    functions) permitted. Missing file: FileNotFoundError; unreadable or code-carrying file:
    UnsafeFileError; both one line and naming ``what`` and the path."""
    path, allow = Path(path), [*allow, *numpy_globals()]
    if not path.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist")
    try:
        with torch.serialization.safe_globals(allow):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:
        allowed = {_qualname(g) for g in allow}
        names = sorted(n for n in _named_globals(path) if n not in allowed)
        if names:
            raise UnsafeFileError(f"{what} {str(path)!r} refused: it is not a plain weights file (its pickle "
                                  f"calls {', '.join(names[:4])}, which could run code); nothing was run") from None
        first = " ".join(str(e).split())[:200]
        raise UnsafeFileError(f"{what} {str(path)!r} is unreadable ({type(e).__name__}: {first})") from None
