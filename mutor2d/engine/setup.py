"""Building a run from its config: accelerator, data, model, objective, optimizer, schedule, EMA.

Rules:
  * model.vocab_size / model.num_classes left at their defaults are taken from the dataset; any other
    value must equal the dataset's. Grid-dependent settings (registers, RoPE) are checked against the
    data's grid before anything trains.
  * The model is initialised from ``train.seed`` (same on every process), then each process seeds its
    own RNG streams (mutor2d.engine.rng).
  * Weight decay follows LlamaGen: tensors with 2 or more dims decay; 1-D tensors (norm weights, the
    register embedding) do not.
  * train.sharding=fsdp (several processes): the TrainModule is sharded with FSDP2 before the
    optimizer is built on its shards, and is not passed through accelerate's prepare
    (mutor2d.engine.sharding); a sharded checkpoint (.dcp) loads after sharding, into any layout.
  * The learning rate is a pure function of the update count and the config (timm scheduler driven
    per update; warmup lr*n/W, then constant or cosine to ``min_lr`` at ``max_steps``): a resumed run
    rebuilds it, so a changed step budget is honoured.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from .. import config as config_lib
from ..config import ConfigError, RunConfig
from ..data import build_dataset, collate
from ..io import warn
from ..model import GPT
from ..objectives import Batch, build_objective, uses_registers
from .checkpointer import find_resume, remove_stale_temps
from .data_order import StepBatches
from .rng import rank_seed, seed_process, set_rng_state
from . import sharding


class TrainModule(nn.Module):
    """The GPT and its objective as one module, so DDP/FSDP/autocast wrap the whole loss."""

    def __init__(self, model: GPT, objective: nn.Module):
        super().__init__()
        self.model, self.objective = model, objective

    def forward(self, body, prefix, grid, lengths=None, generator=None):
        return self.objective(self.model, Batch(body, prefix, grid, lengths), generator)


@dataclass
class Run:
    """Everything the loop and its hooks need."""
    cfg: RunConfig
    run_dir: Path
    acc: object                 # accelerate.Accelerator
    dataset: object
    grid: tuple[int, int]
    model: GPT                  # the unwrapped GPT (EMA and sampling use it)
    module: nn.Module           # TrainModule as prepared by accelerate
    optimizer: object
    scheduler: object
    ema: object | None          # timm ModelEmaV3
    layout_gen: torch.Generator
    loader: DataLoader
    start: int                  # first step to run (0, or the resumed checkpoint's step)

    @property
    def device(self) -> torch.device:
        return self.acc.device

    @property
    def main(self) -> bool:
        return self.acc.is_main_process

    @property
    def sample_model(self) -> GPT:
        """The weights samples and evaluations use: EMA when kept (unsharded runs)."""
        return self.ema.module if self.ema is not None else self.model

    def sampling_model(self) -> GPT | None:
        """``sample_model`` on the main process, None on the others; under FSDP every process must
        call it (the shards are gathered into a plain GPT on the main process)."""
        if sharding.is_sharded(self.module):
            return sharding.gathered_model(self.model, self.ema, self.main, self.device)
        return self.sample_model if self.main else None


def resolve_config(cfg: RunConfig, dataset) -> RunConfig:
    """Fill model.vocab_size / num_classes from the dataset and check grid-dependent settings."""
    m, defaults = cfg.model, config_lib.ModelConfig()
    updates = {}
    fields = [("vocab_size", int(dataset.vocab_size))]
    if m.kind().per_class:                                    # num_classes only matters for class labels
        fields.append(("num_classes", int(dataset.num_classes)))
    for name, have in fields:
        value = getattr(m, name)
        if value != have:
            if value != getattr(defaults, name):
                raise ConfigError(f"model.{name}={value} does not match the data ({have}); "
                                  f"leave it out of the config, it is taken from the dataset")
            updates[name] = have
    cfg = replace(cfg, model=replace(m, **updates))
    config_lib.check_against_grid(cfg, tuple(dataset.grid), int(dataset[0]["prefix"].numel()),
                                  int(dataset.num_classes))
    return cfg


RESUME_MAY_CHANGE = {("data", "num_workers")}     # how the data is read, not what it is


def check_resume_config(cfg: RunConfig, saved: dict) -> None:
    """The model, objective and data sections of a resumed run must equal the checkpoint's."""
    old = config_lib.from_dict(saved)
    for section in ("model", "objective", "data"):
        a, b = old.to_dict()[section], cfg.to_dict()[section]
        for key in sorted((set(a) | set(b)) - {k for s, k in RESUME_MAY_CHANGE if s == section}):
            if a.get(key) != b.get(key):
                raise ConfigError(f"{section}.{key}={b.get(key)!r} differs from the checkpoint's {a.get(key)!r}; "
                                  f"a resumed run keeps its model, objective and data")


