"""The language-model run kind: a Hugging Face causal LM fine-tuned by the engine with any objective.

Data are checked before weights load; checkpoints keep the trainable parameters only (the frozen base
reloads from ``model.hf``); ``RUN/step_N/`` and the run folder get the transformers layout.
"""
from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch
from torch import nn

from .. import provenance, registry
from ..config import ConfigError, fail
from ..engine.hooks import due
from ..engine.rng import preserved_rng
from ..engine.runlog import eval_text
from ..engine.sharding import is_sharded
from ..io import say
from ..objectives.config import ObjectiveConfig
from ..sampling.stats import DecodeStats
from . import accuracy
from .config import LMOptimConfig, LMRunConfig
from .drafter import model_decoding, record_fields
from .hf import (ADAPTER_CONFIG, INFERENCE_FILE, base_fingerprint, build, generate, load_causal_lm, load_model_config,
                 load_tokenizer, save, with_pad_token)
from .model import MutorLM, frame_batch, position_limit
from .packing import LMBatch, collate
from .prompts import eval_prompts, tokenize
from .records import load_located


class Examples(list):
    """Tokenized (prompt ids, answer ids) pairs, the dataset; ``lengths`` (N,) for length-grouped batches."""

    def __init__(self, pairs: list[tuple[list[int], list[int]]]):
        super().__init__(pairs)
        self.lengths = torch.tensor([len(p) + len(a) for p, a in pairs])


def build_optimizer(cfg: LMOptimConfig, module: nn.Module, device_type: str) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; the register embedding: ``optim.register_lr``, no weight decay."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if not n.endswith("register_embedding")]}]
    if reg := [p for n, p in named if n.endswith("register_embedding")]:
        groups.append({"params": reg, "weight_decay": 0.0, "lr": cfg.register_lr or cfg.lr})
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)


class LMTrainModule(nn.Module):
    """MutorLM and its objective as one module: (padded LMBatch, layout generator) -> ObjectiveResult."""

    def __init__(self, model: MutorLM, objective_cfg: ObjectiveConfig, padding_side: str):
        super().__init__()
        self.model, self.objective = model, registry.build(objective_cfg, model)
        self.spec, self.padding_side = objective_cfg.register_spec(), padding_side

    def forward(self, batch: LMBatch, generator=None):
        device = self.model.register_embedding.device if self.model.has_registers else \
            next(self.model.parameters()).device
        view, canonical = frame_batch(self.model, batch, self.spec, self.padding_side, device)
        return self.objective(view, canonical, generator)


