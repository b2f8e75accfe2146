"""Fine-tune a transformers causal LM with NTP or MuToR-1D: ``train(config, out_dir, overrides)``.

One process or many (``accelerate launch train.py --config sft_gsm8k_mutor.yaml``). Each step packs
a padded batch (mutor2d.lm.packing), runs MutorLM, and steps AdamW; the learning rate follows the
image trainer's schedule (mutor2d.engine.setup.build_scheduler: linear warmup, then constant or cosine).
The run folder gets config.yaml, log.jsonl (one line per ``log_every`` steps: step, loss,
loss_ntp[, loss_reg], lr, slots_per_s: regular + register
slots processed per second, padding included) and the saved model (mutor2d.lm.hf.save) at
``save_every`` steps (folder step_N/) and at the end (the run folder itself).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from ..config import fail
from ..engine.setup import build_scheduler
from ..registers import RegisterSpec
from . import config as config_lib
from .data import LengthGroupedBatches, collate, load_located, tokenize
from .hf import build, load_causal_lm, load_tokenizer, save, with_pad_token
from .packing import pack


def make_optimizer(model, optim_cfg) -> torch.optim.Optimizer:
    """AdamW over trainable parameters; the register embedding gets optim.register_lr if set and
    no weight decay."""
    reg = [p for n, p in model.named_parameters() if p.requires_grad and n == "register_embedding"]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and n != "register_embedding"]
    groups = [{"params": rest}]
    if reg:
        groups.append({"params": reg, "weight_decay": 0.0, "lr": optim_cfg.register_lr or optim_cfg.lr})
    return torch.optim.AdamW(groups, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas),
                             weight_decay=optim_cfg.weight_decay)


def _batches(loader):
    while True:
        yield from loader


def train(cfg, out_dir: str | Path, overrides: list[str] | None = None, model=None, tokenizer=None) -> Path:
    """cfg: YAML path/name, dict or LMRunConfig. ``model`` / ``tokenizer``: transformers objects to
    fine-tune instead of loading ``model.hf`` (which then only names the base; default: the model's
    ``name_or_path``). Every data line is checked before the model loads. Returns the run folder."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    cfg = config_lib.load(cfg, overrides)
    cfg.model.hf = base_reference(cfg, model, tokenizer)
    t, out = cfg.train, Path(out_dir)
    acc = Accelerator(mixed_precision=t.mixed_precision, gradient_accumulation_steps=t.grad_accum)
    set_seed(t.seed)
    located = load_located(cfg.data.name, cfg.data.path)
    tokenizer = with_pad_token(tokenizer) if tokenizer is not None else load_tokenizer(cfg.model.hf)
    examples = tokenize([r for _, r in located], tokenizer, cfg.data.max_prompt_len, cfg.data.max_answer_len,
                        cfg.data.add_eos, where=[w for w, _ in located])
    lm = model if model is not None else load_causal_lm(cfg.model.hf, cfg.model.dtype, cfg.model.attn_implementation)
    model = build(lm, cfg.model, cfg.objective, base_ref=cfg.model.hf)
    pad_id = tokenizer.pad_token_id
    if t.group_by_length:
        sampler = LengthGroupedBatches([len(p) + len(a) for p, a in examples], t.batch_size, t.seed)
        loader = DataLoader(examples, batch_sampler=sampler, collate_fn=lambda ex: collate(ex, pad_id))
    else:
        loader = DataLoader(examples, batch_size=t.batch_size, shuffle=True, drop_last=False,
                            collate_fn=lambda ex: collate(ex, pad_id),
                            generator=torch.Generator().manual_seed(t.seed))
    opt = make_optimizer(model, cfg.optim)
    sched = build_scheduler(opt, cfg.optim, t.max_steps)  # driven per update: step_update(n)
    model, opt = acc.prepare(model, opt)
    loader = acc.prepare_data_loader(loader, device_placement=False)
    spec = RegisterSpec.from_config(cfg.objective)
    gen = torch.Generator().manual_seed(t.seed * 1000 + acc.process_index)
    if acc.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(config_lib.dump(cfg))
    model.train()
    batches, slots, clock = _batches(loader), 0, time.perf_counter()
    for step in range(1, t.max_steps + 1):
        sched.step_update(step)                           # the lr of update ``step`` (1-based)
        for _ in range(t.grad_accum):
            packed = pack(next(batches), spec, t.padding_side, pad_id, gen).to(acc.device)
            with acc.accumulate(model):
                result = model(packed)
                acc.backward(result["loss"])
                if acc.sync_gradients and cfg.optim.grad_clip > 0:
                    acc.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
            slots += packed.position_ids.numel()
        if step % t.log_every == 0 or step == t.max_steps:
            _log(acc, out, step, result, opt.param_groups[0]["lr"], slots / (time.perf_counter() - clock))
        if t.save_every and step % t.save_every == 0 and step < t.max_steps:
            _save(acc, model, out / f"step_{step}", tokenizer)
    _save(acc, model, out, tokenizer)
    return out


def base_reference(cfg, model, tokenizer) -> str:
    """model.hf as given, else the model object's ``name_or_path``. Needed unless both objects are
    given to a full fine-tuning (a LoRA adapter folder names the base it loads on)."""
    ref = cfg.model.hf or (getattr(model, "name_or_path", "") if model is not None else "")
    if not ref and (model is None or tokenizer is None or cfg.model.finetune == "lora"):
        fail("model.hf", "a local folder or cached hub name of the base model (a LoRA run on a model "
                         "object without name_or_path must name where its base loads from)", ref)
    return ref


def _log(acc, out: Path, step: int, result: dict, lr: float, slots_per_s: float) -> None:
    if not acc.is_main_process:
        return
    row = {"step": step, "lr": lr, "slots_per_s": round(slots_per_s, 1)}
    row.update({k: float(v.detach()) for k, v in result.items() if k.startswith("loss")})
    with open(out / "log.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def _save(acc, model, folder: Path, tokenizer) -> None:
    acc.wait_for_everyone()
    if acc.is_main_process:
        save(acc.unwrap_model(model), folder, tokenizer)
