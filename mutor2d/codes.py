"""Pre-tokenised image data: an ImageFolder tree -> token grids on disk.

Store layout (one folder):
  header.json   grid, codebook_size, num_images, num_augs, augmentations, classes, source folder,
                image_size, tokenizer path + sha256, shards, skipped images, complete flag
  codes.npy     uint16 (num_images, num_augs, H, W), memory-mapped (np.load(mmap_mode="r"))
  labels.npy    int64 (num_images,); -1 = unreadable image (skipped), not filled yet otherwise
  files.txt     image paths relative to the source folder, one per row of codes.npy
  shards/       one JSON marker per finished shard (rows it wrote, the images it skipped)

Augmentations (deterministic list, ADM-style): "center" is ADM's centre crop at image_size;
"tl", "tr", "bl", "br" are corner crops of the ADM centre crop at image_size * crop_range;
with flips each crop is followed by its horizontal mirror ("center+flip", ...).

Extraction is resumable: a rerun with the same settings skips shards whose marker exists. Work is
split over processes (accelerate): shard i belongs to process i % num_processes.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".ppm"}
CROPS = ("center", "tl", "tr", "bl", "br")
FORMAT = "mutor2d-codes/1"


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


def open_store(path: str | os.PathLike, require_complete: bool = True) -> CodeStore:
    path = Path(path)
    if not (path / "header.json").is_file():
        raise CodesError(f"{str(path)!r} is not a codes folder (no header.json); "
                         f"make one with tokenizers/extract_codes.py")
    header = json.loads((path / "header.json").read_text())
    if header.get("format") != FORMAT:
        raise CodesError(f"{str(path)!r}: unknown codes format {header.get('format')!r}, expected {FORMAT!r}")
    if require_complete and not header.get("complete"):
        done = len(list((path / "shards").glob("*.json")))
        raise CodesError(f"codes at {str(path)!r} are incomplete ({done}/{header['num_shards']} shards); "
                         f"rerun tokenizers/extract_codes.py with the same arguments to finish")
    codes = np.load(path / "codes.npy", mmap_mode="r")
    labels = np.load(path / "labels.npy", mmap_mode="r")
    return CodeStore(path, codes, labels, header)


def _write_json_atomic(obj, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


_PLAN_KEYS = ("source", "num_images", "files_sha256", "classes", "image_size", "augmentations",
              "crop_range", "grid", "codebook_size", "tokenizer_sha256", "shard_size", "num_shards")


def _plan(source: Path, files: list[str], classes: list[str], tokenizer, tokenizer_path: str,
          names: list[str], crop_range: float, shard_size: int) -> dict:
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
        "tokenizer": str(Path(tokenizer_path).resolve()),
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
    if out.exists() and any(out.iterdir()):
        raise CodesError(f"output folder {str(out)!r} exists and is not a codes folder; use an empty or new one")
    out.mkdir(parents=True, exist_ok=True)
    (out / "shards").mkdir(exist_ok=True)
    h, w = plan["grid"]
    np.lib.format.open_memmap(out / "codes.npy", mode="w+", dtype=np.uint16,
                              shape=(len(files), plan["num_augs"], h, w)).flush()
    np.save(out / "labels.npy", np.full(len(files), -1, dtype=np.int64))
    (out / "files.txt").write_text("".join(f + "\n" for f in files))
    _write_json_atomic(plan, out / "header.json")


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


def extract(folder: str | os.PathLike, out: str | os.PathLike, tokenizer, tokenizer_path: str, *,
            num_crops: int = 1, flip: bool = True, crop_range: float = 1.1, shard_size: int = 1024,
            batch_size: int = 64, num_workers: int = 0, max_shards: int | None = None,
            state=None, progress: bool = True, log=print) -> dict:
    """Tokenise every image of ``folder`` under every augmentation into the store at ``out``.

    tokenizer: a VQTokenizer (``encode``, ``grid``, ``image_size``, ``vocab_size``, ``sha256``).
    state: an accelerate state (process_index, num_processes, wait_for_everyone, is_main_process);
    default: accelerate.PartialState(). max_shards: stop this process after that many new shards
    (the store stays resumable). Returns a summary dict (done/total shards, skipped, complete)."""
    from tqdm import tqdm
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
    folder, out = Path(folder), Path(out)
    files, labels, classes = scan_image_folder(folder)
    names = augmentation_names(num_crops, flip)
    plan = _plan(folder, files, classes, tokenizer, tokenizer_path, names, crop_range, shard_size)
    if state.is_main_process:
        _prepare(out, plan, files, labels)
    state.wait_for_everyone()
    if not state.is_main_process:
        _prepare(out, plan, files, labels)  # checks only: the main process created it
    codes = np.load(out / "codes.npy", mmap_mode="r+")
    label_arr = np.load(out / "labels.npy", mmap_mode="r+")

    mine = [s for s in range(plan["num_shards"]) if s % state.num_processes == state.process_index]
    todo = [s for s in mine if not (out / "shards" / f"{s:06d}.json").is_file()]
    if len(todo) < len(mine):
        log(f"[rank {state.process_index}] {len(mine) - len(todo)} of {len(mine)} shards already done, skipping them")
    if max_shards is not None:
        todo = todo[:max_shards]
    # one loader for all of this process's shards; no batch straddles two shards
    plan_batches = []  # (shard, last batch of the shard?, rows)
    for sh in todo:
        rows = list(range(sh * shard_size, min((sh + 1) * shard_size, len(files))))
        chunks = [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
        plan_batches += [(sh, j == len(chunks) - 1, c) for j, c in enumerate(chunks)]
    loader = torch.utils.data.DataLoader(
        _Images(folder, files, plan["image_size"], names, crop_range),
        batch_sampler=[rows for _, _, rows in plan_batches], num_workers=num_workers, collate_fn=_collate)
    bar = tqdm(total=sum(len(r) for _, _, r in plan_batches), desc=f"extract[{state.process_index}]",
               unit="img", disable=not progress, position=state.process_index)
    skipped: list[str] = []
    for (sh, last, _), items in zip(plan_batches, loader):
        good = []
        for row, views, err in items:
            if err is None:
                good.append((row, views))
            else:
                skipped.append(files[row])
                label_arr[row] = -1
                bar.write(f"skipped unreadable image {folder / files[row]} ({err})")
        if good:
            views = torch.cat([v for _, v in good])  # (n*A, 3, S, S), encoded batch_size at a time
            toks = torch.cat([tokenizer.encode(v).cpu() for v in views.split(batch_size)])
            toks = toks.numpy().astype(np.uint16).reshape(len(good), len(names), *toks.shape[1:])
            for (row, _), t in zip(good, toks):
                codes[row] = t
                label_arr[row] = labels[row]
        bar.update(len(items))
        if last:
            codes.flush()
            label_arr.flush()
            stop = min((sh + 1) * shard_size, len(files))
            _write_json_atomic({"shard": sh, "rows": [sh * shard_size, stop], "skipped": skipped},
                               out / "shards" / f"{sh:06d}.json")
            skipped = []
    bar.close()
    state.wait_for_everyone()
    return _finish(out, plan, state, log)


def _finish(out: Path, plan: dict, state, log) -> dict:
    markers = [json.loads(p.read_text()) for p in sorted((out / "shards").glob("*.json"))]
    skipped = sorted(f for m in markers for f in m["skipped"])
    done, total = len(markers), plan["num_shards"]
    summary = {"done_shards": done, "num_shards": total, "complete": done == total,
               "num_images": plan["num_images"], "num_augs": plan["num_augs"], "grid": plan["grid"],
               "num_skipped": len(skipped), "skipped": skipped}
    if state.is_main_process:
        header = {**plan, "complete": done == total, "num_skipped": len(skipped), "skipped": skipped}
        _write_json_atomic(header, out / "header.json")
        if done == total:
            log(f"extracted {plan['num_images'] - len(skipped)} images x {plan['num_augs']} augmentations "
                f"-> {out} (grid {plan['grid']}); skipped {len(skipped)} unreadable images")
        else:
            log(f"stopped with {done}/{total} shards done; rerun the same command to finish "
                f"(skipped {len(skipped)} unreadable images so far)")
    return summary
