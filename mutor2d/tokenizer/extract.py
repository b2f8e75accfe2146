"""Extraction: every image of an ImageFolder tree under every augmentation -> the token grids of a
store (mutor2d.tokenizer.codes) through a tokenizer.

Extraction is resumable: a rerun with the same settings skips shards whose marker exists. Work is
split over processes (accelerate): shard i belongs to process i % num_processes.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..io import remove_stale_temps, write_json_atomic
from .codes import FORMAT, UNREADABLE, CodesError, CodeStore, open_array
from .image_folder import augment, augmentation_names, scan_image_folder


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


def _prepare(out: Path, plan: dict, files: list[str]) -> None:
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
        _prepare(out, plan, files)
        for where in (out, out / "shards"):  # temp files of writes killed in an earlier run
            remove_stale_temps(where)
    state.wait_for_everyone()
    if not state.is_main_process:
        _prepare(out, plan, files)  # checks only: the main process created it
    h, w = plan["grid"]
    store = CodeStore(out, open_array(out / "codes.npy", np.uint16, (len(files), plan["num_augs"], h, w), "r+"),
                      open_array(out / "labels.npy", np.int64, (len(files),), "r+"), plan)
    batches = _my_batches(out, plan, state, max_shards, batch_size, log)
    loader = torch.utils.data.DataLoader(
        _Images(folder, files, plan["image_size"], names, crop_range),
        batch_sampler=[rows for _, _, rows in batches], num_workers=num_workers, collate_fn=list)
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
    store.labels[[row for row, _, err in items if err is not None]] = UNREADABLE
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
