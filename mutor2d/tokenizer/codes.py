"""Pre-tokenised image data on disk: the store of token grids, opened and checked without torch.

Store layout (one folder):
  header.json   grid, codebook_size, num_images, num_augs, augmentations, classes, source folder,
                image_size, tokenizer identity + sha256, shards, skipped images, complete flag
  codes.npy     uint16 (num_images, num_augs, H, W), memory-mapped (np.load(mmap_mode="r", allow_pickle=False))
  labels.npy    int64 (num_images,); -1 = unreadable image (skipped), or not filled yet
  files.txt     image paths relative to the source folder, one per row of codes.npy
  shards/       one JSON marker per finished shard (rows it wrote, the images it skipped)

Written by mutor2d.tokenizer.extract from an ImageFolder tree (mutor2d.tokenizer.image_folder).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT = "mutor2d-codes/1"
UNREADABLE = -1              # label of a row whose image could not be read (or is not extracted yet)
CHECK_CHUNK = 1 << 24        # elements per chunk when open_store checks the arrays' values


class CodesError(ValueError):
    """Bad input folder, store or settings; the message is one line."""


# ----------------------------------------------------------------------------- the store

@dataclass
class CodeStore:
    """An opened store: codes (n, A, H, W) uint16 memmap, labels (n,) int64, header dict."""
    path: Path
    codes: np.ndarray
    labels: np.ndarray
    header: dict


def open_store(path: str | os.PathLike, require_complete: bool = True, check_values: bool = True) -> CodeStore:
    """Open the store at ``path`` and check it: header fields, array shapes and dtypes, and (with
    ``check_values``) every token id < codebook_size and every label -1 or in [0, len(classes)).
    Any fault raises CodesError naming the file (and the row and value for bad ids or labels)."""
    path = Path(path)
    if not (path / "header.json").is_file():
        raise CodesError(f"{str(path)!r} is not a codes folder (no header.json); "
                         f"make one with tokenizers/extract_codes.py")
    try:
        header = json.loads((path / "header.json").read_text())
    except (OSError, ValueError) as e:
        raise CodesError(f"{str(path / 'header.json')!r} is unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        found = header.get("format") if isinstance(header, dict) else header
        raise CodesError(f"{str(path)!r}: unknown codes format {found!r}, expected {FORMAT!r}")
    _check_header(path / "header.json", header)
    if require_complete and not header.get("complete"):
        done = len(list((path / "shards").glob("*.json")))
        raise CodesError(f"codes at {str(path)!r} are incomplete ({done}/{header['num_shards']} shards); "
                         f"rerun tokenizers/extract_codes.py with the same arguments to finish")
    h, w = header["grid"]
    codes = open_array(path / "codes.npy", np.uint16, (header["num_images"], header["num_augs"], h, w))
    labels = open_array(path / "labels.npy", np.int64, (header["num_images"],))
    if check_values:
        n, k = header["codebook_size"], len(header["classes"])
        _check_values(path / "codes.npy", codes, 0, n - 1, "token id", f"an id below the codebook size {n}")
        _check_values(path / "labels.npy", labels, UNREADABLE, k - 1, "label",
                      f"{UNREADABLE} (unreadable image) or a class in 0..{k - 1}")
    return CodeStore(path, codes, labels, header)


def _check_header(file: Path, header: dict) -> None:
    """Types and ranges of the header fields readers rely on; CodesError naming the field."""
    def is_int(v, low):
        return isinstance(v, int) and not isinstance(v, bool) and v >= low

    grid, classes = header.get("grid"), header.get("classes")
    checks = [
        ("grid", isinstance(grid, list) and len(grid) == 2 and all(is_int(g, 1) for g in grid),
         "[H, W] with positive integers"),
        ("codebook_size", is_int(header.get("codebook_size"), 1)
         and header["codebook_size"] <= np.iinfo(np.uint16).max + 1, "an integer in 1..65536"),
        ("classes", isinstance(classes, list) and len(classes) > 0, "a non-empty list of class names"),
        ("num_images", is_int(header.get("num_images"), 0), "an integer >= 0"),
        ("num_augs", is_int(header.get("num_augs"), 1), "an integer >= 1"),
        ("num_shards", is_int(header.get("num_shards"), 0), "an integer >= 0"),
    ]
    for key, ok, want in checks:
        if not ok:
            raise CodesError(f"{str(file)!r}: {key}={header.get(key)!r}, expected {want}")


def open_array(file: Path, dtype, shape: tuple, mode: str = "r") -> np.ndarray:
    """Memory-map a .npy file (``mode`` "r", or "r+" to fill it) and check its dtype and shape against
    the header; an empty, truncated or foreign file is a CodesError."""
    try:
        arr = np.load(file, mmap_mode=mode, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:     # EOFError: a zero-length file
        raise CodesError(f"{str(file)!r} is unreadable ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    if arr.dtype != dtype or arr.shape != tuple(shape):
        raise CodesError(f"{str(file)!r} holds {arr.dtype} {tuple(arr.shape)}, expected {np.dtype(dtype)} "
                         f"{tuple(shape)} (from header.json)")
    return arr


def _check_values(file: Path, arr: np.ndarray, low: int, high: int, what: str, want: str) -> None:
    """Raise CodesError at the first row of ``arr`` holding a value outside [low, high].
    Reads ``arr`` in chunks of about CHECK_CHUNK elements (a vectorised min/max per chunk)."""
    rows = max(1, CHECK_CHUNK // max(1, int(np.prod(arr.shape[1:]))))
    for start in range(0, len(arr), rows):
        chunk = np.asarray(arr[start:start + rows]).reshape(min(rows, len(arr) - start), -1)
        if chunk.size == 0 or (chunk.min() >= low and chunk.max() <= high):
            continue
        bad = (chunk < low) | (chunk > high)
        first = int(np.flatnonzero(bad.any(1))[0])
        value = int(chunk[first][bad[first]][0])
        raise CodesError(f"{str(file)!r}: row {start + first} holds {what} {value}; expected {want}")
