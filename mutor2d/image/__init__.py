"""The image run kind: a GPT over token grids trained with an objective (see run)."""
