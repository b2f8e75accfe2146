"""Loading, adapting, saving and generating with transformers models for MuToR-1D fine-tuning.

Loads are ``local_files_only`` (a missing model is a one-line LMModelError). :func:`save`: LoRA -> peft
adapter, full -> model.safetensors, both + ``register_embedding.safetensors`` + the tokenizer.
"""
from __future__ import annotations

import json
import pickle
import re
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from .. import io, provenance
from ..checks import check_model_fits
from ..model.attention import NEVER, Visibility
from ..sampling.config import decode_modes
from . import drafter, speculative
from .model import PROMPT_ATTR, REGISTER_FILE, MutorLM, attention_mask, cache_kwarg, head_layers

INFERENCE_FILE = "mutor2d_inference.json"     # how a saved model is run: {"prompt_attention": ...}
CHECKSUMS_FILE = "mutor2d_checksums.json"     # {"sha256": {weight file: its SHA-256}}, written by save
WEIGHT_SUFFIXES = (".safetensors", ".bin")
ADAPTER_CONFIG = "adapter_config.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


class LMModelError(ValueError):
    """A model that cannot be loaded or adapted; one line."""


def _load(cls, ref: str | Path, what: str, key: str = "model.hf", markers=("config.json", ADAPTER_CONFIG),
          **kwargs):
    """``cls.from_pretrained(ref)`` from a local folder (holding one of ``markers``) or the local hub cache."""
    folder = Path(ref).expanduser()
    local = folder.is_dir()
    where = f"{key}={str(ref)!r}: no {what} at {folder.resolve()}"
    if local and markers and not any((folder / m).is_file() for m in markers):
        raise LMModelError(f"{where} (expected a local folder with config.json; nothing is downloaded)")
    if not local and not _HUB_NAME.fullmatch(str(ref)):
        raise LMModelError(f"{where} (expected a local folder or a cached hub name; nothing is downloaded)")
    try:
        with refusing_pickles(key, ref):
            return cls.from_pretrained(str(ref) if not local else folder, local_files_only=True, **kwargs)
    except (OSError, ValueError, SafetensorError) as e:      # transformers' own messages are many lines
        if not local and isinstance(e, OSError):
            raise LMModelError(f"{where} and none in the local Hugging Face cache (expected a local folder "
                               "or a cached hub name; nothing is downloaded)") from None
        source = folder.resolve() if local else "the local Hugging Face cache"
        raise LMModelError(f"{key}={str(ref)!r}: cannot load the {what} from {source}: "
                           f"{str(e).splitlines()[0].strip()}") from None


@contextmanager
def refusing_pickles(key: str, ref):
    """A weights file ``torch.load(weights_only=True)`` refuses becomes one LMModelError line."""
    try:
        yield
    except pickle.UnpicklingError:
        raise LMModelError(f"{key}={str(ref)!r}: its weights file holds pickled Python objects beyond tensors "
                           "and is refused (it could run code); use a safetensors copy") from None


def load_causal_lm(path: str | Path, dtype: str = "float32", attn_implementation: str = "sdpa",
                   key: str = "model.hf"):
    from transformers import AutoModelForCausalLM
    check_weights_fit(path, dtype, key)
    return _load(AutoModelForCausalLM, path, "transformers model", key, dtype=DTYPES[dtype],
                 attn_implementation=attn_implementation,
                 adapter_kwargs={"local_files_only": True})   # transformers does not pass it on itself


def load_model_config(path: str | Path, key: str = "model.hf"):
    """A model's transformers config, read without its weights."""
    from transformers import AutoConfig
    return _load(AutoConfig, path, "transformers model", key)


def check_weights_fit(path: str | Path, dtype: str, key: str = "model.hf") -> None:
    """The weights alone at ``dtype`` must fit this machine (counted on meta): else one ConfigError line."""
    from transformers import AutoModelForCausalLM
    if Path(path).expanduser().is_dir() and not (Path(path).expanduser() / "config.json").is_file():
        return
    config = load_model_config(path, key)
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    check_model_fits(params, f"{key}={path}", DTYPES[dtype].itemsize)


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer
    return with_pad_token(_load(AutoTokenizer, path, "tokenizer", markers=()))


def with_pad_token(tok):
    """``tok`` with a padding token (its EOS when it has none)."""
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def apply_lora(lm, r: int, alpha: float, dropout: float, targets: list[str], base_ref: str | None = None):
    """Wrap ``lm`` with peft LoRA on ``targets`` (base frozen); ``base_ref``: the stored base reference."""
    from peft import LoraConfig, get_peft_model
    try:
        with warnings.catch_warnings():     # peft asks transformers' deprecated is_gradient_checkpointing
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            model = get_peft_model(lm, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                                                  target_modules=list(targets), task_type="CAUSAL_LM"))
    except ValueError as e:
        raise LMModelError(f"model.lora_targets={list(targets)}: {str(e).splitlines()[0]}") from None
    if base_ref:
        model.peft_config["default"].base_model_name_or_path = str(base_ref)
    return model


