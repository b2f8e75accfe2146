"""Training objectives, one module each; ``objective.name`` picks a config variant whose builder makes its loss.

An objective config (``ObjectiveConfig`` subclass in ``config``, registered with
``@register_variant("objective", NAME, build="module:function")``; no torch, so a config is checked
before torch is imported) names the builder of an nn.Module with ``forward(model, batch, generator)
-> ObjectiveResult`` and ``blocks()`` (transformer blocks it owns), and says which register rules it
follows (``register_spec()``) and whether the model needs its register embedding
(``uses_registers()``). ``model`` is a ``TokenModel``: the image GPT, or a transformers causal LM on
one batch of text (a grid of height 1), so every objective trains both. Adding one: its config in
``config``, its loss and builder in a module here (mutor2d.registry.build calls it). ``base`` holds the
batch, result and loss helpers every objective shares; ``token_prediction`` next-token prediction with or without registers (NTP, MuToR-1D and -2D).
"""
