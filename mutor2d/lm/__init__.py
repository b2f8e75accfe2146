"""Fine-tuning of Hugging Face causal LMs with any objective of mutor2d.objectives (NTP, MuToR-1D,
the multi-head baseline, plugins) (optional extra ``lm``: transformers, peft).

Modules: config (``task: lm`` YAML -> LMRunConfig, built on mutor2d.config), records (jsonl / chat / GSM8K /
MATH lines -> records), prompts (records -> prompt and answer token ids), offline_tokenizers (character- and
word-level tokenizers without a download), data (``python -m mutor2d.lm.data``: converters, star graphs as
text, ``check``), accuracy (answer extraction and exact-match scoring, pure Python),
packing (a batch in the canonical frame the objectives read, and its physical sequence), model
(MutorLM: the transformers model, register embedding and extra heads; FramedLM: the objectives'
model interface on one batch; no loss code), hf (load / LoRA / save / generate), speculative (exact
plain or register-drafted decoding by the image decoder's round loop, mutor2d.sampling.rounds),
drafter (a run's register embedding and draft offsets; what ``--decode`` means for a run), rows (when a
decoded row ends: EOS, stop strings, the length limit), extrapolation (NLL per answer
position of a run on longer held-out answers, its trained limits marked), run (the engine's parts for LM runs: the
same loop, resume, stop signals and guards as image runs).
Importing this package needs nothing beyond Python (``config`` needs yaml; a run torch; transformers and
peft on use).

    python -m mutor2d.lm.data gsm8k gsm8k_train.jsonl data/gsm8k_train.jsonl
    python train.py --config sft_gsm8k_mutor.yaml --set model.hf=/path/to/model   # or sft_gsm8k_ntp
    mutor2d.lm.train("sft_gsm8k_mutor.yaml", "runs/x", ["train.max_steps=100"])    # same, from Python
    mutor2d.lm.train(cfg, "runs/x", model=lm, tokenizer=tok)                        # an in-memory model
    python eval/lm_accuracy.py --ckpt runs/x --data data/gsm8k_test.jsonl            # greedy accuracy
    AutoModelForCausalLM.from_pretrained("runs/x")     # plain transformers; generate as usual
"""
from __future__ import annotations


def train(cfg, out_dir, overrides=None, resume: str | None = None, model=None, tokenizer=None):
    """Fine-tune per ``cfg`` (YAML path/name, dict or LMRunConfig) into ``out_dir`` with the engine
    (mutor2d.engine.loop.train; ``resume``: None, "auto" or a checkpoint / run folder), optionally on a
    given transformers ``model`` / ``tokenizer`` object instead of loading ``model.hf``."""
    from ..engine.loop import train as engine_train
    from .config import load as load_config
    from .run import LMRun
    cfg = load_config(cfg, overrides)
    return engine_train(cfg, out_dir, resume=resume, kind=LMRun(model, tokenizer))
