"""VQ tokenizer training: config, image data, losses, the loop, reconstruction metrics.

Loss = rec_weight * rec(x, x_hat) + codebook_weight * (codebook + commitment)
       + perceptual_weight * LPIPS(x, x_hat)          (only when perceptual weight files are given)
rec is L2 (mean squared error) or L1 on images in [-1, 1]; codebook / commitment are the VQ's
(mutor2d.tokenizer.vq). No adversarial loss. Checkpoints: RUN/checkpoints/step_XXXXXXXX.pt, written
atomically, holding model, ema=None, optimizer, step, rng (torch's state as a tensor) and config
(a plain dict with ``kind: vq`` plus the resolved architecture, so load_vq rebuilds it); every
value loads with ``weights_only=True``. Logs (RUN/log.jsonl): losses, codebook usage over the
recent window; at eval steps per-pixel L1 / MSE / PSNR on [0, 1] images of a held-out set and the
fraction of the codebook those images use. Non-finite values are logged as null.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from .. import config as config_lib
from ..checkpoint import checkpoint_path, list_checkpoints
from ..config import ConfigError
from ..data import digits_images, digits_rgb
from ..io import remove_stale_temps, torch_save, with_checksum, write_atomic, write_text_atomic
from .codes import center_crop_arr, scan_image_folder
from .vq import PRESETS, VQConfig, VQError, VQModel, newest_vq_checkpoint


@dataclass
class VQDataConfig:
    """digits: the embedded sklearn digits (train split; eval on the first ``eval_images`` of the
    test split), upsampled to the VQ's image size. folder: an ImageFolder tree at ``path`` (eval on
    the first ``eval_images`` of ``eval_path`` if given, else of the training images, centre-cropped)."""
    name: Literal["digits", "folder"] = "digits"
    path: str | None = None
    eval_path: str | None = None
    eval_images: int = 512
    crop_range: float = 1.1          # folder: random crop out of an ADM centre crop this much larger
    flip: bool = True                # folder: random horizontal flips
    num_workers: int = 0
    data_seed: int = 1234

    def check(self) -> None:
        if self.name == "folder" and not self.path:
            raise ConfigError("data.path: data.name='folder' needs the image folder (root/CLASS/IMAGE)")
        if not self.crop_range >= 1.0:
            raise ConfigError(f"data.crop_range: expected >= 1.0, got {self.crop_range}")
        for key in ("eval_images", "num_workers", "data_seed"):
            if getattr(self, key) < 0:
                raise ConfigError(f"data.{key}: expected >= 0, got {getattr(self, key)}")


@dataclass
class VQTrainConfig:
    batch_size: int = 64
    max_steps: int = 1000
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    rec_loss: Literal["l2", "l1"] = "l2"
    rec_weight: float = 1.0
    codebook_weight: float = 1.0
    perceptual_weight: float = 1.0   # used only when perceptual_weights is non-empty
    perceptual_weights: list[str] = field(default_factory=list)
    log_every: int = 50
    eval_every: int = 500            # 0 = only at the end
    ckpt_every: int = 500
    keep_ckpts: int = 2
    seed: int = 0
    out_dir: str = "runs/vq"

    def check(self) -> None:
        for key in ("batch_size", "log_every", "ckpt_every", "keep_ckpts"):
            if getattr(self, key) < 1:
                raise ConfigError(f"train.{key}: expected >= 1, got {getattr(self, key)}")
        for key in ("max_steps", "eval_every", "seed", "weight_decay", "grad_clip", "rec_weight",
                    "codebook_weight", "perceptual_weight"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"train.{key}: expected a finite value >= 0, got {value!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"train.lr: expected a finite number > 0, got {self.lr!r}")
        if not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"train.betas: expected values in [0, 1), got {list(self.betas)}")


@dataclass
class VQRunConfig:
    model: VQConfig
    data: VQDataConfig
    train: VQTrainConfig

    def to_dict(self) -> dict:
        return {"kind": "vq", "model": self.model.to_dict(), "data": dataclasses.asdict(self.data),
                "train": {**dataclasses.asdict(self.train), "betas": list(self.train.betas)}}


SECTIONS = ("model", "data", "train")


def load_config(name: str | os.PathLike | None = None, overrides: list[str] | None = None) -> VQRunConfig:
    """A VQ YAML (path or configs/NAME) with ``--set section.key=value`` overrides.

    ``model`` holds ``preset`` (mutor2d.tokenizer.vq.PRESETS) plus any VQConfig field to override."""
    data: dict = {}
    if name is not None:
        path = config_lib.resolve_path(name)
        data = config_lib.read_yaml(path) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of sections ({', '.join(SECTIONS)}), got {data!r}")
    for item in overrides or []:
        keys, value = config_lib.parse_override(item)
        if len(keys) != 2 or keys[0] not in SECTIONS:
            raise ConfigError(f"--set {item}: expected model.KEY, data.KEY or train.KEY")
        section = data.setdefault(keys[0], {})
        if not isinstance(section, dict):
            raise ConfigError(f"--set {item}: '{keys[0]}' is not a section")
        section[keys[1]] = value
    return from_dict(data)


def from_dict(data: dict) -> VQRunConfig:
    """A checked VQRunConfig from a plain dict (a YAML file or a checkpoint's stored config)."""
    data = {k: v for k, v in (data or {}).items() if k != "kind"}
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"unknown VQ config section '{unknown[0]}' (known: {', '.join(SECTIONS)})")
    model = data.get("model") or {}
    if not isinstance(model, dict):
        raise ConfigError(f"model: expected a mapping (preset and VQ fields), got {model!r}")
    model = dict(model)
    preset = model.pop("preset", "vq16")
    if preset not in PRESETS:
        raise ConfigError(f"model.preset: expected a vq preset, one of {sorted(PRESETS)}, got {preset!r}")
    try:
        vq = config_lib.build_section(VQConfig, {**PRESETS[preset], **model}, "model.").validate()
    except VQError as e:
        raise ConfigError(str(e)) from None
    cfg = VQRunConfig(vq, config_lib.build_section(VQDataConfig, data.get("data") or {}, "data."),
                      config_lib.build_section(VQTrainConfig, data.get("train") or {}, "train."))
    cfg.data.check()
    cfg.train.check()
    return cfg


