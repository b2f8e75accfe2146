"""The evaluators' names and defaults that command lines need before importing torch: the metrics,
the feature extractors, the cache folder, the seed of the digits split, and :class:`MetricsError`.
Light (no torch): eval/fid.py and experiments/compare.py parse and check their flags with them; sources,
digits and metrics take them from here.
"""
from __future__ import annotations

import os
from pathlib import Path

DIGITS_DATA_SEED = 1234  # data.data_seed default: the split the digits runs train on
DEFAULT_CACHE = Path(os.environ.get("MUTOR2D_CACHE", "~/.cache/mutor2d"))  # classifier, feature caches
DIGITS = "mutor2d-digits"                 # the digits classifier, a torch-fidelity feature extractor
INCEPTION = "inception-v3-compat"
PHOTOS = "mutor2d-photos"                 # the photo-crops classifier (mutor2d.evaluation.photos)
FEATURES = {"inception": INCEPTION, "digits": DIGITS, "photos": PHOTOS}
EMBEDDED = ("digits", "photos")           # classifiers trained here: they also give the samples' class accuracy
METRICS = ("fid", "is", "prc", "kid")


def reference_data_set(name: str) -> str | None:
    """The data set of a built-in reference NAME:SPLIT (``digits:train`` -> ``digits``, also ``photos``);
    None for another reference (a file, which says nothing of its data set)."""
    return name.split(":", 1)[0] if name.startswith(tuple(f"{d}:" for d in EMBEDDED)) else None


class MetricsError(ValueError):
    """Bad evaluation input; the message is one line naming the bad value."""
