"""Pre-tokenised image data: an ImageFolder tree -> token grids on disk.

Store layout (one folder):
  header.json   grid, codebook_size, num_images, num_augs, augmentations, classes, source folder,
                image_size, tokenizer identity + sha256, shards, skipped images, complete flag
  codes.npy     uint16 (num_images, num_augs, H, W), memory-mapped (np.load(mmap_mode="r", allow_pickle=False))
  labels.npy    int64 (num_images,); -1 = unreadable image (skipped), or not filled yet
  files.txt     image paths relative to the source folder, one per row of codes.npy
  shards/       one JSON marker per finished shard (rows it wrote, the images it skipped)

Augmentations (deterministic list, ADM-style): "center" is ADM's centre crop at image_size;
"tl", "tr", "bl", "br" are corner crops of the ADM centre crop at image_size * crop_range;
with flips each crop is followed by its horizontal mirror ("center+flip", ...).

Extraction is resumable: a rerun with the same settings skips shards whose marker exists. Work is
split over processes (accelerate): shard i belongs to process i % num_processes.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..io import remove_stale_temps, write_json_atomic

IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".ppm"}
CROPS = ("center", "tl", "tr", "bl", "br")
FORMAT = "mutor2d-codes/1"
UNREADABLE = -1              # label of a row whose image could not be read (or is not extracted yet)
CHECK_CHUNK = 1 << 24        # elements per chunk when open_store checks the arrays' values


class CodesError(ValueError):
    """Bad input folder, store or settings; the message is one line."""


# ----------------------------------------------------------------------------- image folder

def scan_image_folder(root: str | os.PathLike) -> tuple[list[str], list[int], list[str]]:
    """An ImageNet-train-style tree (one subfolder per class) -> (relative paths, labels, classes).

    Classes are the sorted subfolder names; files are sorted within each class."""
    root = Path(root)
    if not root.is_dir():
        raise CodesError(f"image folder {str(root)!r} does not exist or is not a folder")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    loose = [p.name for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTS]
    if not classes:
        what = f"{len(loose)} images directly inside it" if loose else "nothing"
        raise CodesError(f"image folder {str(root)!r}: expected one subfolder per class "
                         f"(root/CLASS/IMAGE), found {what}")
    if loose:
        raise CodesError(f"image folder {str(root)!r}: {len(loose)} images lie outside class "
                         f"subfolders (e.g. {loose[0]!r}); expected root/CLASS/IMAGE")
    files, labels, empty = [], [], []
    for label, name in enumerate(classes):
        found = sorted(str(p.relative_to(root)) for p in (root / name).rglob("*")
                       if p.is_file() and p.suffix.lower() in IMAGE_EXTS)
        if not found:
            empty.append(name)
        files += found
        labels += [label] * len(found)
    if not files:
        raise CodesError(f"image folder {str(root)!r}: no images in its {len(classes)} class folders "
                         f"(extensions {sorted(IMAGE_EXTS)})")
    if empty:
        raise CodesError(f"image folder {str(root)!r}: class folders without images: {empty[:5]}"
                         f"{' ...' if len(empty) > 5 else ''}")
    return files, labels, classes


# ----------------------------------------------------------------------------- augmentations

def augmentation_names(num_crops: int, flip: bool) -> list[str]:
    if not 1 <= num_crops <= len(CROPS):
        raise CodesError(f"num_crops: expected 1..{len(CROPS)}, got {num_crops}")
    names = []
    for c in CROPS[:num_crops]:
        names += [c, f"{c}+flip"] if flip else [c]
    return names


def center_crop_arr(img: Image.Image, size: int) -> Image.Image:
    """ADM's centre crop: halve with BOX while the short side >= 2*size, BICUBIC-resize the short
    side to ``size``, cut the centre ``size`` x ``size`` square."""
    while min(img.size) >= 2 * size:
        img = img.resize(tuple(x // 2 for x in img.size), resample=Image.BOX)
    scale = size / min(img.size)
    img = img.resize(tuple(round(x * scale) for x in img.size), resample=Image.BICUBIC)
    arr = np.asarray(img)
    top, left = (arr.shape[0] - size) // 2, (arr.shape[1] - size) // 2
    return Image.fromarray(arr[top:top + size, left:left + size])


def augment(img: Image.Image, image_size: int, names: list[str], crop_range: float = 1.1) -> torch.Tensor:
    """RGB image -> (len(names), 3, S, S) float in [0, 1], one view per augmentation name."""
    views = {"center": np.asarray(center_crop_arr(img, image_size))}
    corners = [n.split("+")[0] for n in names if n.split("+")[0] != "center"]
    if corners:
        big = max(image_size, round(image_size * crop_range))
        arr = np.asarray(center_crop_arr(img, big))
        e = big - image_size
        at = {"tl": (0, 0), "tr": (0, e), "bl": (e, 0), "br": (e, e)}
        for c in corners:
            y, x = at[c]
            views[c] = arr[y:y + image_size, x:x + image_size]
    out = []
    for n in names:
        v = views[n.split("+")[0]]
        out.append(v[:, ::-1] if n.endswith("+flip") else v)
    return torch.from_numpy(np.stack(out).copy()).permute(0, 3, 1, 2).float() / 255.0


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
    codes = _open_array(path / "codes.npy", np.uint16, (header["num_images"], header["num_augs"], h, w))
    labels = _open_array(path / "labels.npy", np.int64, (header["num_images"],))
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


def _open_array(file: Path, dtype, shape: tuple, mode: str = "r") -> np.ndarray:
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
        first = int(np.flatnonzero(((chunk < low) | (chunk > high)).any(1))[0])
        values = chunk[first]
        value = int(values[(values < low) | (values > high)][0])
        raise CodesError(f"{str(file)!r}: row {start + first} holds {what} {value}; expected {want}")


_PLAN_KEYS = ("source", "num_images", "files_sha256", "classes", "image_size", "augmentations",
              "crop_range", "grid", "codebook_size", "tokenizer_sha256", "shard_size", "num_shards")


def _plan(source: Path, files: list[str], classes: list[str], tokenizer, names: list[str], crop_range: float,
          shard_size: int) -> dict:
    return {
        "format": FORMAT,
        "source": str(source.resolve()),
        "num_images": len(files),
        "num_augs": len(names),
        "files_sha256": hashlib.sha256("\n".join(files).encode()).hexdigest(),
        "classes": classes,
        "image_size": tokenizer.image_size,
        "augmentations": names,
        "crop_range": crop_range,
        "grid": list(tokenizer.grid),
        "codebook_size": tokenizer.vocab_size,
        "tokenizer": tokenizer.identity,
        "tokenizer_sha256": tokenizer.sha256,
        "shard_size": shard_size,
        "num_shards": -(-len(files) // shard_size),
        "complete": False,
        "num_skipped": 0,
        "skipped": [],
    }


def _prepare(out: Path, plan: dict, files: list[str], labels: list[int]) -> None:
    """Create the store for ``plan``, or check that an existing one was made with the same plan."""
    if (out / "header.json").is_file():
        old = json.loads((out / "header.json").read_text())
        for k in _PLAN_KEYS:
            if old.get(k) != plan[k]:
                raise CodesError(f"{str(out)!r} already holds codes made with other settings "
                                 f"({k}: {old.get(k)!r} there, {plan[k]!r} now); use another --out or delete it")
        return
    if out.exists() and not out.is_dir():
        raise CodesError(f"--out {str(out)!r} is a file; expected a codes folder (new, empty, or one to resume)")
    if out.exists() and any(out.iterdir()):
        raise CodesError(f"output folder {str(out)!r} exists and is not a codes folder; use an empty or new one")
    made = not out.exists()
    try:
        _create(out, plan, files)
    except OSError:                          # disk full, read-only: leave the folder as it was
        _undo_create(out, made)
        raise


def _undo_create(out: Path, made: bool) -> None:
    """Remove what a failed ``_create`` left in ``out`` (empty before it), and ``out`` itself if it ``made`` it."""
    if not out.is_dir():
        return
    for p in out.iterdir():
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    if made:
        out.rmdir()


def _create(out: Path, plan: dict, files: list[str]) -> None:
    """The empty store of ``plan`` in ``out``; header.json last (it makes the folder a codes folder)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "shards").mkdir(exist_ok=True)
    h, w = plan["grid"]
    _allocate(out / "codes.npy", np.uint16, (len(files), plan["num_augs"], h, w))
    np.save(out / "labels.npy", np.full(len(files), UNREADABLE, dtype=np.int64))
    (out / "files.txt").write_text("".join(f + "\n" for f in files))
    write_json_atomic(out / "header.json", plan, indent=1)


