"""The network: a LlamaGen-style decoder and what it is built from, one module each.

  gpt           the decoder (GPT, ModelConfig, the LlamaGen size presets and weight loading)
  attention     attention backends over a token-visibility rule (key rank <= query limit)
  conditioning  the prefix kinds a sample is conditioned on (class labels, prompts, plugins)

The model knows nothing of registers beyond "extra tokens with given position ids and a given
visibility rule" (mutor2d.registers builds those).
"""
from .gpt import GPT, ModelConfig  # noqa: E402  the public names: ``from mutor2d.model import GPT, ModelConfig``

__all__ = ["GPT", "ModelConfig"]
