"""Fine-tuning of Hugging Face causal LMs with any objective of mutor2d.objectives (optional extra ``lm``).

Importing this package needs nothing beyond Python (``config`` needs yaml; a run torch; transformers and
peft on use).

    python train.py --config sft_gsm8k_mutor.yaml --set model.hf=/path/to/model   # or sft_gsm8k_ntp
    mutor2d.lm.train("sft_gsm8k_mutor.yaml", "runs/x", ["train.max_steps=100"])    # same, from Python
    mutor2d.lm.train(cfg, "runs/x", model=lm, tokenizer=tok)                        # an in-memory model
"""
from __future__ import annotations


def train(cfg, out_dir, overrides=None, resume: str | None = None, model=None, tokenizer=None):
    """Fine-tune per ``cfg`` (YAML path/name, dict or LMRunConfig) into ``out_dir`` with the engine,
    optionally on a given ``model`` / ``tokenizer`` instead of ``model.hf``."""
    from ..engine.loop import train as engine_train
    from .config import load as load_config
    from .run import LMRun
    return engine_train(load_config(cfg, overrides), out_dir, resume=resume, kind=LMRun(model, tokenizer))
