"""Training objectives, one module each; ``objective.name`` picks a config variant that builds its loss.

An objective config (``ObjectiveConfig`` subclass, registered with ``@register_variant("objective",
NAME)`` beside its module) builds an nn.Module with ``forward(model, batch, generator) ->
ObjectiveResult`` and ``blocks()`` (transformer blocks it owns), and says which register rules it
follows (``register_spec()``) and whether the model needs its register embedding (``uses_registers()``).
``model`` is a ``TokenModel``: the image GPT, or a transformers causal LM on one batch of text (a
grid of height 1), so every objective trains both. Adding one: a module here with its config and
loss, and its import below.
"""
from .base import Batch, ObjectiveConfig, ObjectiveResult, TokenModel, masked_ce, mix, token_ce
from .multihead import MultiHead, MultiHeadConfig
from .register_objective import MuToR1DConfig, MuToR2DConfig, NTPConfig, RegisterObjective

__all__ = ["Batch", "MultiHead", "MultiHeadConfig", "MuToR1DConfig", "MuToR2DConfig", "NTPConfig",
           "ObjectiveConfig", "ObjectiveResult", "RegisterObjective", "TokenModel", "masked_ce", "mix", "token_ce"]
