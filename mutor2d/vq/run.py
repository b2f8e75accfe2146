"""VQ tokenizer training as an engine run: image data, the loss, reconstruction metrics (config:
mutor2d.vq.config).

Loss = rec_weight * rec(x, x_hat) + codebook_weight * (codebook + commitment)
       + perceptual_weight * LPIPS(x, x_hat)          (only when perceptual weight files are given)
rec is L2 (mean squared error) or L1 on images in [-1, 1]; codebook / commitment are the VQ's
(mutor2d.tokenizer.vq). No adversarial loss. The run goes through mutor2d.engine like every other
kind. Checkpoints hold the VQ under "model" and the config with ``task: vq`` and the resolved
architecture, so load_vq rebuilds it. Every ``train.eval_every`` steps (and at the end) per-pixel
L1 / MSE / PSNR on [0, 1] images of a held-out set and the fraction of the codebook they use go to
log.jsonl as ``{"step", "eval": {...}}``, and in words to the output and the run's last line, the
codebook's use as "N of M codes (P %)", called low under LOW_USAGE of the codes.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset

from .. import provenance
from ..checks import ConfigError
from ..data.config import digits_fingerprint
from ..data.tokens import digits_images, digits_rgb
from ..engine.hooks import due
from ..engine.loop import train as engine_train
from ..engine.runlog import read_log
from ..io import say
from ..objectives.base import ObjectiveResult
from ..tokenizer.image_folder import center_crop_arr, scan_image_folder
from ..tokenizer.lpips import load_lpips
from ..tokenizer.vq_model import VQModel
from .config import VQDataConfig, VQLossConfig, VQRunConfig


# ----------------------------------------------------------------------------- data

class FolderImages(Dataset):
    """ImageFolder images -> (3, S, S) float in [0, 1]; ``train``: random crop out of an ADM centre
    crop of size S*crop_range, random flip; else the ADM centre crop. Unreadable files are skipped
    (the next image is used) and reported once."""

    def __init__(self, root, image_size: int, train: bool, crop_range: float, flip: bool,
                 limit: int | None = None):
        self.root = Path(root)
        self.files, self.labels, _ = scan_image_folder(root)
        if limit is not None:
            self.files = self.files[:limit]
        self.size, self.train, self.crop_range, self.flip = image_size, train, crop_range, flip
        self._reported: set[int] = set()

    def __len__(self) -> int:
        return len(self.files)

    def _load(self, i: int) -> np.ndarray:
        with Image.open(self.root / self.files[i]) as im:
            img = im.convert("RGB")
        if not self.train:
            return np.asarray(center_crop_arr(img, self.size))
        big = max(self.size, round(self.size * self.crop_range))
        arr = np.asarray(center_crop_arr(img, big))
        y, x = (int(torch.randint(big - self.size + 1, ())) for _ in range(2))
        arr = arr[y:y + self.size, x:x + self.size]
        if self.flip and torch.rand(()) < 0.5:
            arr = arr[:, ::-1]
        return arr

    def __getitem__(self, i: int) -> torch.Tensor:
        for k in range(len(self.files)):
            j = (i + k) % len(self.files)
            try:
                arr = self._load(j)
                return torch.from_numpy(arr.copy()).permute(2, 0, 1).float() / 255.0
            except Exception as e:
                if j not in self._reported:
                    self._reported.add(j)
                    print(f"skipped unreadable image {self.root / self.files[j]} ({type(e).__name__})")
        raise ValueError(f"no readable image in {str(self.root)!r}")


def _digits_images(d: VQDataConfig, size: int) -> tuple[Dataset, torch.Tensor]:
    train, _ = digits_images("train", d.data_seed)
    test, _ = digits_images("test", d.data_seed)
    return torch.utils.data.TensorDataset(digits_rgb(train, size)), digits_rgb(test[:d.eval_images], size)


def _folder_images(d: VQDataConfig, size: int) -> tuple[Dataset, torch.Tensor]:
    train = FolderImages(d.path, size, True, d.crop_range, d.flip)
    ev = FolderImages(d.eval_path or d.path, size, False, d.crop_range, False, limit=d.eval_images)
    return train, torch.stack([ev[i] for i in range(len(ev))])


IMAGE_SOURCES = {"digits": _digits_images, "folder": _folder_images}   # data.name -> builder
LOW_USAGE = 0.25    # a codebook whose evaluation images use a smaller share of its codes is reported as low


def build_image_data(cfg: VQRunConfig) -> tuple[Dataset, torch.Tensor]:
    """-> (training images dataset, eval images (n, 3, S, S) in [0, 1])."""
    if cfg.model.in_channels != 3:
        raise ConfigError(f"model.in_channels={cfg.model.in_channels}: training data are RGB images (3)")
    return IMAGE_SOURCES[cfg.data.name](cfg.data, cfg.model.image_size)


# ----------------------------------------------------------------------------- metrics

@torch.no_grad()
def reconstruction_metrics(model: VQModel, images: torch.Tensor, batch_size: int = 128) -> dict:
    """images (n, 3, S, S) in [0, 1] -> per-pixel l1, mse, psnr (on [0, 1]), codebook usage
    (fraction of codes used) and code perplexity over the set."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    l1 = mse = 0.0
    counts = torch.zeros(model.config.codebook_size, dtype=torch.long)
    for x in images.split(batch_size):
        x = x.to(device)
        rec, codes, _ = model(x * 2 - 1)
        rec = ((rec + 1) / 2).clamp(0, 1)
        l1 += (rec - x).abs().sum().item()
        mse += ((rec - x) ** 2).sum().item()
        counts += torch.bincount(codes.flatten().cpu(), minlength=len(counts))
    model.train(was_training)
    n = images.numel()
    p = counts.float() / counts.sum()
    perplexity = math.exp(-(p[p > 0] * p[p > 0].log()).sum().item())
    return {"l1": l1 / n, "mse": mse / n, "psnr": 10 * math.log10(1.0 / max(mse / n, 1e-12)),
            "usage": (counts > 0).float().mean().item(), "perplexity": perplexity}


