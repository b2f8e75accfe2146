"""The image run kind: a GPT over token grids trained with an objective (NTP, MuToR, multi-head).

Rules:
  * model.vocab_size / model.num_classes left at their defaults are taken from the dataset; any other
    value must equal the dataset's. Grid-dependent settings (registers, RoPE) are checked against the
    data's grid before anything trains.
  * The model is initialised from ``train.seed`` (same on every process), then from the checkpoint
    or ``train.init_from``.
"""
from __future__ import annotations

from dataclasses import replace
import torch
import torch.nn as nn

from .. import checkpoint as ckpt_lib
from .. import config as config_lib
from .. import provenance
from ..checkpoint import inference, locate
from ..checkpoint import sharded as sharded_checkpoint
from ..checks import ConfigError
from ..data.tokens import build_dataset, collate
from ..model.config import model_shape
from ..model.gpt import GPT
from ..model.llamagen import load_llamagen
from ..objectives.base import Batch
from ..registry import build
from .config import ImageRunConfig
from .hooks import image_hooks, image_rates


class TrainModule(nn.Module):
    """The GPT and its objective as one module, so DDP/FSDP/autocast wrap the whole loss."""

    def __init__(self, model: GPT, objective: nn.Module, grid: tuple[int, int]):
        super().__init__()
        self.model, self.objective, self.grid = model, objective, grid

    def forward(self, batch: dict, generator=None):
        """A collated batch {"body", "prefix"[, "lengths"]} -> ObjectiveResult."""
        device = next(self.model.parameters()).device
        body, prefix, lengths = (None if t is None else t.to(device, non_blocking=True)
                                 for t in (batch["body"], batch["prefix"], batch.get("lengths")))
        return self.objective(self.model, Batch(body, prefix, self.grid, lengths), generator)


class ImageRun:
    """The parts of an image run for the engine (see mutor2d.engine.setup.RunKind)."""
    collate = staticmethod(collate)
    hooks = staticmethod(image_hooks)           # (run, log) -> the sample grids and online evaluation
    rates = staticmethod(image_rates)           # images/s, tokens/s, MFU

    def prepare_data(self, cfg: ImageRunConfig):
        """(train dataset, cfg with the data's vocabulary and classes, checked against its grid)."""
        try:
            dataset = build_dataset(cfg.data, "train")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return dataset, resolve_config(cfg, dataset)

    def build_networks(self, cfg: ImageRunConfig, saved: dict | None, dataset) -> tuple[GPT, TrainModule]:
        model, objective = build_networks(cfg, saved)
        return model, TrainModule(model, objective, tuple(int(v) for v in dataset.grid))

    def size(self, cfg: ImageRunConfig) -> tuple[int, str]:
        """The GPT's parameters (without the objective's few) and the fields that set them."""
        shape, m = model_shape(cfg.model), cfg.model
        return (shape.params(m.vocab_size, m.num_classes),
                f"model.n_layer={shape.n_layer}, model.dim={shape.dim}, model.vocab_size={m.vocab_size}")

    def blocks(self, module: TrainModule) -> list[nn.Module]:
        """The GPT's transformer blocks and the objective's (multi-head)."""
        return list(module.model.layers) + list(module.objective.blocks())

    def trainable_state(self, state: dict) -> dict:
        """What a checkpoint keeps of the model's full state dict: all of it."""
        return state

    def plain_copy(self, model: GPT) -> GPT:
        """A new GPT of ``model``'s architecture (FSDP shards are gathered into it for sampling)."""
        return GPT(model.cfg, register_token=model.has_register_token)

    def finish(self, run) -> None:
        """Nothing to write after the last step: the checkpoints are the result."""

    def finished(self, run_dir) -> bool:
        return True

    def sources(self, cfg: ImageRunConfig) -> tuple[dict, dict]:
        """(data fingerprint, initial weights' fingerprint: train.init_from's file, else the seed's random init)."""
        return cfg.data.fingerprint(), init_fingerprint(cfg.train.init_from, cfg.train.seed)


def init_fingerprint(source: str | None, seed: int) -> dict:
    """train.init_from's fingerprint (of the checkpoint it resolves to: a run folder's newest), else
    the random initialisation of ``seed``."""
    if not source:
        return provenance.random_init(seed)
    try:
        return provenance.fingerprint(locate.resolve(source))
    except (FileNotFoundError, ValueError):
        return provenance.fingerprint(source)


def resolve_config(cfg: ImageRunConfig, dataset) -> ImageRunConfig:
    """Fill model.vocab_size / num_classes from the dataset and check grid-dependent settings."""
    m, defaults = cfg.model, config_lib.make("model")
    data = {"vocab_size": int(dataset.vocab_size)}
    if m.conditioning_kind().per_class:                                    # num_classes only matters for class labels
        data["num_classes"] = int(dataset.num_classes)
    for name, have in data.items():
        if getattr(m, name) not in (have, getattr(defaults, name)):
            raise ConfigError(f"model.{name}={getattr(m, name)} does not match the data ({have}); "
                              f"leave it out of the config, it is taken from the dataset")
    cfg = replace(cfg, model=replace(m, **data))
    cfg.check_data(tuple(dataset.grid), int(dataset[0]["prefix"].numel()), int(dataset.num_classes))
    return cfg


def build_networks(cfg: ImageRunConfig, saved: dict | None) -> tuple[GPT, nn.Module]:
    """The GPT and its objective, initialised from train.seed, then from the checkpoint or init_from."""
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model, register_token=cfg.objective.uses_registers())
    objective = build(cfg.objective, model)
    if saved is not None and "model" in saved:     # a sharded checkpoint loads after sharding (build_run)
        model.load_state_dict(saved["model"], strict=True)
        objective.load_state_dict(saved["objective"], strict=True)
    elif cfg.train.init_from:
        init_weights(model, cfg.train.init_from)
    if cfg.train.compile:
        for block in list(model.layers) + list(objective.blocks()):
            block.compile()
    return model, objective


def init_weights(model: GPT, source: str) -> None:
    """train.init_from: the weights of a mutor2d checkpoint, run folder, safetensors export or LlamaGen
    GPT checkpoint; optimizer, step and data order start fresh."""
    try:
        path = locate.resolve(source)
        if path.suffix in (".safetensors", sharded_checkpoint.SUFFIX) or ckpt_lib.is_readable(path):
            obj = inference.load_weights(path, use_ema=False)[0]
        else:
            obj = path                                   # load_llamagen reads it with weights_only
        load_llamagen(model, obj)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        raise ConfigError(f"train.init_from={source!r}: {type(e).__name__}: {e}") from None
