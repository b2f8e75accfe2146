"""File helpers shared by the project: atomic writes, checksums, and reading torch files without running code.

Atomic writes (:func:`write_atomic`): a reader sees the old file or the new one, never a half-written one.
Rule: write to a temp file in the destination's folder (``.NAME.XXXX.tmp``), flush and fsync it,
``os.replace`` it over the destination, then fsync the folder so the rename itself survives a crash. The
file gets the mode a plain ``open`` would give (0666 minus the umask), not the temp file's 0600. A failed
write removes its temp file; one killed mid-write (SIGKILL) leaves it for :func:`remove_stale_temps` at
the next start. :func:`torch_save` keeps the OSError (disk full, ...) that ``torch.save`` reports as a
bare RuntimeError.

Checksums (:func:`with_checksum`, verified by :func:`read_torch_file`): a dict written by the project
carries ``"sha256"``, the SHA-256 of its content (every other entry, walked in order: tensors and numpy
arrays as dtype, shape and raw bytes; other values as their type and repr), computed from the in-memory
state and recomputed from what is read: bit rot anywhere in the data is caught (``torch.load`` does not
check the zip CRCs) whatever torch's zip layout, and there is no second file to lose.

Safe reading (:func:`read_torch_file`): ``torch.load(weights_only=True)`` with numpy arrays and the classes
a caller allows; a pickle that names any other callable (a payload) is refused in one line naming the file
and the callables; nothing from it runs.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable

import numpy as np

TEMP_SUFFIX = ".tmp"


_WARNED: set[str] = set()


def say(message: str, err: bool = False) -> None:
    """``message`` as a line of its own on stdout (stderr with ``err``), flushed: above a progress bar
    on the terminal (tqdm.write clears the bar, prints, redraws it), so no line ends up on the bar's."""
    from tqdm import tqdm
    stream = sys.stderr if err else sys.stdout
    tqdm.write(message, file=stream)
    stream.flush()


def warn(message: str, once: bool = False) -> None:
    """``warning: MESSAGE`` as one line on stderr (``say``; with ``once``, only the first time in this process)."""
    if once:
        if message in _WARNED:
            return
        _WARNED.add(message)
    say(f"warning: {message}", err=True)


def shown_path(path: str | os.PathLike) -> str:
    """A path as an error names it: ``'runs/x'``, and when relative also the absolute path tried,
    ``'runs/x' (/home/me/runs/x)``: the message says where it was looked for, whatever the folder."""
    p = Path(path)
    return repr(str(p)) if p.is_absolute() else f"{str(p)!r} ({p.absolute()})"


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open folders: the rename is all we get
        return
    with contextlib.suppress(OSError):
        os.fsync(fd)
    os.close(fd)


