"""Training objectives, one module each, picked by ``objective.name`` through ``OBJECTIVES``.

An objective is an nn.Module built as ``cls(cfg.objective, model)``, with
``forward(model, batch, generator) -> ObjectiveResult``, ``blocks()`` (transformer blocks it owns)
and a static ``uses_registers(cfg) -> bool`` (whether the GPT needs its register embedding).
Adding one: a module here, a config variant (``config.register_variant``) and a line below.
"""
from __future__ import annotations

import torch.nn as nn

from ..config import ConfigError
from .base import Batch, Objective, ObjectiveResult, masked_ce
from .multihead import MultiHead
from .register_objective import RegisterObjective

OBJECTIVES: dict[str, type] = {
    "ntp": RegisterObjective,
    "mutor-1d": RegisterObjective,
    "mutor-2d": RegisterObjective,
    "multihead": MultiHead,
}

MuToR = RegisterObjective   # old name, kept for callers not yet renamed

__all__ = ["OBJECTIVES", "Batch", "MultiHead", "Objective", "ObjectiveResult", "RegisterObjective",
           "build_objective", "masked_ce", "objective_class", "uses_registers"]


def objective_class(cfg) -> type:
    if cfg.name not in OBJECTIVES:
        raise ConfigError(f"objective.name={cfg.name!r}: no objective module (known: {', '.join(OBJECTIVES)})")
    return OBJECTIVES[cfg.name]


def build_objective(cfg, model: nn.Module) -> nn.Module:
    """The loss module for ``cfg`` (an objective config); it may hold parameters (multihead) that
    train with the model."""
    return objective_class(cfg)(cfg, model)


def uses_registers(cfg) -> bool:
    """Whether the GPT needs its register embedding for this objective."""
    return objective_class(cfg).uses_registers(cfg)
