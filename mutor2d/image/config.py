"""Config of an image run (the default ``task``): a GPT over token grids trained with an objective.

Sections (each package's torch-free ``config`` module): model (mutor2d.model), data (a ``data.name``
variant, mutor2d.data), objective (an ``objective.name`` variant, mutor2d.objectives), optim
(mutor2d.engine), train (the engine's TrainConfig plus the image-run settings below), sample
(mutor2d.sampling). Rules across sections:
the online evaluation needs digits with class labels; classifier-free guidance needs a null prefix;
once the data is known, grid-dependent settings are checked against its grid (``check_data``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..checks import ConfigError, at_least, at_most
from ..config import ConfigRoot, make, register_section
from ..run_configs import register_run_config
from ..engine.config import TrainConfig

EVAL_PER_CLASS_LIMIT = 10_000      # train.eval_per_class: samples per class of one online evaluation


@register_section("train")
@dataclass
class ImageTrainConfig(TrainConfig):
    """The engine's TrainConfig plus what only image runs do: sample grids, the online digits
    evaluation's size, compiled blocks and weights to start from."""
    sample_every: int = 0            # 0 = only at the end
    eval_per_class: int = 20         # samples per class for the online evaluation
    compile: bool = False
    init_from: str = ""              # fresh runs: start from these weights (a mutor2d checkpoint or
                                     # run folder, or a LlamaGen GPT checkpoint); "" = random init

    def check(self) -> None:
        super().check()
        at_least("train.sample_every", self.sample_every, 0)
        at_least("train.eval_per_class", self.eval_per_class, 1)
        at_most("train.eval_per_class", self.eval_per_class, EVAL_PER_CLASS_LIMIT,
                "samples per class of each online evaluation, made in memory")


@register_run_config("image", kind="mutor2d.image.run:ImageRun")
@dataclass
class ImageRunConfig(ConfigRoot):
    """Every section of an image run; defaults are the registered sections' defaults."""
    sections = ("model", "data", "objective", "optim", "train", "sample")
    model: Any = field(default_factory=lambda: make("model"))
    data: Any = field(default_factory=lambda: make("data"))
    objective: Any = field(default_factory=lambda: make("objective"))
    optim: Any = field(default_factory=lambda: make("optim"))
    train: Any = field(default_factory=lambda: make("train"))
    sample: Any = field(default_factory=lambda: make("sample"))

    def check(self) -> "ImageRunConfig":
        """Every section's rules, then the rules across sections."""
        super().check()
        kind = self.model.conditioning_kind()
        if self.train.eval_every and (self.data.name != "digits" or not kind.per_class):
            raise ConfigError(f"train.eval_every: the online evaluation needs data.name=digits with class "
                              f"labels, got data.name={self.data.name!r}, model.conditioning={kind.name!r}")
        if not kind.guidable and self.sample.cfg_scale != 1:
            raise ConfigError(f"sample.cfg_scale={self.sample.cfg_scale}: classifier-free guidance needs "
                              f"a null prefix (model.conditioning={kind.name!r} has none); use 1")
        return self

    def check_data(self, grid: tuple[int, int], prefix_len: int, num_classes: int | None = None) -> None:
        """Rules that need the data: its body grid (H, W), prefix length and class count. sample.classes
        index the grid rows: the data's classes for class labels, else the kind's fixed choices."""
        self.model.check_grid(grid)
        self.objective.check_grid(grid, prefix_len)
        self.sample.decode.fit(self.objective, grid)
        kind = self.model.conditioning_kind()
        count = num_classes if kind.per_class else kind.num_choices(self.model)
        what = "a class of the data" if kind.per_class else f"a choice of model.conditioning={kind.name!r}"
        if count is not None:
            self.sample.check_classes(count, what)
