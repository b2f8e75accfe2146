"""Config of a language-model fine-tuning run: a YAML file with top-level ``task: lm``.

Built on mutor2d.config (shared rules); only the model, data and eval sections live here. objective:
any registered variant that trains on a 1 x N line (default mutor-1d).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

from ..checks import ConfigError, at_least, at_most, check_workers, fail
from ..config import ConfigRoot, build_tagged, variant_class
from ..config_files import read_mapping
from ..registry import register
from ..run_configs import register_run_config
from ..engine.config import OptimConfig, TrainConfig
from ..objectives.config import ObjectiveConfig
from ..sampling.config import decode_modes

TASK = "lm"                                   # a YAML whose top-level ``task`` is this is an LM run
DEFAULT_OBJECTIVE = "mutor-1d"
SECTIONS = ("model", "data", "objective", "optim", "train", "eval")


LORA_R_LIMIT = 8192         # model.lora_r: the width of Llama-3-70B


@dataclass
class LMModelConfig:
    """hf: local folder (or cached hub name) of a causal LM (empty when ``train()`` gets a model object);
    prompt_attention: causal or bidirectional (prompt tokens see the whole prompt, never the answer)."""
    hf: str = ""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    finetune: Literal["lora", "full"] = "lora"
    lora_r: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.05
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    attn_implementation: Literal["sdpa", "eager", "flex_attention"] = "sdpa"
    gradient_checkpointing: bool = False
    prompt_attention: Literal["causal", "bidirectional"] = "causal"

    def check(self) -> None:
        at_least("model.lora_r", self.lora_r, 1)
        at_most("model.lora_r", self.lora_r, LORA_R_LIMIT, "a rank past a layer's width adds nothing")
        if not 0 <= self.lora_dropout < 1:
            fail("model.lora_dropout", "a number in [0, 1)", self.lora_dropout)


@dataclass
class LMDataConfig:
    """name: jsonl, gsm8k or math lines (mutor2d.lm.data); ``group_by_length``: mutor2d.engine.data_order."""
    name: Literal["jsonl", "gsm8k", "math"] = "jsonl"
    path: str = ""
    max_prompt_len: int = 512
    max_answer_len: int = 512
    add_eos: bool = True
    padding_side: Literal["left", "right"] = "right"
    group_by_length: bool = True
    num_workers: int = 0

    def check(self) -> None:
        if not self.path:
            fail("data.path", "a jsonl file", self.path)
        at_least("data.max_prompt_len", self.max_prompt_len, 1)
        at_least("data.max_answer_len", self.max_answer_len, 2)   # a target needs an input before it
        check_workers("data.num_workers", self.num_workers)


@dataclass
class LMEvalConfig:
    """Online accuracy (OnlineAccuracy) on the first ``limit`` (0 = all) items of ``path`` ("" = off),
    scored under ``kind`` ("" = from the file); ``decode``: plain, registers or auto."""
    path: str = ""
    name: Literal["jsonl", "gsm8k", "math"] = "jsonl"
    kind: Literal["", "gsm8k", "math", "path"] = ""
    limit: int = 0
    max_new_tokens: int = 256
    batch_size: int = 16
    stop: list[str] = field(default_factory=lambda: ["\nQuestion:", "\nProblem:"])
    decode: str = "plain"

    def check(self) -> None:
        if self.decode not in decode_modes("text"):
            fail("eval.decode", f"one of {decode_modes('text')}", self.decode)
        at_least("eval.limit", self.limit, 0)
        at_least("eval.max_new_tokens", self.max_new_tokens, 1)
        at_least("eval.batch_size", self.batch_size, 1)
        if any(not s for s in self.stop):
            fail("eval.stop", "non-empty stop strings", self.stop)


@register("optim.lm", "mutor2d.lm.run:build_optimizer")
@dataclass
class LMOptimConfig(OptimConfig):
    """The shared optimiser fields (fine-tuning defaults) plus ``register_lr`` (None: optim.lr)."""
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    register_lr: float | None = None

    def check(self) -> None:
        super().check()
        if self.register_lr is not None and self.register_lr <= 0:
            fail("optim.register_lr", "> 0 or null", self.register_lr)


@register_run_config(TASK, kind="mutor2d.lm.run:LMRun")
@dataclass
class LMRunConfig(ConfigRoot):
    sections = SECTIONS
    model: LMModelConfig = field(default_factory=LMModelConfig)
    data: LMDataConfig = field(default_factory=LMDataConfig)
    objective: ObjectiveConfig = field(default_factory=lambda: _objective({}))
    optim: LMOptimConfig = field(default_factory=LMOptimConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(batch_size=8, ckpt_every=500,
                                                                   max_nonfinite=20))  # fine-tuning defaults
    eval: LMEvalConfig = field(default_factory=LMEvalConfig)

    def check(self) -> "LMRunConfig":
        super().check()
        if self.train.ema:
            fail("train.ema", f"False for task: {TASK} (an image-run setting)", self.train.ema)
        if self.train.eval_every and not self.eval.path:
            fail("train.eval_every", "0 unless eval.path names an evaluation file", self.train.eval_every)
        return self

    @classmethod
    def build(cls, section: str, value: Any):
        """The objective gets the line defaults of its variant and must train on a line."""
        return _objective(value) if section == "objective" else super().build(section, value)


def _objective(data: Any) -> ObjectiveConfig:
    """The objective variant of ``data`` (default mutor-1d) with its line defaults, checked to train on a line."""
    if isinstance(data, dict):
        data = {"name": DEFAULT_OBJECTIVE, **data}
        data = {**variant_class("objective", data["name"]).line_defaults(), **data}
    section = build_tagged("objective", data)
    section.check_line()
    return section


def is_lm_config(name: str | os.PathLike) -> bool:
    """True when the YAML ``name`` has top-level ``task: lm``."""
    try:
        return read_mapping(name).get("task") == TASK
    except ConfigError:
        return False


def load(cfg: str | os.PathLike | dict | LMRunConfig, overrides: list[str] | None = None) -> LMRunConfig:
    """A YAML path/name, a dict or an LMRunConfig (+ ``section.key=value`` overrides) -> checked LMRunConfig."""
    return LMRunConfig.load(cfg, overrides)
