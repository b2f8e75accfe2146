"""The VQ tokenizer run kind: training a VQ image tokenizer through the engine (see run)."""