# ----------------------------------------------------------------------------- the run kind

class VQTrainModule(torch.nn.Module):
    """The VQ and its loss as one module: (images batch, generator) -> ObjectiveResult. The LPIPS
    network (frozen) is held outside the module's parameters and state."""

    def __init__(self, model: VQModel, loss: VQLossConfig, perceptual: torch.nn.Module | None):
        super().__init__()
        self.model, self.loss, self._perceptual = model, loss, (perceptual,)

    def forward(self, batch, generator=None) -> ObjectiveResult:
        images = batch[0] if isinstance(batch, (list, tuple)) else batch      # a TensorDataset's: (images,)
        x = images.to(next(self.model.parameters()).device, non_blocking=True) * 2 - 1
        rec, _, vq_losses = self.model(x, generator if self.loss.restart_dead_codes else None)
        c = self.loss
        rec_fn = F.mse_loss if c.rec_loss == "l2" else F.l1_loss
        logs = {"loss_rec": rec_fn(rec, x), "loss_codebook": vq_losses["codebook"],
                "loss_commitment": vq_losses["commitment"]}
        loss = c.rec_weight * logs["loss_rec"] + c.codebook_weight * (logs["loss_codebook"] + logs["loss_commitment"])
        perceptual = self._perceptual[0]
        if perceptual is not None:
            logs["loss_perceptual"] = perceptual.to(x.device)(x, rec).mean()
            loss = loss + c.perceptual_weight * logs["loss_perceptual"]
        return ObjectiveResult(loss, logs, {}, torch.tensor(x.shape[0], device=x.device))