def param_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    """LlamaGen's rule: decay tensors with dim >= 2, not 1-D ones (norms, register embedding)."""
    params = [p for p in module.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def build_scheduler(optimizer, optim_cfg, max_steps: int):
    """timm scheduler driven per update (``step_update(n)`` before update n-1)."""
    from timm.scheduler import CosineLRScheduler, StepLRScheduler
    warm = optim_cfg.warmup_steps
    if optim_cfg.schedule == "cosine":
        return CosineLRScheduler(optimizer, t_initial=max(1, max_steps - warm), lr_min=optim_cfg.min_lr,
                                 warmup_t=warm, warmup_lr_init=0.0, warmup_prefix=True, t_in_epochs=False)
    return StepLRScheduler(optimizer, decay_t=float("inf"), decay_rate=1.0, warmup_t=warm,
                           warmup_lr_init=0.0, warmup_prefix=True, t_in_epochs=False)


def load_optimizer_state(module: nn.Module, optimizer, state: dict) -> None:
    """A checkpoint's optimizer state (keyed by parameter names) into the prepared optimizer, sharded as
    the module is (DDP, FSDP); states keyed by index (older checkpoints) load directly."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    if all(isinstance(k, int) for k in state["state"]):
        optimizer.load_state_dict(state)
        return
    set_optimizer_state_dict(module, optimizer.optimizer, state, options=StateDictOptions(full_state_dict=True))


def make_accelerator(cfg: RunConfig, run_dir: Path):
    from accelerate import Accelerator
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        raise ConfigError(FSDP_REFUSED)
    t = cfg.train
    # a distributed launch (LOCAL_RANK set) without CUDA runs on CPU processes over gloo
    cpu_ddp = not torch.cuda.is_available() and int(os.environ.get("LOCAL_RANK", -1)) != -1
    precision = t.mixed_precision
    if precision == "auto":
        precision = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
    if precision == "bf16" and not torch.cuda.is_available() and os.environ.get("RANK", "0") == "0":
        warn("train.mixed_precision=bf16 on CPU: bf16 autocast matmuls are far slower than fp32 on CPUs "
             "without bf16 units (about 10x here); --set train.mixed_precision=no for CPU runs")
    tracker = None if t.tracker == "none" else t.tracker
    if tracker == "wandb":
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError("train.tracker=wandb: the wandb package is not installed "
                              "(pip install wandb, or use tensorboard/none)") from None
    acc = Accelerator(cpu=cpu_ddp, mixed_precision=precision, gradient_accumulation_steps=t.grad_accum,
                      log_with=tracker, project_dir=str(run_dir))
    if acc.distributed_type.name == "FSDP":                    # an FSDP plugin from anywhere else
        raise ConfigError(FSDP_REFUSED)
    return acc


# accelerate's FSDP plugin wraps the model its own way (FSDP1 cannot run on CPU; FSDP2 there turns
# into DDP): sharding is train.sharding=fsdp, the project's own FSDP2 calls (engine/sharding.py).
FSDP_REFUSED = ("accelerate launch --use_fsdp: accelerate's FSDP plugin is not supported; launch without "
                "--use_fsdp and set train.sharding=fsdp (FSDP2 sharding, docs/SCALING.md), or keep DDP")


def build_networks(cfg: RunConfig, saved: dict | None) -> tuple[GPT, nn.Module]:
    """The GPT and its objective, initialised from train.seed, then from the checkpoint or init_from."""
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model, register_token=uses_registers(cfg.objective))
    objective = build_objective(cfg.objective, model)
    if saved is not None:
        if "model" in saved:                   # a sharded checkpoint loads after sharding (build_run)
            model.load_state_dict(saved["model"], strict=True)
            objective.load_state_dict(saved["objective"], strict=True)
    elif cfg.train.init_from:
        init_weights(model, cfg.train.init_from)
    if cfg.train.compile:
        for block in list(model.layers) + list(objective.blocks()):
            block.compile()
    return model, objective


def init_weights(model: GPT, source: str) -> None:
    """train.init_from: the weights of a mutor2d checkpoint, run folder, safetensors export or LlamaGen
    GPT checkpoint; optimizer, step and data order start fresh."""
    from ..model import load_llamagen
    from .. import checkpoint as ckpt_lib
    try:
        path = ckpt_lib.resolve(source)
        if path.suffix == ".safetensors" or _is_mutor2d(path):
            obj = ckpt_lib.load_weights(path, use_ema=False)[0]
        else:
            obj = path                                   # load_llamagen reads it with weights_only
        load_llamagen(model, obj)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        raise ConfigError(f"train.init_from={source!r}: {type(e).__name__}: {e}") from None


def _is_mutor2d(path: Path) -> bool:
    from .. import checkpoint as ckpt_lib
    try:
        ckpt_lib.load(path, mmap=True)
        return True
    except ckpt_lib.CheckpointError:
        return False


def ignore_stop_signals(worker_id: int) -> None:
    """DataLoader workers leave SIGTERM/SIGINT to the training process (a launcher or scheduler
    signals the whole process group): the trainer finishes its step, saves, then stops them."""
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def build_loader(cfg: RunConfig, dataset, acc, start: int) -> DataLoader:
    t = cfg.train
    sampler = StepBatches(len(dataset), t.batch_size, acc.num_processes, acc.process_index, t.grad_accum,
                          t.seed, start, t.max_steps)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=cfg.data.num_workers,
                      pin_memory=acc.device.type == "cuda", worker_init_fn=ignore_stop_signals,
                      generator=torch.Generator().manual_seed(rank_seed(t.seed + start, acc.process_index, 2)))


def restore_rng(saved: dict, acc, seed: int, start: int, layout_gen: torch.Generator) -> torch.Generator:
    """Continue each process's RNG streams; with another process count, fresh streams (and a warning)."""
    states, world, rank = saved["rng"], acc.num_processes, acc.process_index
    if len(states) == world:
        if not set_rng_state(states[rank], layout_gen, acc.device) and acc.is_main_process:
            warn(f"checkpoint's register-layout RNG comes from another kind of device than {acc.device.type}: "
                 f"that stream starts fresh (the run continues, not bit-exactly)")
        return layout_gen
    if acc.is_main_process:
        warn(f"checkpoint has RNG states of {len(states)} processes, this run has {world}: "
             f"fresh per-process seeds (the run continues, not bit-exactly)")
    return seed_process(seed + start, rank, acc.device)


def build_run(cfg: RunConfig, run_dir: str | os.PathLike, resume: str | None) -> Run:
    """Everything a run needs, checked before the first step; ConfigError (one line) if it cannot start."""
    run_dir = Path(run_dir)
    acc = make_accelerator(cfg, run_dir)
    try:
        dataset = build_dataset(cfg.data, "train")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    cfg = resolve_config(cfg, dataset)
    cfg = replace(cfg, train=replace(cfg.train, out_dir=str(run_dir)))
    if acc.is_main_process and (run_dir / "checkpoints").is_dir():
        remove_stale_temps(run_dir)
    resume_path, saved = find_resume(resume, run_dir, acc.is_main_process)
    if saved is not None:
        check_resume_config(cfg, saved["config"])
    start = int(saved["step"]) if saved is not None else 0
    model, objective = build_networks(cfg, saved)
    layout_gen = seed_process(cfg.train.seed, acc.process_index, acc.device)
    o = cfg.optim
    module = TrainModule(model, objective)
    if cfg.train.activation_checkpointing:
        sharding.checkpoint_activations(list(model.layers) + list(objective.blocks()))
    sharded = sharding.wants_fsdp(cfg.train, acc.num_processes, acc.is_main_process)
    if sharded:                                # before the optimizer: it holds the sharded parameters
        sharding.shard_train_module(module, cfg.train, acc.device)
    optimizer = torch.optim.AdamW(param_groups(module, o.weight_decay), lr=o.lr, betas=tuple(o.betas),
                                  fused=acc.device.type in ("cuda", "cpu"))   # one kernel: ~5x faster on CPU
    scheduler = build_scheduler(optimizer, o, cfg.train.max_steps)
    if sharded:                                # the accelerator keeps process group, device and logging
        optimizer = acc.prepare_optimizer(optimizer)
    else:
        module, optimizer = acc.prepare(module, optimizer)
    sharded_from = saved.get("dcp") if saved is not None else None
    if sharded_from:
        sharding.load_sharded(sharded_from, module, optimizer.optimizer)
    elif saved is not None:
        load_optimizer_state(module, optimizer, saved["optimizer"])
    ema = None
    if cfg.train.ema:
        ema = sharding.build_ema(model, cfg.train, sharded, saved.get("ema") if saved is not None else None)
        if sharded_from:
            sharding.load_sharded_ema(sharded_from, ema)
    if saved is not None:
        layout_gen = restore_rng(saved, acc, cfg.train.seed, start, layout_gen)
        if acc.is_main_process:
            print(f"resuming from step {start} ({resume_path})", flush=True)
            _note_schedule_change(saved["config"], cfg)
    loader = build_loader(cfg, dataset, acc, start)
    return Run(cfg, run_dir, acc, dataset, tuple(int(v) for v in dataset.grid), model, module, optimizer,
               scheduler, ema, layout_gen, loader, start)


def _note_schedule_change(saved: dict, cfg: RunConfig) -> None:
    old = saved.get("train", {}).get("max_steps")
    if old is not None and old != cfg.train.max_steps and cfg.optim.schedule == "cosine":
        print(f"note: train.max_steps changed {old} -> {cfg.train.max_steps}: the cosine schedule is rebuilt "
              f"for {cfg.train.max_steps} steps (it ends at optim.min_lr={cfg.optim.min_lr:g})", flush=True)
