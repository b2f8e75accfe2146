"""Photo crops: plentiful natural images in the paper's token geometry, with nothing to download.

Ten colour photographs ship inside installed packages (scikit-learn: china, flower; scikit-image:
astronaut, chelsea, coffee, hubble_deep_field, ihc, motorcycle_left, retina, rocket). An image is a
random square crop of one of them: the class is the photograph; the crop's side is log-uniform in
[1/8, 1/2] of the photograph's short side, its position uniform, mirrored with probability 1/2,
then area-resized to ``size`` pixels. Image ``i`` of a split is a pure function of (seed, split, i)
(:func:`crop_params`): a split never repeats an image and never needs storing. Labels are balanced
(image i has class i mod 10).

    python -m mutor2d.data.photos export data/photos --train 50000 --test 1000 --size 32
writes data/photos/train/CLASS/NNNNNN.png and data/photos/test/... (ImageFolder trees for
tokenizers/train_vq.py and tokenizers/extract_codes.py).
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import numpy as np

from ..cli import HelpFormatter

PHOTOS = (("sklearn", "datasets/images/china.jpg"), ("sklearn", "datasets/images/flower.jpg"),
          ("skimage", "data/astronaut.png"), ("skimage", "data/chelsea.png"), ("skimage", "data/coffee.png"),
          ("skimage", "data/hubble_deep_field.jpg"), ("skimage", "data/ihc.png"),
          ("skimage", "data/motorcycle_left.png"), ("skimage", "data/retina.jpg"), ("skimage", "data/rocket.jpg"))
CLASSES = tuple(Path(rel).stem for _, rel in PHOTOS)
SPLITS = {"train": 0, "test": 1}
SIDE = (1 / 8, 1 / 2)           # crop side, as a share of the photograph's short side (log-uniform)
COUNT_LIMIT = 10_000_000        # images of a split (held in memory as uint8)
SIZE_LIMIT = 256                # pixels a side


class PhotosError(ValueError):
    """A photograph that is not installed, or a bad request; one line."""


def photo_files() -> list[dict]:
    """{"name", "path", "sha256"} of each photograph (sha256 null when its package lacks it)."""
    from .. import provenance
    return [provenance.package_file(pkg, rel, name) for (pkg, rel), name in zip(PHOTOS, CLASSES)]


def photos_fingerprint() -> dict:
    """The ten photographs' fingerprint: the sha256 of their sha256s in class order."""
    from .. import provenance
    files = photo_files()
    missing = [f["name"] for f in files if not f["sha256"]]
    if missing:
        raise PhotosError(f"photographs {missing} are not installed: pip install scikit-learn scikit-image")
    return {"name": "photos", "sha256": provenance.text_sha256("\n".join(f["sha256"] for f in files)),
            "files": {f["name"]: f["sha256"] for f in files}}


@functools.lru_cache(maxsize=1)
def load_photos() -> tuple:
    """The photographs as uint8 RGB arrays (H, W, 3), in class order."""
    from PIL import Image
    arrays = []
    for f in photo_files():
        if not f["path"]:
            raise PhotosError(f"photograph {f['name']!r} is not installed: pip install scikit-learn scikit-image")
        with Image.open(f["path"]) as im:
            arrays.append(np.asarray(im.convert("RGB")))
    return tuple(arrays)


def crop_params(split: str, start: int, count: int, seed: int) -> np.ndarray:
    """(count, 5) float: class, side share, top share, left share, mirror (0/1) of images
    start..start+count-1 of ``split``; each image's row depends only on (seed, split, its index)."""
    if split not in SPLITS:
        raise PhotosError(f"split {split!r}: expected one of {list(SPLITS)}")
    rows = []
    for i in range(start, start + count):
        u = np.random.default_rng((seed, SPLITS[split], i)).random(4)
        side = np.exp(np.log(SIDE[0]) + u[0] * (np.log(SIDE[1]) - np.log(SIDE[0])))
        rows.append((i % len(PHOTOS), side, u[1], u[2], float(u[3] < 0.5)))
    return np.array(rows, dtype=np.float64).reshape(count, 5)


