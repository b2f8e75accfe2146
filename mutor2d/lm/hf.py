"""Loading, adapting and saving transformers models for MuToR-1D fine-tuning.

* :func:`load_causal_lm` / :func:`load_tokenizer`: from a local folder only (``local_files_only``);
  a missing folder is a one-line LMModelError naming where it looked.
* :func:`build` -> MutorLM: LoRA through peft (base frozen; adapters and the register embedding
  train) or full fine-tuning (everything trains).
* :func:`save`: LoRA -> the peft adapter (adapter_model.safetensors + adapter_config.json); full ->
  the whole model (model.safetensors); both + ``register_embedding.safetensors`` + the tokenizer.
  The folder loads in plain transformers (``AutoModelForCausalLM.from_pretrained(folder)``; an
  adapter folder needs peft installed and its base folder in place). Registers are training-only:
  inference is the model's own ``generate``.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .model import MutorLM

REGISTER_FILE = "register_embedding.safetensors"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class LMModelError(ValueError):
    """A model that cannot be loaded or adapted; one line."""


def _check_folder(path: str | Path, what: str) -> Path:
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file():
        raise LMModelError(f"model.hf={str(path)!r}: no {what} at {folder.resolve()} "
                           "(expected a local folder with config.json; nothing is downloaded)")
    return folder


def load_causal_lm(path: str | Path, dtype: str = "float32", attn_implementation: str = "sdpa"):
    from transformers import AutoModelForCausalLM
    folder = _check_folder(path, "transformers model").resolve()
    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=DTYPES[dtype],
                                                attn_implementation=attn_implementation)


def position_limit(path: str | Path) -> int | None:
    """The model's number of positions (max_position_embeddings, or GPT-2's n_positions), read from
    its config.json without loading weights; None if it declares none."""
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(_check_folder(path, "transformers model"), local_files_only=True)
    config = getattr(config, "text_config", None) or config
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(_check_folder(path, "tokenizer"), local_files_only=True)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def apply_lora(lm, r: int, alpha: float, dropout: float, targets: list[str]):
    """Wrap ``lm`` with peft LoRA adapters on modules named in ``targets``; the base is frozen."""
    from peft import LoraConfig, get_peft_model
    try:
        return get_peft_model(lm, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                                             target_modules=list(targets), task_type="CAUSAL_LM"))
    except ValueError as e:
        raise LMModelError(f"model.lora_targets={list(targets)}: {str(e).splitlines()[0]}") from None


def build(lm, model_cfg, objective_cfg) -> MutorLM:
    """Wrap a loaded causal LM per the config: LoRA or full fine-tuning, register embedding for
    mutor-1d, optional (non-reentrant) gradient checkpointing. With LoRA only adapters + register
    embedding require grad."""
    registers = objective_cfg.uses_registers()
    if model_cfg.gradient_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if model_cfg.finetune == "lora":
        lm = apply_lora(lm, model_cfg.lora_r, model_cfg.lora_alpha, model_cfg.lora_dropout,
                        model_cfg.lora_targets)
    else:
        lm.requires_grad_(True)
    reg_weight = objective_cfg.reg_weight if registers else 0.0     # ntp has no reg_weight field
    return MutorLM(lm, reg_weight, registers=registers)  # register embedding: float32


def save(model: MutorLM, out_dir: str | Path, tokenizer=None) -> Path:
    """Write adapters (or the full model), the register embedding and the tokenizer as safetensors."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.lm.save_pretrained(out, safe_serialization=True)
    if model.has_registers:
        save_file({"register_embedding": model.register_embedding.detach().cpu().contiguous()}, out / REGISTER_FILE)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def load_register_embedding(model: MutorLM, folder: str | Path) -> None:
    """Copy a saved register embedding into ``model`` (to continue training)."""
    saved = load_file(str(Path(folder) / REGISTER_FILE))["register_embedding"]
    with torch.no_grad():
        model.register_embedding.copy_(saved)


def load_for_inference(folder: str | Path, dtype: str = "float32"):
    """Plain transformers model from a saved folder (adapters merged when there are any)."""
    lm = load_causal_lm(folder, dtype)
    if hasattr(lm, "merge_and_unload"):
        lm = lm.merge_and_unload()
    return lm