def _allocate(file: Path, dtype, shape: tuple) -> None:
    """A .npy ``file`` of zeros with its bytes reserved on disk where the OS can (posix_fallocate): a
    disk too small fails here with ENOSPC, not later with SIGBUS in a write to the memory map."""
    np.lib.format.open_memmap(file, mode="w+", dtype=dtype, shape=shape).flush()
    if not hasattr(os, "posix_fallocate"):
        return
    with open(file, "r+b") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):    # a file system that cannot reserve
                raise


class _Images(torch.utils.data.Dataset):
    """Row -> (row, views (A, 3, S, S) or None, error or None)."""

    def __init__(self, root: Path, files: list[str], image_size: int, names, crop_range):
        self.root, self.files = root, files
        self.image_size, self.names, self.crop_range = image_size, names, crop_range

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, row: int):
        try:
            with Image.open(self.root / self.files[row]) as im:
                img = im.convert("RGB")
            return row, augment(img, self.image_size, self.names, self.crop_range), None
        except Exception as e:  # unreadable / corrupt / truncated image
            return row, None, f"{type(e).__name__}: {e}".splitlines()[0]


def _collate(items):
    return items


def extract(folder: str | os.PathLike, out: str | os.PathLike, tokenizer, *,
            num_crops: int = 1, flip: bool = True, crop_range: float = 1.1, shard_size: int = 1024,
            batch_size: int = 64, num_workers: int = 0, max_shards: int | None = None,
            state=None, progress: bool = True, log=print) -> dict:
    """Tokenise every image of ``folder`` under every augmentation into the store at ``out``.

    tokenizer: any mutor2d.tokenizer.Tokenizer (its identity and sha256 go into the header).
    state: an accelerate state (process_index, num_processes, wait_for_everyone, is_main_process);
    default: accelerate.PartialState(). max_shards: stop this process after that many new shards
    (the store stays resumable). Returns a summary dict (done/total shards, skipped, complete).
    A finished store without a single readable image raises CodesError."""
    from tqdm import tqdm
    state = _check_settings(state, tokenizer, shard_size, batch_size)
    folder, out = Path(folder), Path(out)
    files, labels, classes = scan_image_folder(folder)
    names = augmentation_names(num_crops, flip)
    plan = _plan(folder, files, classes, tokenizer, names, crop_range, shard_size)
    if state.is_main_process:
        _prepare(out, plan, files, labels)
        for where in (out, out / "shards"):  # temp files of writes killed in an earlier run
            remove_stale_temps(where)
    state.wait_for_everyone()
    if not state.is_main_process:
        _prepare(out, plan, files, labels)  # checks only: the main process created it
    h, w = plan["grid"]
    store = CodeStore(out, _open_array(out / "codes.npy", np.uint16, (len(files), plan["num_augs"], h, w), "r+"),
                      _open_array(out / "labels.npy", np.int64, (len(files),), "r+"), plan)
    batches = _my_batches(out, plan, state, max_shards, batch_size, log)
    loader = torch.utils.data.DataLoader(
        _Images(folder, files, plan["image_size"], names, crop_range),
        batch_sampler=[rows for _, _, rows in batches], num_workers=num_workers, collate_fn=_collate)
    bar = tqdm(total=sum(len(r) for _, _, r in batches), desc=f"extract[{state.process_index}]",
               unit="img", disable=not progress, position=state.process_index)
    skipped: list[str] = []
    for (sh, last, _), items in zip(batches, loader):
        for row, _, err in items:
            if err is not None:
                skipped.append(files[row])
                bar.write(f"skipped unreadable image {folder / files[row]} ({err})")
        _store_batch(store, items, labels, tokenizer, batch_size)
        bar.update(len(items))
        if last:
            store.codes.flush()
            store.labels.flush()
            stop = min((sh + 1) * shard_size, len(files))
            write_json_atomic(out / "shards" / f"{sh:06d}.json",
                              {"shard": sh, "rows": [sh * shard_size, stop], "skipped": skipped}, indent=1)
            skipped = []
    bar.close()
    state.wait_for_everyone()
    summary = _finish(out, plan, state, log)
    if summary["complete"] and summary["num_skipped"] == summary["num_images"]:
        raise CodesError(f"no image of {str(folder)!r} could be read ({summary['num_skipped']} unreadable); "
                         f"the codes folder {str(out)!r} holds nothing to train on")
    return summary


