"""The one path from a model to images: prefixes and seeds, uint8 images, PNG grids, npz sample files.

Every caller (sample.py, training sample grids, online evaluation, the digits study) goes through
``make_sampler`` -> ``sample_batches``: the prefixes (what the model's conditioning kind takes: class
labels, ...) are cut into batches of ``batch_size`` consecutive prefixes (choice-major order: the
kind's ``balanced``) and batch k is one decoding run seeded with ``shard_seed(seed, k)``. So a grid
written during training equals ``sample.py`` on that checkpoint with the same settings, seed and
batch size. The kind also names the grid's rows (``row_label``) and stores the prefixes in npz files
(``npz``: sample files written in shards by the same batches).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..model.conditioning import Conditioning, conditioning
from ..io import write_atomic
from .values import SampleFileError, check_classes, parse_classes  # noqa: F401 (re-exported)
from .decoding import decoding_mode, run_decoder, unwrap_model
from .rounds import Progress
from .rules import SamplingRules
from .stats import DecodeStats
from ..cli import grid_arg
from ..checkpoint import inference
from ..data.tokens import build_tokenizer

Sampler = Callable[[Tensor, int], np.ndarray]  # (prefixes (n, ...), seed) -> uint8 images (n, h, w, 3)
SETTINGS = ("cfg_scale", "temperature", "top_k", "top_p")
GRID_MIN_SIDE = 64    # grid cells smaller than this are enlarged (nearest) by an integer factor
GRID_PAD = 2          # pixels between and around grid cells (white)
GRID_MIN_PNG_SIDE = 256   # a smaller grid (e.g. one sample a class) is enlarged as a whole to this
SPREAD = 10           # classes in a grid when none are named
LABEL_CHARS = 28      # row labels longer than this are cut ("...") in a grid's margin
LABEL_PAD = 4         # pixels left and right of the row labels


# ----------------------------------------------------------------------------- labels, seeds, settings

def spread_classes(num_choices: int, count: int = SPREAD) -> list[int]:
    """``count`` choice indices (class labels: classes) evenly spread over 0..num_choices-1 (all of
    them if there are fewer)."""
    if num_choices <= count:
        return list(range(num_choices))
    return [round(i * (num_choices - 1) / (count - 1)) for i in range(count)]


def grid_classes(sample_cfg, num_choices: int) -> list[int]:
    """The rows of a sample grid, indices into the kind's ``num_choices`` choices (class labels: the
    classes): ``sample.classes`` (checked), else a spread of them."""
    if sample_cfg.classes:
        return check_classes(sample_cfg.classes, num_choices, "sample.classes")
    return spread_classes(num_choices)


def balanced_prefixes(kind: Conditioning, model_cfg, num: int, picks: list[int]) -> Tensor:
    """(num, ...) prefixes of ``kind``: num / len(picks) of each of its choices ``picks`` (class
    labels: the classes), choice-major (c0 c0 … c1 c1 …)."""
    if num < 1 or num % len(picks):
        raise SampleFileError(f"--num {num}: must be a positive multiple of the number of classes "
                              f"({len(picks)}) so that every class gets the same count")
    return kind.balanced(model_cfg, num // len(picks), list(picks))


def balanced_labels(num: int, classes: list[int]) -> Tensor:
    """(num,) class labels, num / len(classes) of each class, class-major (the class kind's prefixes)."""
    return balanced_prefixes(conditioning("class"), None, num, classes)


def shard_seed(seed: int, index: int) -> int:
    """The seed of shard (or batch) ``index`` of a run seeded with ``seed`` (>= 0)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SampleFileError(f"seed {seed!r}: expected an integer >= 0")
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0] >> 1)


def sampling_settings(sample_cfg) -> dict:
    """{cfg_scale, temperature, top_k, top_p} of a ``sample`` section (what a sample file's meta records)."""
    return {k: getattr(sample_cfg, k) for k in SETTINGS}


def parse_grid(text: str) -> tuple[int, int]:
    """'HxW' -> (H, W) by ``cli.grid_arg``'s rules; a one-line SampleFileError (a ValueError) here."""
    try:
        return grid_arg(text)
    except argparse.ArgumentTypeError as e:
        raise SampleFileError(str(e)) from None


# ----------------------------------------------------------------------------- images

def to_uint8(images: Tensor) -> np.ndarray:
    """images (B, 3, h, w) float in [0, 1] -> uint8 (B, h, w, 3), rounded."""
    return (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


def tokenizer_device(tokenizer) -> torch.device | None:
    """Where a tokenizer with weights (a module, or one held as ``.model``) lives; None without weights."""
    module = tokenizer if isinstance(tokenizer, torch.nn.Module) else getattr(tokenizer, "model", None)
    return next(module.parameters(), torch.empty(0)).device if isinstance(module, torch.nn.Module) else None


def tokenizer_to(tokenizer, device: torch.device):
    """Move a tokenizer with weights (a module, or an object holding one as ``.model``) to ``device``."""
    if isinstance(tokenizer, torch.nn.Module):
        return tokenizer.to(device).eval()
    if isinstance(getattr(tokenizer, "model", None), torch.nn.Module):
        tokenizer.model.to(device)
    return tokenizer


def make_sampler(model, tokenizer, grid: tuple[int, int], sample_cfg, *, objective=None,
                 device: torch.device | str | None = None, progress: Progress | None = None) -> Sampler:
    """(prefixes (n, ...), seed) -> uint8 images (n, h, w, 3): generate codes (B, H*W) on ``device``
    (default: the model's) with the settings and decoding mode (``sample_cfg.decode``, fitted to
    ``objective``, the checkpoint's objective section) of ``sample_cfg``, a checked ``sample``
    section; decode them with ``tokenizer`` on the tokenizer's device; ``progress`` sees the codes as
    they are emitted. The sampler's ``last`` holds the latest call's decoding counts and seconds (a
    DecodeStats), its ``total`` those of all its calls."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    rules = SamplingRules.of(**sampling_settings(sample_cfg))
    mode = decoding_mode(sample_cfg.decode, objective, grid)

    def sample(prefixes: Tensor, seed: int) -> np.ndarray:
        gen = torch.Generator(device).manual_seed(seed)
        stats, start = DecodeStats(), time.perf_counter()
        tokens = run_decoder(model, prefixes.to(device), grid, rules, mode, objective, gen, stats, progress=progress)
        stats.seconds = time.perf_counter() - start
        sample.last = stats
        sample.total.merge(stats)
        tokens = tokens.view(-1, *grid)
        with torch.no_grad():
            images = tokenizer.decode(tokens.to(tokenizer_device(tokenizer) or tokens.device))
        return to_uint8(images)

    sample.last, sample.total = DecodeStats(), DecodeStats()
    return sample


def sample_batches(sampler: Sampler, prefixes: Tensor, batch_size: int, seed: int,
                   kind: Conditioning | None = None) -> np.ndarray:
    """All ``prefixes`` in batches of ``batch_size`` (cut by ``kind``, default class labels); batch k
    seeded with shard_seed(seed, k)."""
    if batch_size < 1:
        raise SampleFileError(f"--batch-size {batch_size}: expected >= 1")
    kind = kind or conditioning("class")
    parts = [sampler(kind.batch(prefixes, i, i + batch_size), shard_seed(seed, k))
             for k, i in enumerate(range(0, len(prefixes), batch_size))]
    return np.concatenate(parts)


def sample_images(model, tokenizer, grid: tuple[int, int], sample_cfg, prefixes: Tensor, seed: int,
                  batch_size: int = 64, objective=None) -> np.ndarray:
    """uint8 images (len(prefixes), h, w, 3) of ``prefixes`` (the model's kind) sampled with the
    ``sample`` section ``sample_cfg``, seeded per batch from ``seed``."""
    sampler = make_sampler(model, tokenizer, grid, sample_cfg, objective=objective)
    return sample_batches(sampler, prefixes, batch_size, seed, unwrap_model(model).conditioning)


def save_grid(images: np.ndarray, ncol: int, path: str | os.PathLike, row_labels: list[str] | None = None, *,
              labels: bool = True, min_side: int = GRID_MIN_PNG_SIDE) -> Path:
    """uint8 images (B, h, w, 3) -> PNG grid with ``ncol`` columns on a white background; the
    ``row_labels`` (one per row) go into the PNG's text chunk ``rows`` (JSON) and, with ``labels``,
    into a left margin (PIL's default font, at most LABEL_CHARS characters) as wide as the widest.
    Cells smaller than GRID_MIN_SIDE are enlarged by an integer factor s, nearest-neighbour (8x8
    digits become visible). Size: (m + p + ncol·(w·s + p)) x (p + rows·(h·s + p)), p = GRID_PAD,
    m the margin (0 without labels); the cells are the same pixels either way. A grid still smaller
    than ``min_side`` on a side is then enlarged as a whole by an integer factor (nearest), margin too.
    Written atomically: a failed write (an OSError) leaves no partial file."""
    from PIL import Image, PngImagePlugin
    B, h, w, _ = images.shape
    s, pad = max(1, math.ceil(GRID_MIN_SIDE / min(h, w))), GRID_PAD
    x = images.repeat(s, axis=1).repeat(s, axis=2)
    rows = -(-B // ncol)
    canvas = np.full((pad + rows * (h * s + pad), pad + ncol * (w * s + pad), 3), 255, np.uint8)
    for i in range(B):
        r, c = divmod(i, ncol)
        y0, x0 = pad + r * (h * s + pad), pad + c * (w * s + pad)
        canvas[y0: y0 + h * s, x0: x0 + w * s] = x[i]
    image = Image.fromarray(canvas)
    if labels and row_labels:
        image = label_rows(image, row_labels, [pad + r * (h * s + pad) + h * s / 2 for r in range(rows)])
    k = math.ceil(min_side / min(image.size))
    if k > 1:
        image = image.resize((image.width * k, image.height * k), Image.NEAREST)
    path = Path(path)
    kind = Image.registered_extensions().get(path.suffix.lower())
    if kind is None:
        raise SampleFileError(f"{path}: not an image file name (expected an extension such as .png)")
    info = PngImagePlugin.PngInfo()
    if row_labels is not None:
        info.add_text("rows", json.dumps(row_labels))
    return write_atomic(path, lambda f: image.save(f, format=kind, pnginfo=info))


def label_rows(image, row_labels: list[str], centres: list[float]):
    """``image`` (PIL) with a white left margin holding ``row_labels[r]`` (cut to LABEL_CHARS), black,
    vertically centred on ``centres[r]`` (pixels from the top)."""
    from PIL import Image, ImageDraw, ImageFont
    font = ImageFont.load_default()
    texts = [t if len(t) <= LABEL_CHARS else t[:LABEL_CHARS - 3] + "..." for t in row_labels]
    boxes = [font.getbbox(t) for t in texts]
    margin = LABEL_PAD + max(math.ceil(b[2]) for b in boxes) + LABEL_PAD
    out = Image.new("RGB", (margin + image.width, image.height), "white")
    out.paste(image, (margin, 0))
    draw = ImageDraw.Draw(out)
    for text, box, y in zip(texts, boxes, centres):
        draw.text((LABEL_PAD, round(y - (box[1] + box[3]) / 2)), text, fill="black", font=font)
    return out


def write_grid(model, tokenizer, grid: tuple[int, int], sample_cfg, classes: list[int], path: str | os.PathLike,
               batch_size: int = 64, objective=None) -> Path:
    """PNG grid, one row per choice of the model's conditioning kind in ``classes`` (class labels:
    the classes; see ``grid_classes``), rows named by the kind, ``sample_cfg.per_class`` columns,
    sampled with the ``sample`` section's settings, decoding mode and seed: the grid ``sample.py``
    makes from the same model. Leaves the global RNG alone; the model keeps its train/eval mode."""
    gpt = unwrap_model(model)
    kind, model_cfg = gpt.conditioning, gpt.cfg
    prefixes = balanced_prefixes(kind, model_cfg, sample_cfg.per_class * len(classes), list(classes))
    images = sample_images(model, tokenizer, grid, sample_cfg, prefixes, sample_cfg.seed, batch_size, objective)
    return save_grid(images, sample_cfg.per_class, path, [kind.row_label(model_cfg, c) for c in classes],
                     labels=sample_cfg.labels)


# ----------------------------------------------------------------------------- a checkpoint to sample

@dataclass
class Loaded:
    """A checkpoint opened for sampling: the model (eval mode), its ImageRunConfig, training step,
    tokenizer (on the model's device), token grid (H, W), and whether EMA weights were used."""
    model: torch.nn.Module
    cfg: object
    step: int
    tokenizer: object
    grid: tuple[int, int]
    ema: bool

    @property
    def kind(self) -> Conditioning:
        """What the model is conditioned on (its prefixes, their choices, names and npz storage)."""
        return self.model.conditioning

    @property
    def num_choices(self) -> int:
        """How many prefixes a grid or sample file picks from (class labels: the class count)."""
        return len(self.kind.choices(self.cfg.model))


def pick_grid(text: str | None, known: tuple[int, int] | None) -> tuple[int, int]:
    """--grid (must equal the model's grid when that is known: a model trained at one grid makes
    garbage at another), else the model's grid."""
    if text is None:
        if known is None:
            raise SampleFileError("cannot find the token grid from the checkpoint or its tokenizer; pass --grid HxW")
        return known
    wanted = parse_grid(text)
    if known is not None and wanted != known:
        raise SampleFileError(f"--grid {text}: this model was trained on a {known[0]}x{known[1]} grid")
    return wanted


def open_checkpoint(path: Path, *, use_ema: bool = True, device="cpu", grid: str | None = None) -> Loaded:
    """Load a checkpoint for sampling: one metadata read, one weights read. Its conditioning kind must
    have a set of prefixes to pick from (``choices``: class labels do, prompts do not). The model's
    grid is the one the checkpoint records, else its tokenizer's; ``grid`` is --grid."""
    model, cfg, meta = inference.open_model(path, use_ema=use_ema, device=device)   # one read
    step = meta["step"]
    try:
        model.conditioning.choices(cfg.model)
    except ValueError as e:
        raise SampleFileError(f"{path}: {e}") from None
    try:
        tokenizer = tokenizer_to(build_tokenizer(cfg.data), torch.device(device))
    except (ValueError, OSError) as e:
        raise SampleFileError(f"tokenizer of {path}: {e}") from None
    known = tuple(int(v) for v in (meta.get("grid") or tokenizer.grid))
    return Loaded(model, cfg, step, tokenizer, pick_grid(grid, known), bool(use_ema and meta.get("has_ema")))