class LMRun:
    """The parts of a language-model run; ``model`` / ``tokenizer``: objects to fine-tune instead of ``model.hf``."""

    def __init__(self, model=None, tokenizer=None):
        self.given_model, self.tokenizer, self.trainable = model, tokenizer, set()
        self.eval_items, self.eval_kind = [], ""

    def prepare_data(self, cfg: LMRunConfig):
        """(Examples, cfg): every line read, validated, tokenized and position-checked before any weights load."""
        d = cfg.data
        cfg.model.hf = base_reference(cfg, self.given_model, self.tokenizer)
        try:
            located = load_located(d.name, d.path)
            self.tokenizer = with_pad_token(self.tokenizer) if self.tokenizer else load_tokenizer(cfg.model.hf)
            config = self.given_model.config if self.given_model is not None else load_model_config(cfg.model.hf)
            limit, pairs = position_limit(config), []
            if cfg.eval.path and limit is not None and cfg.eval.max_new_tokens > limit:
                fail("eval.max_new_tokens", f"at most {limit}, the model's positions", cfg.eval.max_new_tokens)
            for where, rec in located:
                more = tokenize([rec], self.tokenizer, d.max_prompt_len, d.max_answer_len, d.add_eos, [where])
                check_positions(more, limit, where)
                pairs += more
            if cfg.eval.path:
                self.eval_items, self.eval_kind = read_eval_items(cfg, self.tokenizer)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return Examples(pairs), cfg

    def collate(self, items: list):
        return collate(items, self.tokenizer.pad_token_id)

    def build_networks(self, cfg: LMRunConfig, saved: dict | None, dataset) -> tuple[MutorLM, LMTrainModule]:
        torch.manual_seed(cfg.train.seed)
        m = cfg.model
        try:
            lm = self.given_model if self.given_model is not None else \
                load_causal_lm(m.hf, m.dtype, m.attn_implementation)
            model = build(lm, m, cfg.objective, base_ref=m.hf)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        module = LMTrainModule(model, cfg.objective, cfg.data.padding_side)
        if saved is not None and "model" in saved:   # a sharded checkpoint loads after sharding
            load_trainable(model, saved["model"], self.trainable)
            module.objective.load_state_dict(saved.get("objective") or {}, strict=True)
        return model, module

    def blocks(self, module: LMTrainModule) -> list[nn.Module]:
        """The decoder layers of the causal LM (inside a peft wrapper, of its base model)."""
        return list(module.model.causal_lm.get_decoder().layers)

    def trainable_state(self, state: dict) -> dict:
        """Only the trained parameters: the frozen base is reloaded from model.hf."""
        return {k: v for k, v in state.items() if k in self.trainable}

    def hooks(self, run, log) -> list:
        online = [OnlineAccuracy(self.eval_items, self.eval_kind, self.tokenizer, log)] if self.eval_items else []
        if online and run.cfg.eval.decode == "registers":
            model_decoding("registers", run.model, run.cfg.objective)      # one-line error before training
        return [self.snapshot, *online]

    def snapshot(self, run, status) -> None:
        """RUN/step_N/ in the transformers layout at every checkpoint before the last (the last: ``finish``)."""
        skip = status.last or status.stopping or not status.healthy
        if not skip and due(run.cfg.train.ckpt_every, status, at_end=False):
            self.save_folder(run, run.run_dir / f"step_{status.done}")

    def rates(self, run, steps: int, applied: int, dt: float, sums: dict) -> dict:
        """Sequences/s and slots/s (regular + register slots of the canonical frame, padding included)."""
        rec = {"sequences_per_s": run.cfg.train.batch_size * steps / dt}
        if sums:
            rec["slots_per_s"] = sums["seq_tokens"] / dt
        return rec

    def finish(self, run) -> None:
        """The adapters (or full model), register embedding and tokenizer into the run folder."""
        self.save_folder(run, run.run_dir)

    def finished(self, run_dir) -> bool:
        """The saved model is in the run folder: its (adapter) config and the inference record hf.save writes last."""
        run_dir = Path(run_dir)
        model = (run_dir / "config.json").is_file() or (run_dir / ADAPTER_CONFIG).is_file()
        return model and (run_dir / INFERENCE_FILE).is_file()

    def sources(self, cfg: LMRunConfig) -> tuple[dict, dict]:
        """(the data file's fingerprint, the base model's: mutor2d.lm.hf.base_fingerprint)."""
        return provenance.fingerprint(cfg.data.path) or provenance.named(cfg.data.name), base_fingerprint(cfg.model.hf)

    def save_folder(self, run, folder) -> None:
        """Collective: the model in the transformers layout into ``folder`` (main process; sharded: gathered first)."""
        state = None
        if is_sharded(run.module):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
            full = get_model_state_dict(run.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            state = {k[len("model."):]: v for k, v in full.items() if k.startswith("model.")}
        run.acc.wait_for_everyone()
        if run.main:
            save(run.model, folder, self.tokenizer, state)


def read_eval_items(cfg: LMRunConfig, tokenizer) -> tuple[list[dict], str]:
    """(items, answer kind): the first eval.limit records of eval.path as {"prompt", "prompt_ids", "gold"}."""
    e = cfg.eval
    items = eval_prompts(load_located(e.name, e.path)[:e.limit or None], tokenizer)
    kind = e.kind or (e.name if e.name in accuracy.KINDS else accuracy.guess_kind([it["gold"] for it in items]))
    return items, kind


class OnlineAccuracy:
    """Every train.eval_every steps and after the last: greedy answers to the evaluation items, exact-match
    accuracy, predictions + an evaluation record in RUN/eval/ and ``eval_accuracy`` in log.jsonl.
    Collective; sharded (FSDP2): every process runs as many generate calls and forwards as the busiest."""

    def __init__(self, items: list[dict], kind: str, tokenizer, log):
        self.items, self.kind, self.tokenizer, self.log = items, kind, tokenizer, log

    def __call__(self, run, status) -> None:
        if status.stopping or not due(run.cfg.train.eval_every, status):
            return
        e, acc, sharded = run.cfg.eval, run.acc, is_sharded(run.module)
        out = run.run_dir / "eval" / f"predictions_{Path(e.path).stem}_step{status.done}.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)

        def answer(batch: list[dict]) -> list[str]:
            mode, registers = self.decoding
            return generate(run.model.lm, self.tokenizer, [it["prompt_ids"] for it in batch], e.max_new_tokens,
                            e.stop, synced=sharded, prompt_attention=run.cfg.model.prompt_attention,
                            decode=mode, registers=registers, stats=self.stats)

        def agree(batches: int) -> int:
            return int(acc.gather(torch.tensor([batches], device=run.device)).max())

        with preserved_rng(run.device), generating(run, sharded):
            self.decoding, self.stats = model_decoding(e.decode, run.model, run.cfg.objective), DecodeStats()
            accuracy.predict(self.items, answer, out, self.kind, acc.process_index, acc.num_processes, e.batch_size,
                             agree if sharded else None)
        acc.wait_for_everyone()
        if run.main:
            self.record(run, status.done, out)

    def record(self, run, step: int, out: Path) -> None:
        """Score the merged predictions, write the evaluation record and the log line."""
        e = run.cfg.eval
        generation = {"max_new_tokens": e.max_new_tokens, "stop": e.stop, "batch_size": e.batch_size,
                      **record_fields(*self.decoding, self.stats)}
        result, _ = accuracy.write_scores(out, len(self.items), self.kind, run.run_dir / "eval",
                                          run_config=run.cfg.to_dict(), step=step, data=e.path,
                                          checkpoint=str(run.run_dir), generation=generation)
        rec = {"step": step, "eval_accuracy": result["accuracy"], "eval_n": result["n"]}
        self.log.write(rec)
        say(f"step {step}: evaluation {eval_text(rec)}")
        if run.cfg.train.tracker != "none":
            run.acc.log({"eval/accuracy": result["accuracy"]}, step=step)


def generating(run, sharded: bool) -> ExitStack:
    """The model in eval mode and, when ``sharded``, the FSDP2 root's own parameters gathered; both undone after."""
    undo = ExitStack()
    undo.callback(run.model.train, run.model.training)
    run.model.eval()
    if sharded:
        run.module.unshard()
        undo.callback(run.module.reshard)
    return undo


def base_reference(cfg: LMRunConfig, model, tokenizer) -> str:
    """model.hf as given, else the model object's ``name_or_path`` (needed unless both objects are given, full)."""
    ref = cfg.model.hf or (getattr(model, "name_or_path", "") if model is not None else "")
    if not ref and (model is None or tokenizer is None or cfg.model.finetune == "lora"):
        fail("model.hf", "a local folder or cached hub name of the base model (a LoRA run on a model "
                         "object without name_or_path must name where its base loads from)", ref)
    return ref


def check_positions(pairs: list, limit: int | None, where: str) -> None:
    """A prompt + answer longer than the model's positions is a one-line error naming the line."""
    for p, a in pairs if limit is not None else []:
        if len(p) + len(a) > limit:
            raise ConfigError(f"{where}: {len(p)} + {len(a)} = {len(p) + len(a)} prompt + answer tokens, more "
                              f"than the model's {limit} positions; lower data.max_prompt_len / data.max_answer_len")


def load_trainable(model: MutorLM, state: dict, trainable: set[str]) -> None:
    """A checkpoint's trained parameters into ``model``; anything else missing or extra is an error."""
    if set(state) != trainable:
        extra, missing = sorted(set(state) - trainable), sorted(trainable - set(state))
        raise ConfigError(f"checkpoint does not match model.finetune / the objective: "
                          f"missing {missing[:3]}, unexpected {extra[:3]}")
    model.load_state_dict(state, strict=False)
