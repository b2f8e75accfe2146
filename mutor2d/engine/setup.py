"""Building a run from its config: accelerator, data, networks, optimizer, schedule, EMA, resume point.

A run config names its kind (``task``); the kind supplies only its parts (:class:`RunKind`, registered
named by its config root: mutor2d.run_configs; mutor2d.image.run, mutor2d.lm.run, mutor2d.vq.run), the engine
the rest.

Rules:
  * The networks are initialised from ``train.seed`` (same on every process), then each process seeds
    its own RNG streams (mutor2d.engine.rng).
  * The optimizer and its schedule: mutor2d.engine.optim.
  * train.sharding=fsdp (several processes): the TrainModule's blocks (``RunKind.blocks``) and then the
    rest are sharded with FSDP2 before the optimizer is built on the shards, and the module is not
    passed through accelerate's prepare (mutor2d.engine.sharding); a sharded checkpoint (.dcp) loads
    after sharding, into any layout.
  * Checkpoints are the run's named parts (``RunState.checkpoint_state``: mutor2d.checkpoint.state),
    written and restored by them. Resume order: a .pt file's model and objective are loaded by the kind
    as it builds them (``RunKind.build_networks``, before sharding), a sharded folder's after sharding;
    then the optimizer; the EMA starts as a copy of those weights and takes the checkpoint's when it has
    one; then each process's RNG streams and the health history. The LR schedule and the data order
    are rebuilt from the step (nothing of them is stored).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from ..checks import BUILD_BYTES_PER_PARAM, TRAIN_BYTES_PER_PARAM, check_model_fits
from ..config import ConfigError
from ..io import warn
from ..registry import build
from ..checkpoint.resume import find_resume, remove_stale_temps
from ..checkpoint.state import OptimizerPart, TrainState, module_parts, state_options
from .data_order import StepBatches
from .health import Health
from .optim import build_scheduler
from .rng import RunRng, rank_seed, seed_process
from . import sharding
from .. import provenance


class RunKind(Protocol):
    """What a kind of run supplies to the engine. Its TrainModule takes a collated batch and a
    generator (the process's layout stream) and returns an ObjectiveResult."""
    name: str

    def prepare_data(self, cfg) -> tuple: ...       # (train dataset, cfg resolved against the data)

    def collate(self, items: list): ...             # dataset items -> one batch

    def build_networks(self, cfg, saved: dict | None, dataset) -> tuple[nn.Module, nn.Module]: ...
    # (the model that is saved and sampled, the TrainModule computing the loss)

    def blocks(self, module: nn.Module) -> list[nn.Module]: ...   # what FSDP2 shards and recomputes, each

    def trainable_state(self, state: dict) -> dict: ...   # what a checkpoint keeps of the model's state

    def hooks(self, run, log) -> list: ...          # periodic jobs of this kind (after log and checkpoint)

    def rates(self, run, steps: int, applied: int, dt: float, sums: dict) -> dict: ...  # throughput

    def plain_copy(self, model: nn.Module) -> nn.Module: ...   # a new unsharded model of the same
    # architecture (RunState.sampling_model gathers FSDP shards into it; kinds whose hooks sample)

    def finish(self, run) -> None: ...              # after the last step (e.g. the LM's adapter folder)

    def finished(self, run_dir: Path) -> bool: ...  # what ``finish`` writes is there (else a resume at
    # train.max_steps runs ``finish`` again: a run killed between its last checkpoint and its final folder)

    def sources(self, cfg) -> tuple[dict | None, dict | None]: ...   # fingerprints (mutor2d.provenance) of
    # the training data and of the initial weights; optional (a kind without it records neither)

    def size(self, cfg) -> tuple[int, str]: ...      # parameters of the model the config's size fields
    # describe, and those fields in words; optional (a kind whose model is read from files has none)

    def eval_text(self, cfg, record: dict) -> str: ...   # a log record's evaluation in words ("" if it has
    # none), for the end-of-run summary; optional (default: runlog.eval_text, its ``eval_*`` values)


@dataclass
class RunState:
    """Everything the loop and its hooks need."""
    cfg: object                 # the kind's run config (train and optim sections are shared)
    kind: RunKind
    run_dir: Path
    acc: object                 # accelerate.Accelerator
    dataset: object
    grid: tuple[int, int] | None   # the token grid of image runs
    model: nn.Module            # the unwrapped model (EMA, sampling and export use it)
    module: nn.Module           # the kind's TrainModule as prepared by accelerate
    optimizer: object
    scheduler: object
    ema: object | None          # timm ModelEmaV3
    layout_gen: torch.Generator
    loader: DataLoader
    start: int                  # first step to run (0, or the resumed checkpoint's step)
    health: Health              # judges each update (engine/health.py)
    provenance: dict | None = None   # this session's (mutor2d.provenance; main process): in every checkpoint

    @property
    def device(self) -> torch.device:
        return self.acc.device

    @property
    def main(self) -> bool:
        return self.acc.is_main_process

    def step_rule(self):
        """The run's loss module if its rule depends on the update index (it has ``set_step(step,
        max_steps)``: a reg_weight schedule), else None."""
        objective = getattr(self.acc.unwrap_model(self.module), "objective", None)
        return objective if getattr(objective, "schedule", None) is not None else None

    @property
    def sample_model(self) -> nn.Module:
        """The weights samples and evaluations use: EMA when kept (unsharded runs)."""
        return self.ema.module if self.ema is not None else self.model

    def checkpoint_state(self, sharded: bool) -> TrainState:
        """The named parts of this run's checkpoint (mutor2d.checkpoint.state), as a sharded folder's
        (each process its shards) or, not ``sharded``, as a .pt file's (full states)."""
        options = state_options(sharded)
        parts = {**module_parts(self.module, options, self.kind.trainable_state),
                 "optimizer": OptimizerPart(self.module, self.optimizer, options),
                 "rng": RunRng(self), "health": self.health}
        if self.ema is not None:
            parts["ema"] = sharding.ema_part(self.ema)
        values = {"config": self.cfg.to_dict(), "grid": list(self.grid) if self.grid else None,
                  "provenance": self.provenance}
        return TrainState(parts, values, sharded)

    def sampling_model(self) -> nn.Module | None:
        """``sample_model`` on the main process, None on the others; under FSDP every process must
        call it (the shards are gathered into the kind's ``plain_copy`` on the main process)."""
        if sharding.is_sharded(self.module):
            return sharding.gathered_model(self.model, self.ema, self.main, self.device, self.kind.plain_copy)
        return self.sample_model if self.main else None


RESUME_MAY_CHANGE = {("data", "num_workers")}     # how the data is read, not what it is


@dataclass(frozen=True)
class ResumeWith:
    """train.py's rule for a resumed run (docs/RELIABILITY.md): it continues with its saved config plus
    ``overrides`` (--set / --max-steps, each change named); the values of ``given`` (the config file's
    mapping) that differ from the saved config are named and not used."""
    overrides: list[str]
    given: dict


def resumed_config(cfg, saved: dict, rule: ResumeWith | None, main: bool):
    """The config a resumed run continues with: ``cfg`` as given (``rule`` None: API callers), or the
    saved config under ``rule``."""
    if rule is None:
        return cfg
    from .. import config as config_lib
    from ..config_files import parse_override
    from .config import flat
    old, given = flat(saved), {".".join(k): v for k, v in map(parse_override, rule.overrides)}
    if main:
        for key, value in given.items():
            if key in old and old[key] != value:
                print(f"note: {key} changed on resume: {old[key]!r} -> {value!r}", flush=True)
        unused = sorted(k for k, v in flat(rule.given).items() if k not in given and k in old and old[k] != v)
        if unused:
            print(f"note: resuming with the run's saved config; the config file's {', '.join(unused)} differ and "
                  f"are not used (--set them to change them)", flush=True)
    return config_lib.load(saved, rule.overrides)


def check_resume_config(cfg, saved: dict) -> None:
    """A resumed run's model, objective and data sections (those the kind has) must equal the checkpoint's."""
    old = type(cfg).from_dict(saved)
    for section in (s for s in ("model", "objective", "data") if s in cfg.sections):
        a, b = old.to_dict()[section], cfg.to_dict()[section]
        for key in sorted((set(a) | set(b)) - {k for s, k in RESUME_MAY_CHANGE if s == section}):
            if a.get(key) != b.get(key):
                raise ConfigError(f"{section}.{key}={b.get(key)!r} differs from the checkpoint's {a.get(key)!r}; "
                                  f"a resumed run keeps its model, objective and data")


def make_accelerator(cfg, run_dir: Path):
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
    if t.tracker == "wandb" and importlib.util.find_spec("wandb") is None:
        raise ConfigError("train.tracker=wandb: the wandb package is not installed "
                          "(pip install wandb, or use tensorboard/none)")
    acc = Accelerator(cpu=cpu_ddp, mixed_precision=precision, gradient_accumulation_steps=t.grad_accum,
                      log_with=None if t.tracker == "none" else t.tracker, project_dir=str(run_dir))
    if acc.distributed_type.name == "FSDP":                    # an FSDP plugin from anywhere else
        raise ConfigError(FSDP_REFUSED)
    return acc


# accelerate's FSDP plugin wraps the model its own way (FSDP1 cannot run on CPU; FSDP2 there turns
# into DDP): sharding is train.sharding=fsdp, the project's own FSDP2 calls (engine/sharding.py).
FSDP_REFUSED = ("accelerate launch --use_fsdp: accelerate's FSDP plugin is not supported; launch without "
                "--use_fsdp and set train.sharding=fsdp (FSDP2 sharding, docs/SCALING.md), or keep DDP")


def ignore_stop_signals(worker_id: int) -> None:
    """DataLoader workers leave SIGTERM/SIGINT to the training process (a launcher or scheduler
    signals the whole process group): the trainer finishes its step, saves, then stops them."""
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def build_loader(cfg, kind: RunKind, dataset, acc, start: int) -> DataLoader:
    t = cfg.train
    lengths = dataset.lengths if getattr(cfg.data, "group_by_length", False) else None
    sampler = StepBatches(len(dataset), t.batch_size, acc.num_processes, acc.process_index, t.grad_accum,
                          t.seed, start, t.max_steps, lengths)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=kind.collate, num_workers=cfg.data.num_workers,
                      pin_memory=acc.device.type == "cuda", worker_init_fn=ignore_stop_signals,
                      generator=torch.Generator().manual_seed(rank_seed(t.seed + start, acc.process_index, 2)))


