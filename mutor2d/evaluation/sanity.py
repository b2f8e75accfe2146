"""Sanity checks of an evaluator trained here, against answers known without it: real images
against real ones, degraded ones, true and shuffled labels. The photo crops' (``sanity_check``)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .metrics import compute_metrics
from .photos import PhotosClassifierSettings, photos_classifier_path
from .sources import ArrayImages, ImageSource, open_images, photos_uint8


def sanity_check(n: int = 2000, settings: PhotosClassifierSettings | None = None, cache_dir=None) -> dict:
    """The evaluator against known answers, on ``n`` real test crops scored against photos:train:
    ``fid_real`` (real vs real: near 0), ``fid_blurred`` (the same crops at a quarter of the
    resolution, upsampled: far larger), ``accuracy_real`` (the classes: near 1) and
    ``accuracy_shuffled`` (the same images with their labels permuted: near 1/10)."""
    settings = settings or PhotosClassifierSettings()
    weights = photos_classifier_path(settings, cache_dir)
    images, labels = photos_uint8("test", n, settings.data_seed)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float()
    blurred = F.interpolate(F.avg_pool2d(x, 4), scale_factor=4, mode="bilinear").round().clamp(0, 255)
    blurred = blurred.to(torch.uint8).permute(0, 2, 3, 1).numpy()
    shuffled = np.random.default_rng(0).permutation(labels)
    reference = open_images("photos:train", settings.data_seed)

    def score(arr, lab):
        return compute_metrics(ImageSource("check", ArrayImages(arr), lab), reference, features="photos",
                               weights_path=weights, metrics=("fid",), use_cache=False).metrics
    real, blur, shuf = score(images, labels), score(blurred, labels), score(images, shuffled)
    return {"fid_real": real["fid"], "fid_blurred": blur["fid"], "accuracy_real": real["accuracy"],
            "accuracy_shuffled": shuf["accuracy"], "n": n}