def dump(cfg: VQRunConfig) -> str:
    d = cfg.to_dict()
    d["model"] = {"preset": "vq16", **d["model"]}  # fully resolved: the preset base is irrelevant
    return yaml.safe_dump(d, sort_keys=False)


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


def build_image_data(cfg: VQRunConfig) -> tuple[Dataset, torch.Tensor]:
    """-> (training images dataset, eval images (n, 3, S, S) in [0, 1])."""
    if cfg.model.in_channels != 3:
        raise ConfigError(f"model.in_channels={cfg.model.in_channels}: training data are RGB images (3)")
    return IMAGE_SOURCES[cfg.data.name](cfg.data, cfg.model.image_size)


def _first(batch):
    return batch[0] if isinstance(batch, (list, tuple)) else batch


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


# ----------------------------------------------------------------------------- the loop

@dataclass
class _Run:
    """What the training loop works on."""
    cfg: VQRunConfig
    acc: object                 # accelerate.Accelerator
    model: torch.nn.Module      # wrapped by accelerate
    raw: VQModel                # the unwrapped model (state dicts, metrics)
    opt: torch.optim.Optimizer
    loader: DataLoader
    eval_images: torch.Tensor
    perceptual: torch.nn.Module | None
    out: Path
    step: int = 0
    tic: float = 0.0


def train(cfg: VQRunConfig, log=print, accelerator=None) -> dict:
    """Train (or resume, from the newest readable checkpoint of train.out_dir) -> final eval metrics."""
    run = _setup(cfg, log, accelerator)
    metrics: dict = {}
    run.model.train()
    run.tic = time.time()
    while run.step < cfg.train.max_steps:
        for batch in run.loader:
            metrics = _train_step(run, batch, log) or metrics
            if run.step >= cfg.train.max_steps:
                break
    if not metrics:  # resumed at or past max_steps
        metrics = reconstruction_metrics(run.raw, run.eval_images)
    run.acc.wait_for_everyone()
    return metrics


