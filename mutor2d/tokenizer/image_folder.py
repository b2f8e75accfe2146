"""An ImageFolder tree (one subfolder per class) and the augmented views of its images.

Augmentations (deterministic list, ADM-style): "center" is ADM's centre crop at image_size;
"tl", "tr", "bl", "br" are corner crops of the ADM centre crop at image_size * crop_range;
with flips each crop is followed by its horizontal mirror ("center+flip", ...).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..io import shown_path
from .codes import CodesError

IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".ppm"}
CROPS = ("center", "tl", "tr", "bl", "br")


# ----------------------------------------------------------------------------- image folder

def scan_image_folder(root: str | os.PathLike) -> tuple[list[str], list[int], list[str]]:
    """An ImageNet-train-style tree (one subfolder per class) -> (relative paths, labels, classes).

    Classes are the sorted subfolder names; files are sorted within each class."""
    root = Path(root)
    if not root.is_dir():
        raise CodesError(f"image folder {shown_path(root)} does not exist or is not a folder")
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
    return [name for c in CROPS[:num_crops] for name in ([c, f"{c}+flip"] if flip else [c])]


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
    crops = [n.split("+")[0] for n in names]
    views = {"center": np.asarray(center_crop_arr(img, image_size))}
    corners = [c for c in crops if c != "center"]
    if corners:
        big = max(image_size, round(image_size * crop_range))
        arr = np.asarray(center_crop_arr(img, big))
        e = big - image_size
        at = {"tl": (0, 0), "tr": (0, e), "bl": (e, 0), "br": (e, e)}
        for c in corners:
            y, x = at[c]
            views[c] = arr[y:y + image_size, x:x + image_size]
    out = [views[c][:, ::-1] if n.endswith("+flip") else views[c] for c, n in zip(crops, names)]
    return torch.from_numpy(np.stack(out).copy()).permute(0, 3, 1, 2).float() / 255.0
