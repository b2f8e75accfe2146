"""VQ tokenizer training: config, image data, losses, the loop, reconstruction metrics.

Loss = rec_weight * rec(x, x_hat) + codebook_weight * (codebook + commitment)
       + perceptual_weight * LPIPS(x, x_hat)          (only when perceptual weight files are given)
rec is L2 (mean squared error) or L1 on images in [-1, 1]; codebook / commitment are the VQ's
(mutor2d.vq). No adversarial loss. Checkpoints follow mutor2d.checkpoint's layout
(RUN/checkpoints/step_XXXXXXXX.pt with model, ema=None, optimizer, step, rng, config) and the
config dict carries ``kind: vq`` plus the resolved architecture, so mutor2d.vq.load_vq rebuilds it.
Logs (RUN/log.jsonl): losses, codebook usage over the recent window; at eval steps per-pixel L1 /
MSE / PSNR on [0, 1] images of a held-out set and the fraction of the codebook those images use.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from . import checkpoint as ckpt_lib
from . import config as config_lib
from .codes import center_crop_arr, scan_image_folder
from .config import ConfigError
from .data import digits_images, digits_rgb
from .vq import VQConfig, VQModel, vq_config


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


@dataclass
class VQRunConfig:
    model: VQConfig
    data: VQDataConfig
    train: VQTrainConfig

    def to_dict(self) -> dict:
        return {"kind": "vq", "model": self.model.to_dict(), "data": dataclasses.asdict(self.data),
                "train": {**dataclasses.asdict(self.train), "betas": list(self.train.betas)}}


def load_config(name: str | os.PathLike | None = None, overrides: list[str] | None = None) -> VQRunConfig:
    """A VQ YAML (path or configs/NAME) with ``--set section.key=value`` overrides.

    ``model`` holds ``preset`` (mutor2d.vq.PRESETS) plus any VQConfig field to override."""
    data: dict = {}
    if name is not None:
        path = config_lib.resolve_path(name)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    for item in overrides or []:
        keys, value = config_lib.parse_override(item)
        if len(keys) != 2 or keys[0] not in ("model", "data", "train"):
            raise ConfigError(f"--set {item}: expected model.KEY, data.KEY or train.KEY")
        data.setdefault(keys[0], {})[keys[1]] = value
    return from_dict(data)


def from_dict(data: dict) -> VQRunConfig:
    data = {k: v for k, v in (data or {}).items() if k != "kind"}
    unknown = sorted(set(data) - {"model", "data", "train"})
    if unknown:
        raise ConfigError(f"unknown VQ config section '{unknown[0]}' (known: data, model, train)")
    model = dict(data.get("model") or {})
    preset = model.pop("preset", "vq16")
    names = {f.name: f for f in dataclasses.fields(VQConfig)}
    hints = typing.get_type_hints(VQConfig)
    for k, v in model.items():
        if k not in names:
            raise ConfigError(f"unknown config key 'model.{k}' (known: preset, {', '.join(sorted(names))})")
        model[k] = config_lib._check_type(f"model.{k}", v, hints[k])
    try:
        vq = vq_config(preset, **model)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    cfg = VQRunConfig(vq, config_lib._build(VQDataConfig, data.get("data") or {}, "data."),
                      config_lib._build(VQTrainConfig, data.get("train") or {}, "train."))
    t = cfg.train
    for key in ("batch_size", "log_every", "ckpt_every", "keep_ckpts"):
        if getattr(t, key) < 1:
            raise ConfigError(f"train.{key}: expected >= 1, got {getattr(t, key)}")
    if t.lr <= 0 or t.max_steps < 0:
        raise ConfigError(f"train.lr/max_steps: expected lr > 0 and max_steps >= 0, got {t.lr}, {t.max_steps}")
    if cfg.data.name == "folder" and not cfg.data.path:
        raise ConfigError("data.path: data.name='folder' needs the image folder (root/CLASS/IMAGE)")
    if cfg.data.crop_range < 1.0:
        raise ConfigError(f"data.crop_range: expected >= 1.0, got {cfg.data.crop_range}")
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


def build_image_data(cfg: VQRunConfig) -> tuple[Dataset, torch.Tensor]:
    """-> (training images dataset, eval images (n, 3, S, S) in [0, 1])."""
    d, size = cfg.data, cfg.model.image_size
    if cfg.model.in_channels != 3:
        raise ConfigError(f"model.in_channels={cfg.model.in_channels}: training data are RGB images (3)")
    if d.name == "digits":
        train, _ = digits_images("train", d.data_seed)
        test, _ = digits_images("test", d.data_seed)
        return torch.utils.data.TensorDataset(digits_rgb(train, size)), digits_rgb(test[:d.eval_images], size)
    train = FolderImages(d.path, size, True, d.crop_range, d.flip)
    ev = FolderImages(d.eval_path or d.path, size, False, d.crop_range, False, limit=d.eval_images)
    return train, torch.stack([ev[i] for i in range(len(ev))])


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

def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}


def train(cfg: VQRunConfig, log=print, accelerator=None) -> dict:
    """Train (or resume, from the newest valid checkpoint of train.out_dir) -> final eval metrics."""
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

    step = 0
    resume = ckpt_lib.latest_valid(out)
    if resume is not None:
        state = ckpt_lib.load(resume)
        if state["config"].get("kind") != "vq" or state["config"]["model"] != cfg.model.to_dict():
            raise ConfigError(f"{str(out)!r} holds a checkpoint of another model; use another train.out_dir")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(state["rng"]["numpy"])
        log(f"resumed from {resume} at step {step}")
    if acc.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(dump(cfg))
    model, opt, loader = acc.prepare(model, opt, loader)
    raw = acc.unwrap_model(model)
    rec_fn = F.mse_loss if t.rec_loss == "l2" else F.l1_loss
    logf = open(out / "log.jsonl", "a") if acc.is_main_process else None

    def save(step):
        if not acc.is_main_process:
            return
        ckpt_lib.save_atomic({"model": raw.state_dict(), "ema": None, "objective": {},
                              "optimizer": opt.state_dict(), "scheduler": None, "step": step,
                              "rng": _rng_state(), "config": cfg.to_dict()}, ckpt_lib.checkpoint_path(out, step))
        for old in ckpt_lib.list_checkpoints(out)[:-t.keep_ckpts]:
            old.unlink()

    def record(entry):
        if logf is not None:
            logf.write(json.dumps(entry) + "\n")
            logf.flush()

    metrics = {}
    model.train()
    tic = time.time()
    while step < t.max_steps:
        for batch in loader:
            x = _first(batch) * 2 - 1
            rec, _, vq_losses = model(x)
            parts = {"rec": rec_fn(rec, x), "codebook": vq_losses["codebook"],
                     "commitment": vq_losses["commitment"]}
            loss = t.rec_weight * parts["rec"] + t.codebook_weight * (parts["codebook"] + parts["commitment"])
            if perceptual is not None:
                parts["perceptual"] = perceptual(x, rec).mean()
                loss = loss + t.perceptual_weight * parts["perceptual"]
            opt.zero_grad(set_to_none=True)
            acc.backward(loss)
            if t.grad_clip > 0:
                acc.clip_grad_norm_(model.parameters(), t.grad_clip)
            opt.step()
            step += 1
            if step % t.log_every == 0 or step == t.max_steps:
                entry = {"step": step, "loss": loss.item(), **{k: v.item() for k, v in parts.items()},
                         "usage_window": raw.quantize.usage(), "sec": round(time.time() - tic, 1)}
                record(entry)
                log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in entry.items()))
            if step == t.max_steps or (t.eval_every and step % t.eval_every == 0):
                metrics = reconstruction_metrics(raw, eval_images)
                record({"step": step, "eval": metrics})
                log(f"eval step={step} " + " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
            if step == t.max_steps or step % t.ckpt_every == 0:
                save(step)
            if step >= t.max_steps:
                break
    if not metrics:  # resumed at or past max_steps
        metrics = reconstruction_metrics(raw, eval_images)
    if logf is not None:
        logf.close()
    acc.wait_for_everyone()
    return metrics
