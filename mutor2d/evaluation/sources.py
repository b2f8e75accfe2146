"""Image sources, each giving uint8 images (3, H, W) to torch-fidelity: a sample file or npz (images/arr_0,
labels, meta, mu/sigma; streamed when large), a png/jpg folder, digits:SPLIT or photos:SPLIT. npz files
are read with allow_pickle=False and weights with weights_only=True (``load_tensors``)."""
from __future__ import annotations

import json
import os
import pickle
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from ..data.photos import photo_crops
from ..io import shown_path
from ..data.tokens import digits_images
from ..sampling.images import to_uint8
from .options import DIGITS_DATA_SEED, MetricsError, reference_data_set

LAZY_BYTES = 1 << 30     # npz image arrays above this size are streamed, not loaded


class ArrayImages(Dataset):
    """In-memory uint8 images (N, H, W, 3) -> items uint8 (3, H, W)."""

    def __init__(self, images: np.ndarray, name: str = "images"):
        images = np.asarray(images)
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
            raise MetricsError(f"{name}: expected uint8 (N, H, W, 3), got {images.dtype} {images.shape}")
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> Tensor:
        return torch.from_numpy(np.ascontiguousarray(self.images[i])).permute(2, 0, 1)


class NpzImages(Dataset):
    """One uint8 (N, H, W, 3) npz array, read image by image from its zip member (a handle per process)."""

    def __init__(self, path: str | os.PathLike, key: str):
        self.path, self.key = str(path), key
        with zipfile.ZipFile(self.path) as z, z.open(f"{key}.npy") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            self.offset = f.tell()
        if dtype != np.uint8 or len(shape) != 4 or shape[-1] != 3 or fortran:
            raise MetricsError(f"{self.path}: '{key}' must be uint8 (N, H, W, 3) in C order, "
                               f"got {dtype} {shape}{' (Fortran order)' if fortran else ''}")
        self.shape = tuple(shape)
        self.item_bytes = int(np.prod(shape[1:]))
        self._handle, self._pid = None, None

    def __getstate__(self):
        return {**self.__dict__, "_handle": None, "_pid": None}

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, i: int) -> Tensor:
        if self._pid != os.getpid():                 # a handle per process (None after pickling)
            self._handle, self._pid = zipfile.ZipFile(self.path).open(f"{self.key}.npy"), os.getpid()
        self._handle.seek(self.offset + i * self.item_bytes)
        img = np.frombuffer(self._handle.read(self.item_bytes), dtype=np.uint8).reshape(self.shape[1:])
        return torch.from_numpy(img.copy()).permute(2, 0, 1)


@dataclass
class ImageSource:
    """Images to score: ``dataset`` of uint8 (3, H, W), ``labels`` (N,), sample ``meta``, stored FID
    ``mu``/``sigma``; ``identity`` keys the feature cache."""
    name: str
    dataset: Dataset | None
    labels: np.ndarray | None = None
    meta: dict = field(default_factory=dict)
    mu: np.ndarray | None = None
    sigma: np.ndarray | None = None
    identity: str = ""

    @property
    def n(self) -> int | None:
        return len(self.dataset) if self.dataset is not None else None

    @property
    def data_set(self) -> str | None:
        """digits/photos for digits:SPLIT/photos:SPLIT, a sample file's run's ``data.name``, else None."""
        return reference_data_set(self.name) or ((self.meta.get("config") or {}).get("data") or {}).get("name")

    @property
    def image_size(self) -> tuple[int, int] | None:
        """(H, W) of the first image; None without images (stored mu/sigma only)."""
        return tuple(self.dataset[0].shape[-2:]) if self.dataset is not None and len(self.dataset) else None


def digits_uint8(split: str, data_seed: int = DIGITS_DATA_SEED) -> tuple[np.ndarray, np.ndarray]:
    """The digits split as sample images: uint8 (n, 8, 8, 3) and labels (n,)."""
    images, labels = digits_images(split, data_seed)
    return to_uint8(images.unsqueeze(1).expand(-1, 3, -1, -1)), labels.numpy()


PHOTOS_SIDE = 32                                          # photos:SPLIT images, pixels a side
PHOTOS_REFERENCE_COUNT = {"train": 10000, "test": 5000}   # images of photos:train / photos:test


def photos_uint8(split: str, count: int | None = None, data_seed: int = DIGITS_DATA_SEED) -> tuple[np.ndarray, np.ndarray]:
    """The first ``count`` (default PHOTOS_REFERENCE_COUNT) 32 px crops: uint8 (n, 32, 32, 3), labels (n,)."""
    if split not in PHOTOS_REFERENCE_COUNT:
        raise MetricsError(f"photos:{split}: expected photos:train or photos:test")
    return photo_crops(split, count or PHOTOS_REFERENCE_COUNT[split], PHOTOS_SIDE, data_seed)