def _setup(cfg: VQRunConfig, log, accelerator) -> _Run:
    """Seed, data, model, optimizer, perceptual loss, resume; the same order (and RNG draws) as
    every run with this config."""
    from accelerate import Accelerator
    from .lpips import load_lpips

    acc = accelerator or Accelerator(cpu=not torch.cuda.is_available())
    t, out = cfg.train, Path(cfg.train.out_dir)
    torch.manual_seed(t.seed)
    if t.batch_size % acc.num_processes:
        raise ConfigError(f"train.batch_size={t.batch_size} is not divisible by {acc.num_processes} processes")
    train_set, eval_images = build_image_data(cfg)
    if len(train_set) < t.batch_size // acc.num_processes:
        raise ConfigError(f"train.batch_size={t.batch_size}: larger than the {len(train_set)} training images")
    loader = DataLoader(train_set, batch_size=t.batch_size // acc.num_processes, shuffle=True, drop_last=True,
                        num_workers=cfg.data.num_workers, generator=torch.Generator().manual_seed(t.seed))
    model = VQModel(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    perceptual = load_lpips(t.perceptual_weights).to(acc.device) if t.perceptual_weights else None
    if acc.is_main_process:
        remove_stale_temps(out / "checkpoints")  # left by saves killed in an earlier run
    step = _resume(cfg, out, model, opt, log)
    if acc.is_main_process:
        write_text_atomic(out / "config.yaml", dump(cfg))
    model, opt, loader = acc.prepare(model, opt, loader)
    return _Run(cfg, acc, model, acc.unwrap_model(model), opt, loader, eval_images, perceptual, out, step)


def _resume(cfg: VQRunConfig, out: Path, model: VQModel, opt, log) -> int:
    """Load the newest readable checkpoint of ``out`` (if any) into model, optimizer and torch's
    RNG -> its step (0 when there is none)."""
    found = newest_vq_checkpoint(out)
    if found is None:
        return 0
    path, state = found
    config = state.get("config")
    if not isinstance(config, dict) or config.get("kind") != "vq" or config.get("model") != cfg.model.to_dict():
        raise ConfigError(f"{str(out)!r} holds a checkpoint of another model; use another train.out_dir")
    try:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
        torch.set_rng_state(state["rng"]["torch"])
    except (KeyError, TypeError, RuntimeError, ValueError) as e:
        raise ValueError(f"VQ checkpoint {str(path)!r} cannot be resumed ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else e!r})") from None
    log(f"resumed from {path} at step {step}")
    return step


def _train_step(run: _Run, batch, log) -> dict | None:
    """One optimizer step, then logging, evaluation and checkpointing when due -> eval metrics
    when this step evaluated, else None."""
    t = run.cfg.train
    x = _first(batch) * 2 - 1
    rec, _, vq_losses = run.model(x)
    rec_fn = F.mse_loss if t.rec_loss == "l2" else F.l1_loss
    parts = {"rec": rec_fn(rec, x), "codebook": vq_losses["codebook"], "commitment": vq_losses["commitment"]}
    loss = t.rec_weight * parts["rec"] + t.codebook_weight * (parts["codebook"] + parts["commitment"])
    if run.perceptual is not None:
        parts["perceptual"] = run.perceptual(x, rec).mean()
        loss = loss + t.perceptual_weight * parts["perceptual"]
    run.opt.zero_grad(set_to_none=True)
    run.acc.backward(loss)
    if t.grad_clip > 0:
        run.acc.clip_grad_norm_(run.model.parameters(), t.grad_clip)
    run.opt.step()
    run.step += 1
    last, metrics = run.step == t.max_steps, None
    if run.step % t.log_every == 0 or last:
        entry = {"step": run.step, "loss": loss.item(), **{k: v.item() for k, v in parts.items()},
                 "usage_window": run.raw.quantize.usage(), "sec": round(time.time() - run.tic, 1)}
        _record(run, entry)
        log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in entry.items()))
    if last or (t.eval_every and run.step % t.eval_every == 0):
        metrics = reconstruction_metrics(run.raw, run.eval_images)
        _record(run, {"step": run.step, "eval": metrics})
        log(f"eval step={run.step} " + " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
    if last or run.step % t.ckpt_every == 0:
        _save(run)
    return metrics


def _json_safe(value):
    """Non-finite floats -> None (JSON has no NaN/inf), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def _record(run: _Run, entry: dict) -> None:
    if run.acc.is_main_process:
        with open(run.out / "log.jsonl", "a") as f:
            f.write(json.dumps(_json_safe(entry), allow_nan=False) + "\n")


def _save(run: _Run) -> None:
    """Write the checkpoint of this step atomically, then delete all but the ``keep_ckpts`` newest
    at or below this step (files of later steps, which resume could not read, are left alone)."""
    if not run.acc.is_main_process:
        return
    state = {"model": run.raw.state_dict(), "ema": None, "objective": {}, "optimizer": run.opt.state_dict(),
             "scheduler": None, "step": run.step, "rng": {"torch": torch.get_rng_state()},
             "config": run.cfg.to_dict()}
    path = write_atomic(checkpoint_path(run.out, run.step), lambda f: torch_save(with_checksum(state), f))
    ckpts = list_checkpoints(run.out)
    for old in ckpts[:ckpts.index(path) + 1][:-run.cfg.train.keep_ckpts]:
        old.unlink()