def build_run(cfg, run_dir: str | os.PathLike, resume: str | None, kind: RunKind,
              resume_with: ResumeWith | None = None) -> RunState | None:
    """Everything a run needs, checked before the first step; ConfigError (one line) if it cannot start.
    None when a resumed run is already at train.max_steps: said once, nothing built or written. The
    resume point is decided here, once (``find_resume``), and the config continued with (``resume_with``)."""
    run_dir = Path(run_dir)
    main = os.environ.get("RANK", "0") == "0"
    if main and (run_dir / "checkpoints").is_dir():
        remove_stale_temps(run_dir)
    resume_path, saved = find_resume(resume, run_dir, main)
    if saved is not None:
        cfg = resumed_config(cfg, saved["config"], resume_with, main)
    acc = make_accelerator(cfg, run_dir)
    dataset, cfg = kind.prepare_data(cfg)
    if cfg.train.batch_size > len(dataset):
        raise ConfigError(f"train.batch_size={cfg.train.batch_size} is larger than the dataset "
                          f"({len(dataset)} examples); expected at most {len(dataset)}")
    cfg = replace(cfg, train=replace(cfg.train, out_dir=str(run_dir)))
    if saved is not None:
        check_resume_config(cfg, saved["config"])
    start = int(saved["step"]) if saved is not None else 0
    if saved is not None and start >= cfg.train.max_steps and kind.finished(run_dir):
        if acc.is_main_process:
            print(f"nothing to do: the run is at step {start}, train.max_steps is {cfg.train.max_steps}", flush=True)
        return None
    if hasattr(kind, "size"):                # before anything is allocated: it must fit this machine
        check_model_fits(*kind.size(cfg), TRAIN_BYTES_PER_PARAM if acc.device.type == "cpu" else BUILD_BYTES_PER_PARAM)
    model, module = kind.build_networks(cfg, saved, dataset)
    layout_gen = seed_process(cfg.train.seed, acc.process_index, acc.device)
    if cfg.train.activation_checkpointing:
        sharding.checkpoint_activations(kind.blocks(module))
    sharded = sharding.wants_fsdp(cfg.train, acc.num_processes, acc.is_main_process)
    if sharded:                                # before the optimizer: it holds the sharded parameters
        policy = sharding.precision_policy(acc.mixed_precision)
        sharding.shard_blocks(module, kind.blocks(module), acc.device, policy, cfg.train.fsdp_offload)
    optimizer = build(cfg.optim, module, acc.device.type)
    scheduler = build_scheduler(optimizer, cfg.optim, cfg.train.max_steps)
    if sharded:                                # the accelerator keeps process group, device and logging
        optimizer = acc.prepare_optimizer(optimizer)
    else:
        module, optimizer = acc.prepare(module, optimizer)
    grid = tuple(int(v) for v in dataset.grid) if hasattr(dataset, "grid") else None
    run = RunState(cfg, kind, run_dir, acc, dataset, grid, model, module, optimizer, scheduler, None, layout_gen,
                   None, start, Health(cfg.train.blowup_factor, cfg.train.blowup_window, cfg.optim.grad_clip))
    # the checkpoint's parts (those it holds), each read through the run's state as it is then: a .pt
    # file's model and objective were loaded by the kind before sharding; the EMA exists once they are
    if saved is not None:
        first = ("model", "objective", "optimizer") if "dcp" in saved else ("optimizer",)
        run.checkpoint_state("dcp" in saved).restore(saved, first)
    if cfg.train.ema:            # a copy of the (restored) weights, then the checkpoint's EMA when it has one
        run.ema = sharding.build_ema(model, cfg.train, sharded)
    if saved is not None:
        run.checkpoint_state("dcp" in saved).restore(saved, ("ema", "rng", "health"))
        if acc.is_main_process:
            print(f"resuming from step {start} ({resume_path})", flush=True)
            old = saved["config"].get("train", {}).get("max_steps")
            if old is not None and old != cfg.train.max_steps and cfg.optim.schedule == "cosine":
                print(f"note: train.max_steps changed {old} -> {cfg.train.max_steps}: the cosine schedule is "
                      f"rebuilt for {cfg.train.max_steps} steps (it ends at optim.min_lr="
                      f"{cfg.optim.min_lr:g})", flush=True)
    run.loader = build_loader(cfg, kind, dataset, acc, start)
    return run


def record_provenance(run: RunState) -> dict:
    """This session's provenance (mutor2d.provenance: data and initial weights from the kind's
    ``sources``) appended to RUN/provenance.json; one warning line when its code, versions or data
    differ from the first session's. Main process only."""
    data, init = run.kind.sources(run.cfg) if hasattr(run.kind, "sources") else (None, None)
    prov = provenance.provenance(data, init, device=str(run.device), threads=torch.get_num_threads())
    if changed := provenance.append_session(run.run_dir, prov, run.start):
        warn(f"this session's {', '.join(changed)} differ from the run's first session "
             f"({run.run_dir / provenance.RUN_FILE})")
    return prov