def render(params: np.ndarray, size: int) -> np.ndarray:
    """uint8 (n, size, size, 3) crops for rows of :func:`crop_params`."""
    from PIL import Image
    photos, out = load_photos(), np.empty((len(params), size, size, 3), dtype=np.uint8)
    for k, (label, side, top, left, mirror) in enumerate(params):
        photo = photos[int(label)]
        h, w = photo.shape[:2]
        s = max(int(round(side * min(h, w))), size // 2, 1)
        y, x = int(top * (h - s)), int(left * (w - s))
        crop = Image.fromarray(photo[y:y + s, x:x + s]).resize((size, size), Image.BOX)
        arr = np.asarray(crop)
        out[k] = arr[:, ::-1] if mirror else arr
    return out


def photo_crops(split: str, count: int, size: int = 32, seed: int = 1234) -> tuple[np.ndarray, np.ndarray]:
    """The first ``count`` images of ``split``: uint8 (count, size, size, 3) and labels (count,) int64."""
    if not 1 <= count <= COUNT_LIMIT:
        raise PhotosError(f"count {count}: expected 1..{COUNT_LIMIT} images")
    if not 8 <= size <= SIZE_LIMIT:
        raise PhotosError(f"size {size}: expected 8..{SIZE_LIMIT} pixels")
    params = crop_params(split, 0, count, seed)
    return render(params, size), params[:, 0].astype(np.int64)


def export(out: Path, split: str, count: int, size: int, seed: int) -> Path:
    """OUT/SPLIT/CLASS/NNNNNN.png for the first ``count`` images of ``split`` (files already there
    are kept: a rerun completes an interrupted export)."""
    from PIL import Image
    root = Path(out) / split
    for name in CLASSES:
        (root / name).mkdir(parents=True, exist_ok=True)
    chunk = 4096
    for start in range(0, count, chunk):
        params = crop_params(split, start, min(chunk, count - start), seed)
        paths = [root / CLASSES[int(label)] / f"{start + k:06d}.png" for k, label in enumerate(params[:, 0])]
        todo = [k for k, path in enumerate(paths) if not path.is_file()]
        if not todo:
            continue
        for k, img in zip(todo, render(params[todo], size)):
            tmp = paths[k].with_suffix(".tmp.png")
            Image.fromarray(img).save(tmp)
            tmp.replace(paths[k])
    return root


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Export photo crops as ImageFolder trees (OUT/train, OUT/test).",
                                 formatter_class=HelpFormatter)
    ap.add_argument("command", choices=["export"], help="export: write the crops as PNG files")
    ap.add_argument("out", help="output folder")
    ap.add_argument("--train", type=int, default=50000, help="training images (default 50000)")
    ap.add_argument("--test", type=int, default=1000, help="test images (default 1000)")
    ap.add_argument("--size", type=int, default=32, help="pixels a side (default 32)")
    ap.add_argument("--seed", type=int, default=1234, help="data seed (default 1234, data.data_seed's)")
    return ap


def main(argv=None) -> None:
    ap = build_parser()
    args = ap.parse_args(argv)
    for flag, value, low, high in (("--train", args.train, 0, COUNT_LIMIT), ("--test", args.test, 0, COUNT_LIMIT),
                                   ("--size", args.size, 8, SIZE_LIMIT), ("--seed", args.seed, 0, 2**63 - 1)):
        if not low <= value <= high:
            ap.error(f"{flag} {value}: expected {low}..{high}")
    try:
        for split, count in (("train", args.train), ("test", args.test)):
            if count:
                print(f"{split}: {export(Path(args.out), split, count, args.size, args.seed)}", flush=True)
    except (PhotosError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    from ..preempt import exit_on_ctrl_c
    exit_on_ctrl_c()        # python -m: a Ctrl-C mid-way is one line, exit 130
    main()
