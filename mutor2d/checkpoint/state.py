"""One key scheme for training checkpoints, ``.pt`` files and sharded folders alike, and the parts
that fill it. Each part of a run that has state saves and loads itself (``state_dict`` /
``load_state_dict``: torch.distributed.checkpoint's ``Stateful`` protocol); :class:`TrainState` holds
them by name, both writers iterate it, and a resumed run restores through it.

Keys:
  * weights (tensors): ``model`` (the model's state dict, as much of it as the run kind keeps:
    RunKind.trainable_state), ``objective`` (the objective module's state: multi-head heads; {} when it
    has none), ``ema`` (the EMA of the model's weights; absent without EMA), ``optimizer`` (its state
    keyed by parameter names, torch.distributed.checkpoint.state_dict's layout);
  * train state: ``step`` (updates done), ``rng`` (one state per process: mutor2d.engine.rng),
    ``health`` (the recent healthy updates: mutor2d.engine.health);
  * metadata: ``config`` (the resolved run config as a plain dict, its ``task`` first), ``grid`` ([H, W]
    of image runs, else None), ``provenance`` (the writing session's: mutor2d.provenance; None in older
    files and on other processes).
A ``.pt`` file holds them all at its top level (mutor2d.checkpoint); a sharded folder holds the weights
as DCP entries (``model.*``, ``objective.*``, ``ema.*``, ``optimizer.*``) and the rest in its meta.pt
(mutor2d.checkpoint.sharded).

Not stored, because each is a pure function of what is: the learning-rate schedule (of the step and the
config: mutor2d.engine.optim rebuilds it), the data order (of ``train.seed`` and the step:
mutor2d.engine.data_order), hence no loader state either.

Older checkpoints: ``.pt`` files had this layout already (``ema`` None without EMA); a sharded folder
written before it (the TrainModule's state under ``model``, the optimizer's under ``optim``) is refused
in one line by mutor2d.checkpoint.sharded.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.checkpoint.stateful import Stateful

from . import checkpoint_path, save_atomic
from . import sharded as sharded_checkpoint

WEIGHTS = ("model", "objective", "ema", "optimizer")   # tensors: DCP entries in a sharded folder
OPTIONAL = ("objective", "ema", "health")   # absent: nothing to keep (no objective state, no EMA), or older files


def state_options(sharded: bool) -> StateDictOptions:
    """How the parts read and load states: each process its shards (a sharded folder), or full
    tensors (a .pt file; a .pt file loads into a sharded run too)."""
    return StateDictOptions() if sharded else StateDictOptions(full_state_dict=True)


def for_saving(options: StateDictOptions) -> StateDictOptions:
    """``options`` for a state to save: full states on the main process's CPU only (the others get
    none), shards as they are."""
    return dataclasses.replace(options, cpu_offload=options.full_state_dict)


class ModulePart:
    """The state of one submodule of a TrainModule (``name``: "model" or "objective"): its entries of
    ``read()``, the TrainModule's whole state (``module_parts``: read once for both); ``keep``: what is
    saved of it (default all). Loading goes through torch's state-dict API with ``options``."""

    def __init__(self, module, name: str, options: StateDictOptions, read, keep=None):
        self.module, self.prefix, self.options, self.read, self.keep = module, f"{name}.", options, read, keep

    def state_dict(self) -> dict:
        state = {k[len(self.prefix):]: v for k, v in self.read().items() if k.startswith(self.prefix)}
        return self.keep(state) if self.keep is not None else state

    def load_state_dict(self, state: dict) -> None:
        """Entries of ``state`` into the submodule; others (a frozen base the kind reloads) stay."""
        set_model_state_dict(self.module, {self.prefix + k: v for k, v in state.items()},
                             options=dataclasses.replace(self.options, strict=False))


def module_parts(module, options: StateDictOptions, keep_model) -> dict[str, ModulePart]:
    """The "model" and "objective" parts of a TrainModule, sharing one read of its state (a full state:
    one CPU copy per checkpoint, not one per part); ``keep_model``: what is saved of the model."""
    read = functools.cache(lambda: get_model_state_dict(module, options=for_saving(options)))
    return {"model": ModulePart(module, "model", options, read, keep_model),
            "objective": ModulePart(module, "objective", options, read)}


class OptimizerPart:
    """The optimizer's state keyed by parameter names (``optimizer``: the accelerate-prepared one over
    ``module``). Loading keeps the config's param-group hyper-parameters (lr, betas, weight decay, ...):
    a resumed run uses what its config says, --set overrides included; states keyed by index (files
    written before names) load directly."""

    def __init__(self, module, optimizer, options: StateDictOptions):
        self.module, self.optimizer, self.options = module, optimizer, options

    def state_dict(self) -> dict:
        return get_optimizer_state_dict(self.module, self.optimizer.optimizer, options=for_saving(self.options))

    def load_state_dict(self, state: dict) -> None:
        config_values = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        if all(isinstance(k, int) for k in state["state"]):
            self.optimizer.load_state_dict(state)
        else:
            set_optimizer_state_dict(self.module, self.optimizer.optimizer, state, options=self.options)
        for group, values in zip(self.optimizer.param_groups, config_values):
            group.update(values)


class TrainState:
    """A run's checkpoint: its ``parts`` by name (Stateful each; keys of the module doc), its metadata
    ``values`` (config, grid), and whether it is a sharded folder's (``sharded``: the parts then hold
    each process's shards) or a .pt file's."""

    def __init__(self, parts: dict[str, Stateful], values: dict, sharded: bool):
        self.parts, self.values, self.sharded = parts, values, sharded

    def state_dict(self, step: int) -> dict:
        """Collective (every process: RNG states are gathered, FSDP states are each process's): every
        entry of the scheme, at ``step``."""
        return {**{name: part.state_dict() for name, part in self.parts.items()}, "step": step, **self.values}

    def save(self, run_dir: Path, step: int, main: bool) -> Path | None:
        """Collective: RUN/checkpoints/step_N.pt (written by the main process; None on the others) or,
        sharded, step_N.dcp/ (every process its shards); its path."""
        entries, path = self.state_dict(step), checkpoint_path(run_dir, step)
        if not self.sharded:
            return save_atomic(entries, path) if main else None
        weights = {k: entries.pop(k) for k in WEIGHTS if k in entries}
        return sharded_checkpoint.write(path.with_suffix(sharded_checkpoint.SUFFIX), weights,
                                        {**entries, "has_ema": "ema" in weights}, main)

    def restore(self, saved: dict, names: tuple[str, ...]) -> None:
        """Load the parts ``names`` of this run from the checkpoint ``saved`` (mutor2d.checkpoint.load): a
        sharded one's weights read by DCP into this run's layout (any process count; its files were
        verified when it was found: mutor2d.checkpoint.resume), everything else from its entries. An
        :data:`OPTIONAL` part it lacks keeps its start; any other is a one-line CheckpointError naming it."""
        folder = saved.get("dcp")
        stored = sharded_checkpoint.stored_parts(folder) if folder else set()
        held = [n for n in names if n in self.parts and (n in stored or saved.get(n) is not None or n not in OPTIONAL)]
        state = {n: self.parts[n].state_dict() for n in held if n in stored}
        if state:
            sharded_checkpoint.load(folder, state, verified=True)
        for n in held:
            self.parts[n].load_state_dict(state[n] if n in state else saved[n])