def _check_settings(state, tokenizer, shard_size: int, batch_size: int):
    """The accelerate state to use (a new PartialState if None), after checking the settings."""
    if state is None:
        from accelerate import PartialState
        state = PartialState(cpu=not torch.cuda.is_available())
    launched = int(os.environ.get("WORLD_SIZE", state.num_processes))
    if launched != state.num_processes:
        raise CodesError(f"{launched} processes were launched but accelerate sees {state.num_processes}; "
                         f"each would redo the others' shards")
    if tokenizer.vocab_size > np.iinfo(np.uint16).max + 1:
        raise CodesError(f"codebook size {tokenizer.vocab_size} does not fit uint16 codes")
    if shard_size < 1 or batch_size < 1:
        raise CodesError(f"shard_size and batch_size must be >= 1, got {shard_size}, {batch_size}")
    return state


def _my_batches(out: Path, plan: dict, state, max_shards: int | None, batch_size: int, log) -> list:
    """This process's unfinished shards (shard i belongs to process i % num_processes) cut into
    batches -> [(shard, last batch of the shard?, rows)]; no batch straddles two shards."""
    shard_size, n = plan["shard_size"], plan["num_images"]
    mine = [s for s in range(plan["num_shards"]) if s % state.num_processes == state.process_index]
    todo = [s for s in mine if not (out / "shards" / f"{s:06d}.json").is_file()]
    if len(todo) < len(mine):
        log(f"[rank {state.process_index}] {len(mine) - len(todo)} of {len(mine)} shards already done, skipping them")
    if max_shards is not None:
        todo = todo[:max_shards]
    batches = []
    for sh in todo:
        rows = list(range(sh * shard_size, min((sh + 1) * shard_size, n)))
        chunks = [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
        batches += [(sh, j == len(chunks) - 1, c) for j, c in enumerate(chunks)]
    return batches


def _store_batch(store: CodeStore, items: list, labels: list[int], tokenizer, batch_size: int) -> None:
    """Encode the readable views of ``items`` [(row, views (A, 3, S, S) or None, error)] into the
    store's rows (``batch_size`` views per tokenizer call); unreadable rows get the UNREADABLE label."""
    good = [(row, views) for row, views, err in items if err is None]
    for row, _, err in items:
        if err is not None:
            store.labels[row] = UNREADABLE
    if not good:
        return
    views = torch.cat([v for _, v in good])  # (n*A, 3, S, S)
    toks = torch.cat([tokenizer.encode(v).cpu() for v in views.split(batch_size)])
    _check_codes(toks, tokenizer, len(views), store.codes.shape[2:])
    toks = toks.numpy().astype(np.uint16).reshape(len(good), -1, *toks.shape[1:])
    for (row, _), t in zip(good, toks):
        store.codes[row] = t
        store.labels[row] = labels[row]


def _check_codes(toks: torch.Tensor, tokenizer, n: int, grid: tuple[int, int]) -> None:
    """A tokenizer keeps its protocol: ``encode`` of n views gives (n, H, W) ids in [0, vocab_size)."""
    if tuple(toks.shape) != (n, *grid):
        raise CodesError(f"tokenizer {tokenizer.identity!r} encoded {n} images to codes of shape "
                         f"{tuple(toks.shape)}; expected ({n}, {grid[0]}, {grid[1]}) from its grid")
    if toks.numel() and not 0 <= int(toks.min()) <= int(toks.max()) < tokenizer.vocab_size:
        raise CodesError(f"tokenizer {tokenizer.identity!r} gave ids in [{int(toks.min())}, {int(toks.max())}]; "
                         f"expected ids in [0, {tokenizer.vocab_size}) (its vocab_size)")


def _finish(out: Path, plan: dict, state, log) -> dict:
    markers = [json.loads(p.read_text()) for p in sorted((out / "shards").glob("*.json"))]
    skipped = sorted(f for m in markers for f in m["skipped"])
    done, total = len(markers), plan["num_shards"]
    summary = {"done_shards": done, "num_shards": total, "complete": done == total,
               "num_images": plan["num_images"], "num_augs": plan["num_augs"], "grid": plan["grid"],
               "num_skipped": len(skipped), "skipped": skipped}
    if state.is_main_process:
        header = {**plan, "complete": done == total, "num_skipped": len(skipped), "skipped": skipped}
        write_json_atomic(out / "header.json", header, indent=1)
        if done == total:
            log(f"extracted {plan['num_images'] - len(skipped)} images x {plan['num_augs']} augmentations "
                f"-> {out} (grid {plan['grid']}); skipped {len(skipped)} unreadable images")
        else:
            log(f"stopped with {done}/{total} shards done; rerun the same command to finish "
                f"(skipped {len(skipped)} unreadable images so far)")
    return summary
