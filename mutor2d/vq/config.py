"""Config of a VQ tokenizer training run: a YAML file with top-level ``task: vq``.

Sections: model (``preset``, mutor2d.tokenizer.config.PRESETS, plus any VQConfig field to override),
data (digits or an image folder), objective (the loss weights), optim and train (the engine's, with
VQ defaults).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from ..checks import ConfigError, at_least, check_workers, fail
from ..config import ConfigRoot, build_section
from ..run_configs import register_run_config
from ..engine.config import OptimConfig, TrainConfig
from ..tokenizer.config import CROP_RANGE, PRESETS, VQConfig, VQError

TASK = "vq"
SECTIONS = ("model", "data", "objective", "optim", "train")


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
        if not CROP_RANGE[0] <= self.crop_range <= CROP_RANGE[1]:
            fail("data.crop_range", f"a number in [{CROP_RANGE[0]:g}, {CROP_RANGE[1]:g}]", self.crop_range)
        for key in ("eval_images", "data_seed"):
            at_least(f"data.{key}", getattr(self, key), 0)
        check_workers("data.num_workers", self.num_workers)


@dataclass
class VQLossConfig:
    """The loss: reconstruction (L2 or L1), codebook and commitment terms, and LPIPS when weight files
    are given (mutor2d.tokenizer.lpips); ``restart_dead_codes``: the quantiser's dead-code restart before
    each batch (mutor2d.tokenizer.vq_model; needs model.usage_window > 0)."""
    rec_loss: Literal["l2", "l1"] = "l2"
    rec_weight: float = 1.0
    codebook_weight: float = 1.0
    perceptual_weight: float = 1.0   # used only when perceptual_weights is non-empty
    perceptual_weights: list[str] = field(default_factory=list)
    restart_dead_codes: bool = False  # move codes unused over the usage window onto encoder outputs

    def check(self) -> None:
        for key in ("rec_weight", "codebook_weight", "perceptual_weight"):
            at_least(f"objective.{key}", getattr(self, key), 0)


@register_run_config(TASK, kind="mutor2d.vq.run:VQRun")
@dataclass
class VQRunConfig(ConfigRoot):
    sections = SECTIONS
    model: VQConfig = field(default_factory=lambda: vq_model({}))
    data: VQDataConfig = field(default_factory=VQDataConfig)
    objective: VQLossConfig = field(default_factory=VQLossConfig)
    optim: OptimConfig = field(default_factory=partial(OptimConfig, lr=1e-4, betas=(0.9, 0.95),
                                                       weight_decay=0.05))
    train: TrainConfig = field(default_factory=partial(TrainConfig, log_every=50, eval_every=500,
                                                       ckpt_every=500, out_dir="runs/vq", tracker="none"))

    @classmethod
    def build(cls, section: str, value):
        """``model``: a preset with VQConfig fields over it; the rest as every kind's."""
        return vq_model(value) if section == "model" else super().build(section, value)

    def check(self) -> "VQRunConfig":
        """Every section but the model, which ``vq_model`` validated when it was built."""
        for s in self.sections[1:]:
            getattr(self, s).check()
        if self.objective.restart_dead_codes and not self.model.usage_window:
            fail("model.usage_window", "> 0 with objective.restart_dead_codes (dead codes are those absent from "
                 "it)", self.model.usage_window)
        if self.objective.restart_dead_codes and self.train.sharding == "fsdp":
            fail("objective.restart_dead_codes", "false with train.sharding=fsdp (a restart edits the "
                 "gathered codebook, which FSDP2 would not keep)", True)
        return self


def load_config(source=None, overrides: list[str] | None = None) -> VQRunConfig:
    """A VQ YAML (path or configs/NAME, a dict or a VQRunConfig) with ``--set section.key=value`` overrides."""
    return VQRunConfig.load(source, overrides)


def vq_model(model) -> VQConfig:
    """The VQConfig of a ``model`` mapping: ``preset`` (default vq16) with any VQConfig field over it."""
    if not isinstance(model, dict):
        raise ConfigError(f"model: expected a mapping (preset and VQ fields), got {model!r}")
    model = dict(model)
    preset = model.pop("preset", "vq16")
    if preset not in PRESETS:
        raise ConfigError(f"model.preset: expected a vq preset, one of {sorted(PRESETS)}, got {preset!r}")
    try:
        return build_section(VQConfig, {**PRESETS[preset], **model}, "model.").validate()
    except VQError as e:
        raise ConfigError(str(e)) from None