def current_umask() -> int:
    """The process's umask (read from /proc on Linux; elsewhere set and restored at once)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, write_fn: Callable[[BinaryIO], Any]) -> Path:
    """Call ``write_fn(f)`` on a binary temp file beside ``path``, then move it onto ``path``. A ``path``
    that is a device, pipe or socket (``/dev/null``) is refused: the rename would replace it by a file."""
    path = Path(path)
    if path.exists() and not (path.is_file() or path.is_dir()):          # a directory fails at the rename
        raise OSError(errno.EINVAL, f"'{path}' is a device, pipe or socket; expected the path of a regular file")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        os.chmod(tmp, 0o666 & ~current_umask())          # mkstemp's 0600 -> what open() would give
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


class _ErrorKeepingFile:
    """A binary file that remembers the first OSError of its writes (torch.save replaces it with a
    RuntimeError that has no errno)."""

    def __init__(self, f: BinaryIO):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        self.f.flush()


def torch_save(obj, f: BinaryIO) -> None:
    """``torch.save(obj, f)``; a failed write raises its own OSError (e.g. ENOSPC), not a RuntimeError."""
    import torch
    keeper = _ErrorKeepingFile(f)
    try:
        torch.save(obj, keeper)
    except RuntimeError:
        if keeper.error is not None:
            raise keeper.error from None
        raise


WRITE_FAILED_EXIT = 74                  # EX_IOERR (sysexits.h): a writer that hit a full disk


def is_disk_full(error: OSError) -> bool:
    return error.errno in (errno.ENOSPC, errno.EDQUOT)


@contextlib.contextmanager
def exit_on_write_error(what: str, left: str = "no partial file is left"):
    """For a command's writes: an OSError inside (disk full, read-only folder, a file where a folder
    should be) becomes ``error: could not write WHAT (why); LEFT`` on stderr and exit 74 (disk full) or 2.
    Wrap the writes only: a missing input is an OSError too."""
    try:
        yield
    except OSError as e:
        why = "no space left on the device" if is_disk_full(e) else (e.strerror or str(e))
        print(f"error: could not write {what} ({why}); {left}", file=sys.stderr)
        raise SystemExit(WRITE_FAILED_EXIT if is_disk_full(e) else 2) from None


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) atomically."""
    return write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def write_json_atomic(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    """Write ``obj`` as JSON (plus a final newline) atomically. NaN/inf are refused (not JSON)."""
    return write_text_atomic(path, json.dumps(obj, indent=indent, allow_nan=False) + "\n")


def remove_stale_temps(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Delete temp files left in ``folder`` by killed writes (of ``name`` only, if given).

    Call it only when no other process is writing into ``folder``. Returns the removed paths."""
    pattern = f".{name}.*{TEMP_SUFFIX}" if name else f".*{TEMP_SUFFIX}"
    removed = [p for p in Path(folder).glob(pattern) if p.is_file()]      # none where there is no folder
    for p in removed:
        p.unlink()
    return removed


# ----------------------------------------------------------------------------- checksums

CHECKSUM_KEY = "sha256"


def _feed(h, obj) -> None:
    """Hash ``obj``'s content into ``h`` (see the module doc for the walk)."""
    import torch
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(obj, np.ndarray):
        h.update(f"N{obj.dtype.str}{obj.shape}".encode())
        h.update(np.ascontiguousarray(obj).view(np.uint8).reshape(-1))
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}".encode())
        for k, v in obj.items():
            _feed(h, k)
            _feed(h, v)
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for v in obj:
            _feed(h, v)
    else:
        h.update(f"S{type(obj).__name__}:{obj!r};".encode())


def content_sha256(obj: dict) -> str:
    """SHA-256 (hex) of a dict's content, its ``"sha256"`` entry left out."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in obj.items() if k != CHECKSUM_KEY})
    return h.hexdigest()


def with_checksum(obj: dict) -> dict:
    """``obj`` plus ``"sha256"``: the checksum :func:`read_torch_file` verifies."""
    return {**obj, CHECKSUM_KEY: content_sha256(obj)}


def has_checksum(obj) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get(CHECKSUM_KEY), str)


# ----------------------------------------------------------------------------- safe reading

class UnsafeFileError(ValueError):
    """A torch file that is unreadable or would need arbitrary code to load; one-line message."""


def numpy_globals() -> list:
    """What numpy arrays of plain dtypes need to unpickle (no code runs: they are data)."""
    core = getattr(np, "_core", None) or np.core
    dtypes = [type(np.dtype(t)) for t in (np.uint32, np.int64, np.float64, np.uint8)]
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, *dtypes]


def read_torch_file(path: str | os.PathLike, what: str = "file", allow: Iterable = (), mmap: bool = False):
    """``torch.load(path, weights_only=True)`` on CPU, numpy arrays and ``allow`` (classes or
    functions) permitted; a stored checksum is verified unless ``mmap`` (which reads no tensor data).
    Missing file: FileNotFoundError; unreadable, corrupt (checksum) or code-carrying file:
    UnsafeFileError; both one line and naming ``what`` and the path."""
    obj = _load(Path(path), what, [*allow, *numpy_globals()], mmap)
    if not mmap and has_checksum(obj) and content_sha256(obj) != obj[CHECKSUM_KEY]:
        raise UnsafeFileError(f"{what} {str(path)!r} is unreadable: its content does not match the checksum "
                              f"stored at save (the file is corrupt)")
    return obj


def _load(path: Path, what: str, allow: list, mmap: bool):
    import torch
    if not path.is_file():
        raise FileNotFoundError(f"{what} {shown_path(path)} does not exist")
    try:
        with torch.serialization.safe_globals(allow):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:
        try:              # the callables the pickle names, read from its opcodes: nothing is executed
            named = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception:
            named = []
        names = sorted(set(named) - {f"{g.__module__}.{g.__qualname__}" for g in allow})
        if names:
            raise UnsafeFileError(f"{what} {str(path)!r} refused: it is not a plain weights file (its pickle "
                                  f"calls {', '.join(names[:4])}, which could run code); nothing was run") from None
        first = " ".join(str(e).split())[:200]
        raise UnsafeFileError(f"{what} {str(path)!r} is unreadable ({type(e).__name__}: {first})") from None


def read_safetensors(path: str | os.PathLike, what: str = "safetensors file",
                     tensors: bool = True) -> tuple[dict, dict]:
    """(tensors on CPU ({} unless ``tensors``), metadata) of a safetensors file; a missing file is a
    FileNotFoundError, a malformed one a one-line UnsafeFileError, both naming ``what`` and the path."""
    from safetensors import SafetensorError, safe_open
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {shown_path(path)} does not exist")
    try:
        with safe_open(str(path), "pt") as f:
            return ({k: f.get_tensor(k) for k in f.keys()} if tensors else {}), dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        first = " ".join(str(e).split())[:200]
        raise UnsafeFileError(f"{what} {str(path)!r} is not a readable safetensors file ({first})") from None


# ----------------------------------------------------------------------------- whole-file checksums

WEIGHTS_SHA256_KEY = "weights_sha256"


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verified_weights(weights: str | os.PathLike, record: str | os.PathLike) -> Path:
    """``weights`` once its SHA-256 equals the one the JSON file ``record`` holds under ``"weights_sha256"``
    (a hub folder's config.json); a mismatch is a one-line UnsafeFileError naming the file, a record
    without one (written before checksums) a one-time warning."""
    weights = Path(weights)
    try:
        expected = json.loads(Path(record).read_text()).get(WEIGHTS_SHA256_KEY)
    except (OSError, ValueError, AttributeError) as e:
        raise UnsafeFileError(f"{str(record)!r} is not a readable JSON object ({type(e).__name__})") from None
    if expected is None:
        warn(f"{str(weights)!r} has no checksum in {Path(record).name} (written before checksums): loaded unverified",
             once=True)
    elif file_sha256(weights) != expected:
        raise UnsafeFileError(f"{str(weights)!r} is corrupt: its SHA-256 does not match the one {Path(record).name} "
                              f"recorded at save")
    return weights


def check_shapes(expected: dict, found: dict, what: str) -> None:
    """One-line UnsafeFileError naming the first tensor of ``found`` (a file's state dict) that is missing,
    extra or shaped unlike its namesake in ``expected`` (the model its config builds), with both shapes."""
    for name in [*expected, *(k for k in found if k not in expected)]:
        want, got = expected.get(name), found.get(name)
        shapes = (None if want is None else tuple(want.shape), None if got is None else tuple(got.shape))
        if shapes[0] != shapes[1]:
            shown = ["absent" if s is None else str(s) for s in shapes]
            raise UnsafeFileError(f"{what} does not match its config: tensor {name!r} is {shown[1]} in the file, "
                                  f"{shown[0]} in the model the config builds")


def check_finite(state: dict, what: str) -> None:
    """One-line UnsafeFileError naming the first floating-point tensor of ``state`` (a state dict read
    from ``what``) that holds NaN or inf: such weights make no usable model."""
    import torch
    for name, t in state.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise UnsafeFileError(f"{what} holds non-finite weights (NaN or inf): tensor {name!r} is the first; "
                                  f"refusing to use them")