class VQRun:
    """The parts of a VQ tokenizer run for the engine (mutor2d.engine.setup.RunKind)."""
    collate = staticmethod(torch.utils.data.default_collate)
    eval_images = None            # (n, 3, S, S) held-out images, set by prepare_data

    def prepare_data(self, cfg: VQRunConfig):
        train_set, self.eval_images = build_image_data(cfg)
        return train_set, cfg

    def build_networks(self, cfg: VQRunConfig, saved: dict | None, dataset):
        torch.manual_seed(cfg.train.seed)
        model = VQModel(cfg.model)
        if saved is not None and "model" in saved:   # a sharded checkpoint loads after sharding
            model.load_state_dict(saved["model"], strict=True)
        weights = cfg.objective.perceptual_weights
        return model, VQTrainModule(model, cfg.objective, load_lpips(weights) if weights else None)

    def size(self, cfg: VQRunConfig) -> tuple[int, str]:
        """The VQ's parameters (about) and the fields that set them."""
        m = cfg.model
        return m.params, f"model.ch={m.ch}, model.ch_mult={list(m.ch_mult)}, model.num_res_blocks={m.num_res_blocks}"

    def blocks(self, module: VQTrainModule) -> list:
        """No transformer blocks: FSDP2 shards the VQ as one unit."""
        return []

    def trainable_state(self, state: dict) -> dict:
        return state

    def hooks(self, run, log) -> list:
        return [ReconstructionEval(self.eval_images, log, partial(self.eval_text, run.cfg))]

    def eval_text(self, cfg: VQRunConfig, record: dict) -> str:
        """A log record's reconstruction metrics in words, "" if it holds none: "l1 0.0312, ..., usage 14
        of 512 codes (2.7 %; low, under 25 %), perplexity 9.3" (``usage_text``)."""
        metrics = record.get("eval") or {}
        return ", ".join(f"usage {usage_text(v, cfg.model.codebook_size)}" if k == "usage" else f"{k} {v:.4g}"
                         for k, v in metrics.items())

    def rates(self, run, steps: int, applied: int, dt: float, sums: dict) -> dict:
        return {"images_per_s": run.cfg.train.batch_size * steps / dt, "usage_window": run.model.quantize.usage()}

    def finish(self, run) -> None:
        """Nothing to write after the last step: the checkpoints are the tokenizer."""

    def finished(self, run_dir) -> bool:
        return True

    def sources(self, cfg: VQRunConfig) -> tuple[dict, dict]:
        """(the digits' or the image folder's fingerprint, the seed's random init)."""
        data = digits_fingerprint() if cfg.data.name == "digits" else provenance.fingerprint(cfg.data.path)
        return data, provenance.random_init(cfg.train.seed)


def usage_text(usage: float, codebook_size: int) -> str:
    """The share ``usage`` of a codebook's codes that evaluation images use, in words: "14 of 512 codes
    (2.7 %; low, under 25 %)" (low: under LOW_USAGE)."""
    low = f"; low, under {100 * LOW_USAGE:g} %" if usage < LOW_USAGE else ""
    return f"{round(usage * codebook_size)} of {codebook_size} codes ({100 * usage:.1f} %{low})"


@dataclass
class ReconstructionEval:
    """Every train.eval_every steps and at the end: reconstruction metrics of the held-out images,
    logged and printed (``describe``: a record in words)."""
    images: torch.Tensor
    log: object                 # the run's JsonLog
    describe: Callable[[dict], str]

    def __call__(self, run, status) -> None:
        if status.stopping or not due(run.cfg.train.eval_every, status):
            return
        if run.main:
            record = {"step": status.done, "eval": reconstruction_metrics(run.sample_model, self.images)}
            self.log.write(record)
            say(f"step {status.done}: evaluation {self.describe(record)}")
        run.acc.wait_for_everyone()


def train(cfg: VQRunConfig, run_dir=None, resume: str | None = None) -> dict:
    """Train (``resume`` as mutor2d.engine.loop.train's: None, "auto" or a checkpoint) -> the last
    reconstruction metrics. ``run_dir``: default ``train.out_dir``."""
    out = engine_train(cfg, run_dir or cfg.train.out_dir, resume=resume)
    evals = [r["eval"] for r in read_log(out) if "eval" in r]
    return evals[-1] if evals else {}
