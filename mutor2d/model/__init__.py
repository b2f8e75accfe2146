"""The network: a LlamaGen-style decoder and what it is built from, one module each.

  config        the ``model`` section (ModelConfig, the LlamaGen size presets); no torch
  gpt           the decoder (GPT)
  cache         the decode cache's steps: what a cached step writes and reads
  llamagen      LlamaGen checkpoints into a GPT (strict key and shape checks)
  attention     attention backends over a token-visibility rule (key rank <= query limit)
  conditioning  the prefix kinds a sample is conditioned on (class labels, prompts, plugins)
  embedders     the class-label embedding (with its null class for CFG)

The model knows nothing of registers beyond "extra tokens with given position ids and a given
visibility rule" (mutor2d.objectives.layout builds those). Only ``config`` is free of torch.
"""