def open_images(spec: str | os.PathLike, data_seed: int = DIGITS_DATA_SEED,
                lazy_bytes: int = LAZY_BYTES) -> ImageSource:
    """The ImageSource of ``spec`` (module doc); npz arrays over ``lazy_bytes`` stream (NpzImages)."""
    spec = str(spec)
    if spec.startswith("photos:"):
        images, labels = photos_uint8(spec.split(":", 1)[1], data_seed=data_seed)
        return ImageSource(spec, ArrayImages(images), labels, identity=f"{spec}|seed{data_seed}|{len(labels)}")
    if spec.startswith("digits:"):
        split = spec.split(":", 1)[1]
        if split not in ("train", "test"):
            raise MetricsError(f"{spec!r}: expected digits:train or digits:test")
        images, labels = digits_uint8(split, data_seed)
        return ImageSource(spec, ArrayImages(images), labels, identity=f"{spec}|seed{data_seed}")
    path = Path(spec)
    if path.is_dir():
        from torch_fidelity.datasets import ImagesPathDataset
        from torch_fidelity.utils import glob_samples_paths
        files = glob_samples_paths(str(path), False, "png,jpg,jpeg", verbose=False)
        if not files:
            raise MetricsError(f"{spec}: folder holds no png/jpg/jpeg images")
        latest = max(os.stat(f).st_mtime_ns for f in files)
        return ImageSource(spec, ImagesPathDataset(files), identity=f"{path.resolve()}|{len(files)}|{latest}")
    if not path.is_file():
        raise MetricsError(f"{shown_path(spec)}: no such file or folder (expected an npz, an image folder or digits:train/test)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return _open_npz(spec, path, npz, lazy_bytes)
    except MetricsError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise MetricsError(f"{spec}: not a readable npz ({type(e).__name__}: {e})") from None


def _open_npz(spec: str, path: Path, npz, lazy_bytes: int) -> ImageSource:
    keys = set(npz.files)
    key = "images" if "images" in keys else "arr_0" if "arr_0" in keys else None
    has_stats = {"mu", "sigma"} <= keys
    if key is None and not has_stats:
        raise MetricsError(f"{spec}: npz has neither images ('images' or 'arr_0') nor 'mu'/'sigma' "
                           f"(keys: {sorted(keys)})")
    images = None
    if key:
        with zipfile.ZipFile(path) as z:
            big = z.getinfo(f"{key}.npy").file_size > lazy_bytes
        images = NpzImages(path, key) if big else ArrayImages(npz[key], f"{spec}: '{key}'")
    st = path.stat()
    src = ImageSource(spec, images, identity=f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}")
    if has_stats:
        src.mu, src.sigma = npz["mu"].astype(np.float64), npz["sigma"].astype(np.float64)
        if src.mu.ndim != 1 or src.sigma.shape != (len(src.mu), len(src.mu)):
            raise MetricsError(f"{spec}: mu {src.mu.shape} / sigma {src.sigma.shape} are not (D,) / (D, D)")
    label_key = "labels" if "labels" in keys else "arr_1" if "arr_1" in keys else None
    if label_key and key:
        src.labels = npz[label_key].astype(np.int64)
        if src.labels.shape != (src.n,):
            raise MetricsError(f"{spec}: labels of shape {src.labels.shape} for {src.n} images")
    if "meta" in keys:
        try:
            src.meta = json.loads(str(npz["meta"]))
        except json.JSONDecodeError as e:
            raise MetricsError(f"{spec}: 'meta' is not JSON ({e})") from None
        if not isinstance(src.meta, dict):
            raise MetricsError(f"{spec}: 'meta' is JSON but not an object")
    return src


def load_tensors(path: str | os.PathLike, what: str):
    """``torch.load(path, weights_only=True)`` on the CPU; else a one-line MetricsError naming the file."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise MetricsError(f"{what} {shown_path(path)} does not exist") from None
    except pickle.UnpicklingError as e:
        raise MetricsError(f"{what} {str(path)!r} is refused: it holds more than tensors and plain "
                           f"containers, and unpickling it could run code ({_unpickler_reason(e)})") from None
    except (RuntimeError, OSError, EOFError, ValueError) as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise MetricsError(f"{what} {str(path)!r} is unreadable ({type(e).__name__}: {first})") from None


def _unpickler_reason(error: Exception) -> str:
    """The line of torch's weights-only refusal saying what it met, without the advice."""

    text = str(error).split("WeightsUnpickler error:", 1)[-1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0].split(" Please ")[0].rstrip(".") if lines else type(error).__name__
