"""The embedded digits metric during training, and its floor.

``online_digits_eval`` samples ``per_class`` images of every class through ``mutor2d.sampling.images``
(the same path as sample.py, one batch, seeded from ``seed``) and scores them with the digits
classifier against the digits train split (the classifier's training data). Real held-out images
scored the same way give the floor (``digits_floor``): the best a generator can expect at that
sample count.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from ..config import section_dict
from ..sampling import images as generation
from ..sampling.config import PlainDecode
from .metrics import compute_metrics, embedded_weights, evaluator_info
from .records import make_record_fields
from .sources import DIGITS_DATA_SEED, ArrayImages, ImageSource, MetricsError, open_images

ONLINE_METRICS = ("fid", "is", "precision", "recall", "accuracy")


def online_digits_eval(model, data_cfg, per_class: int, sample_cfg, tokenizer, seed: int, *,
                       grid: tuple[int, int] | None = None, cache_dir: str | os.PathLike | None = None) -> dict:
    """{fid, is, precision, recall, accuracy} (floats) of ``per_class`` samples of each class of the
    digits data, sampled with ``sample_cfg``'s settings (cfg_scale, temperature, top_k, top_p).

    tokenizer: the data's tokenizer; ``grid`` defaults to its code grid (``tokenizer.grid``).
    Classes: 0..model.cfg.num_classes-1. ``model`` keeps its train/eval mode; the global RNG is not
    used."""
    if data_cfg.name != "digits":
        raise MetricsError(f"online evaluation: data.name={data_cfg.name!r}, the embedded metric needs 'digits'")
    grid = tuple(int(v) for v in (grid or tokenizer.grid))
    classes = list(range(model.cfg.num_classes))
    labels = generation.balanced_labels(per_class * len(classes), classes)
    plain = dataclasses.replace(sample_cfg, decode=PlainDecode())    # exact modes sample the same distribution
    images = generation.sample_images(model, tokenizer, grid, plain, labels, seed, batch_size=len(labels))
    samples = ImageSource("online", ArrayImages(images), labels.numpy())
    weights = embedded_weights("digits", data_cfg.data_seed, cache_dir)
    device = next(model.parameters()).device
    res = compute_metrics(samples, open_images("digits:train", data_cfg.data_seed), features="digits",
                          weights_path=weights, metrics=("fid", "is", "prc"), device=device.type, use_cache=False)
    return {k: res.metrics[k] for k in ONLINE_METRICS if k in res.metrics}


def online_record(cfg, step: int, metrics: dict) -> dict:
    """The record of one online evaluation (the fields eval/fid.py's records hold): samples named
    ``online_stepN``, plain decoding with the run's sample settings, the digits classifier's features
    against digits:train."""
    s = cfg.sample
    sampling = {"cfg_scale": s.cfg_scale, "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
                "seed": s.seed, "decode": "plain", "step": step, "source": "online (train.eval_every)"}
    return make_record_fields(
        metrics=metrics, evaluator=evaluator_info("digits", embedded_weights("digits", cfg.data.data_seed)),
        reference="digits:train", reference_detail={"n": None, "stored_stats": False}, sampling=sampling,
        n=cfg.train.eval_per_class * cfg.model.num_classes, samples=f"online_step{step:08d}",
        config=cfg.to_dict(), objective=section_dict(cfg.objective))


def digits_floor(n: int | None = None, data_seed: int = DIGITS_DATA_SEED, cache_dir=None) -> dict:
    """The embedded metric of real held-out digits (test split, or its first ``n`` images after a
    fixed shuffle) against the train split."""
    test = open_images("digits:test", data_seed)
    if n is not None:
        if not 5 <= n <= len(test.dataset):
            raise MetricsError(f"n={n}: expected 5..{len(test.dataset)} (the size of the digits test split)")
        idx = np.random.default_rng(0).permutation(len(test.dataset))[:n]
        test = ImageSource(test.name, ArrayImages(test.dataset.images[idx]), test.labels[idx])
    return compute_metrics(test, open_images("digits:train", data_seed), features="digits",
                           weights_path=embedded_weights("digits", data_seed, cache_dir),
                           metrics=("fid", "is", "prc"), use_cache=False).metrics