def build(lm, model_cfg, objective_cfg, base_ref: str | None = None) -> MutorLM:
    """Wrap a loaded causal LM per the config: LoRA or full, register embedding, extra head layers
    (always trainable), optional non-reentrant gradient checkpointing."""
    count = objective_cfg.num_head_layers()
    heads = head_layers(lm, count) if count else None          # copied before LoRA adapts the last layer
    if model_cfg.gradient_checkpointing:
        if hasattr(lm, "activation_checkpointing_enable"):          # the transformers 5 name
            lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if model_cfg.finetune == "lora":
        lm = apply_lora(lm, model_cfg.lora_r, model_cfg.lora_alpha, model_cfg.lora_dropout,
                        model_cfg.lora_targets, base_ref)
    else:
        lm.requires_grad_(True)
    return MutorLM(lm, registers=objective_cfg.uses_registers(), heads=heads,      # registers: float32
                   prompt_attention=model_cfg.prompt_attention)


def save(model: MutorLM, out_dir: str | Path, tokenizer=None, state: dict | None = None) -> Path:
    """Write adapters (or the full model), register embedding and tokenizer; ``state``: a gathered state dict."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lm_state = {k[len("lm."):]: v for k, v in state.items() if k.startswith("lm.")} if state else None
    # an adapter: the vocabulary never changes, so no base-config lookup for embedding layers
    adapter = {"save_embedding_layers": False} if hasattr(model.lm, "peft_config") else {}
    model.lm.save_pretrained(out, safe_serialization=True, state_dict=lm_state, **adapter)
    if model.has_registers:
        register = state["register_embedding"] if state else model.register_embedding.detach()
        save_file({"register_embedding": register.cpu().contiguous()}, out / REGISTER_FILE)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    write_checksums(out)
    (out / INFERENCE_FILE).write_text(json.dumps({"prompt_attention": model.prompt_attention}) + "\n")
    return out


def write_checksums(folder: Path) -> Path:
    """FOLDER/mutor2d_checksums.json: the SHA-256 of every weight file in ``folder`` (save's)."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    return io.write_json_atomic(folder / CHECKSUMS_FILE, {"sha256": {n: io.file_sha256(folder / n) for n in names}})


def verify_checksums(folder: Path) -> None:
    """Each weight file recorded in mutor2d_checksums.json has that SHA-256, else one LMModelError."""
    record = folder / CHECKSUMS_FILE
    if not record.is_file():
        io.warn(f"{str(folder)!r} has no {CHECKSUMS_FILE} (not written by mutor2d's training): its weights "
                "load unverified", once=True)
        return
    try:
        expected = json.loads(record.read_text())["sha256"]
        items = [(str(name), str(sha)) for name, sha in expected.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise LMModelError(f"{record}: not a checksum record ({type(e).__name__}); expected "
                           '{"sha256": {file: hex digest}}') from None
    for name, sha in items:
        path = folder / name
        if not path.is_file():
            raise LMModelError(f"{path}: missing, though {CHECKSUMS_FILE} recorded it at save")
        if io.file_sha256(path) != sha:
            raise LMModelError(f"{path} is corrupt: its SHA-256 does not match the one {CHECKSUMS_FILE} "
                               "recorded at save")


RUN_RECORDS = frozenset({"config.yaml", "log.jsonl", "provenance.json", "run.lock"})   # a run folder's, not the model's


def base_fingerprint(ref: str) -> dict:
    """model.hf's fingerprint: a local folder's top-level files but RUN_RECORDS; a hub name by name."""
    folder = Path(ref)
    if not folder.is_dir():
        return provenance.named(str(ref))
    names = {p.name for p in folder.iterdir() if p.is_file() and p.name not in RUN_RECORDS}
    return provenance.fingerprint(folder, names)


def saved_prompt_attention(folder: str | Path) -> str:
    """The ``prompt_attention`` a saved folder was trained with (folders written before: causal)."""
    path = Path(folder) / INFERENCE_FILE
    if not path.is_file():
        return "causal"
    try:
        found = json.loads(path.read_text()).get("prompt_attention", "causal")
    except (OSError, ValueError, AttributeError):
        raise LMModelError(f"{path}: not a JSON object with prompt_attention") from None
    if found not in ("causal", "bidirectional"):
        raise LMModelError(f"{path}: prompt_attention={found!r}, expected 'causal' or 'bidirectional'")
    return found


def load_for_inference(folder: str | Path, dtype: str = "float32", merge: bool = True,
                       attn_implementation: str = "sdpa"):
    """The fine-tuned model of a saved folder in eval mode, its checksums verified; LoRA: the base plus
    adapters (merged when ``merge``); bidirectional-trained models prefill prompts that way."""
    folder = Path(folder)
    adapter = folder / ADAPTER_CONFIG
    if folder.is_dir():
        verify_checksums(folder)
    rule = saved_prompt_attention(folder)
    if not adapter.is_file():
        return with_prompt_attention(load_causal_lm(folder, dtype, attn_implementation).eval(), rule)
    from peft import PeftModel
    base_ref = json.loads(adapter.read_text()).get("base_model_name_or_path") or ""
    base = load_causal_lm(base_ref, dtype, attn_implementation, key=f"{adapter}: base_model_name_or_path")
    with refusing_pickles("adapter", folder):
        model = PeftModel.from_pretrained(base, folder, is_trainable=False)
    return with_prompt_attention((model.merge_and_unload() if merge else model).eval(), rule)


def with_prompt_attention(model, rule: str):
    """``model`` whose ``generate`` prefills prompts under ``rule`` (bidirectional), else as it is."""
    setattr(model, PROMPT_ATTR, rule)
    if rule == "causal":
        return model
    plain, name = model.generate, cache_kwarg(model)

    def generate(input_ids=None, attention_mask=None, **kwargs):
        if kwargs.get(name) is None:
            kwargs[name] = prefill_prompts(model, input_ids, attention_mask)
        return plain(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    model.generate = generate
    return model


@torch.no_grad()
def prefill_prompts(lm, input_ids, mask):
    """A DynamicCache of left-padded prompts (B, L) without their last token, each prompt token having
    seen the whole prompt (padding excluded): a bidirectional prefill once ``generate`` runs the last token."""
    real, L = mask.bool(), input_ids.shape[1]
    vis = Visibility(torch.where(real, torch.arange(L, device=real.device), NEVER), torch.where(real, L - 1, -1))
    position_ids = (mask.long().cumsum(1) - 1).clamp(min=0)
    dtype = lm.get_input_embeddings().weight.dtype
    cache = speculative.new_cache()      # full layers, also for sliding-window models: crop(-1) needs every token
    lm(input_ids=input_ids, attention_mask=attention_mask(lm.config, vis, position_ids, dtype),
       position_ids=position_ids, use_cache=True, logits_to_keep=1, **{cache_kwarg(lm): cache})
    cache.crop(-1)
    return cache


def maps_stop_strings(tokenizer, stop) -> bool:
    """Whether transformers can build its stop-string criteria for ``stop`` on this vocabulary."""
    from transformers import StopStringCriteria
    try:
        StopStringCriteria(tokenizer=tokenizer, stop_strings=list(stop))
    except ValueError:
        return False
    return bool(stop)


def cut_at_stop(text: str, stop: list[str]) -> str:
    """``text`` up to the first occurrence of any stop string."""
    return text[:min([text.find(s) for s in stop if s in text], default=len(text))]


@torch.no_grad()
def generate(lm, tokenizer, prompt_ids: list[list[int]], max_new_tokens: int,
             stop: list[str] = (), synced: bool = False, prompt_attention: str | None = None,
             decode: str = "plain", registers=None, stats=None) -> list[str]:
    """Greedy continuations (decoded new text) of a batch of prompt ids (left-padded here), ending at
    EOS, a stop string (cut before it) or ``max_new_tokens``. ``synced``: transformers' ``synced_gpus``;
    ``decode``: plain, registers (exact, register-drafted) or auto; ``stats``: a ``DecodeStats``."""
    if decode not in decode_modes("text"):
        raise ValueError(f"decode={decode!r}: expected one of {', '.join(decode_modes('text'))}")
    if decode == "auto":
        decode = drafter.folder_mode(decode, registers) if isinstance(registers, (str, Path)) else \
            "plain" if registers is None else "registers"
    batch = tokenizer.pad({"input_ids": prompt_ids}, padding=True, padding_side="left", return_tensors="pt")
    device = next(lm.parameters()).device
    ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
    rule = prompt_attention or getattr(lm, PROMPT_ATTR, "causal")
    eos, raw_stop = speculative.eos_ids(lm), maps_stop_strings(tokenizer, stop)
    if decode == "registers":
        regs = registers if isinstance(registers, drafter.Registers) else drafter.load_registers(registers)
        new = speculative.generate_ids(lm, ids, mask, max_new_tokens, registers=regs, eos=eos, stop=stop,
                                       tokenizer=tokenizer, stats=stats, synced=synced, raw_stop=raw_stop,
                                       prompt_attention=rule)
    else:
        t0 = time.perf_counter()
        # stop strings end generation early where transformers can map them onto the vocabulary (not
        # character-level ones); the cut below gives the same text either way
        extra = {"stop_strings": list(stop), "tokenizer": tokenizer} if raw_stop else {}
        if rule == "bidirectional":
            extra[cache_kwarg(lm)] = prefill_prompts(lm, ids, mask)
        new = lm.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                          pad_token_id=tokenizer.pad_token_id, synced_gpus=synced, **extra)[:, ids.shape[1]:]
        if stats is not None:       # each row's tokens up to its first EOS or padding (counted), else all
            ends = torch.isin(new, torch.tensor([*eos, tokenizer.pad_token_id], device=new.device)).long()
            tokens = int((ends.cumsum(1) - ends == 0).sum())
            stats.add_plain(len(new), tokens, new.shape[1], tokens)     # one token per forward per row
            stats.seconds += time.perf_counter() - t0
    return [cut_at_stop(t, list(stop)) for t in tokenizer.batch_decode(new, skip_special_tokens=True)]
