"""Random streams of a training process, and their state as plain tensors (safe to save).

Every process seeds its own torch / numpy / python RNGs (dropout, label dropout, data augmentation)
and its own register-layout generator from (seed, rank). A checkpoint keeps one state per process
(``RunRng``), made of tensors, ints and tuples only, so it loads with ``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import random
from contextlib import contextmanager

import numpy as np
import torch

from ..io import warn


def rank_seed(seed: int, rank: int, stream: int) -> int:
    """A distinct 63-bit seed per (seed, rank, stream): 0 = global RNGs, 1 = layout, 2 = loader."""
    return (seed * 1_000_003 + rank * 7_919 + stream * 104_729 + 12_345) % (1 << 63)


def seed_process(seed: int, rank: int, device: torch.device | str = "cpu") -> torch.Generator:
    """Seed this process's global RNGs; return its register-layout generator on ``device`` (the
    training device: layouts are drawn and built there, no per-batch copies from the host)."""
    s = rank_seed(seed, rank, 0)
    torch.manual_seed(s)
    np.random.seed(s % (1 << 32))
    random.seed(s)
    return torch.Generator(device).manual_seed(rank_seed(seed, rank, 1))


def rng_state(layout_gen: torch.Generator, device: torch.device) -> dict:
    """This process's RNG states: tensors and plain values only."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    np_state = {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                "has_gauss": int(has_gauss), "gauss": float(gauss)}
    state = {"torch": torch.get_rng_state(), "layout": layout_gen.get_state(), "numpy": np_state,
             "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, layout_gen: torch.Generator, device: torch.device) -> bool:
    """Restore this process's streams; False if the layout stream was saved by another kind of device
    (a CPU run resumed on a GPU): that stream then stays freshly seeded."""
    torch.set_rng_state(state["torch"])
    same_kind = state["layout"].numel() == layout_gen.get_state().numel()
    if same_kind:
        layout_gen.set_state(state["layout"])
    np_state = state["numpy"]
    if not isinstance(np_state, tuple):           # a tuple: checkpoints written before states were tensors
        np_state = (np_state["kind"], np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                    np_state["has_gauss"], np_state["gauss"])
    np.random.set_state(np_state)
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
    return same_kind


class RunRng:
    """The RNG streams of every process of ``run`` (a RunState) as a checkpoint part: saved as one state
    per process (gathered: every process takes part), restored by rank; with another process count,
    fresh per-process seeds and a warning (the run continues, not bit-exactly)."""

    def __init__(self, run):
        self.run = run

    def state_dict(self) -> list[dict]:
        from accelerate.utils import gather_object
        return gather_object([rng_state(self.run.layout_gen, self.run.device)])

    def load_state_dict(self, states: list[dict]) -> None:
        run, acc = self.run, self.run.acc
        if len(states) != acc.num_processes:
            if acc.is_main_process:
                warn(f"checkpoint has RNG states of {len(states)} processes, this run has {acc.num_processes}: "
                     f"fresh per-process seeds (the run continues, not bit-exactly)")
            run.layout_gen = seed_process(run.cfg.train.seed + run.start, acc.process_index, acc.device)
        elif not set_rng_state(states[acc.process_index], run.layout_gen, acc.device) and acc.is_main_process:
            warn(f"checkpoint's register-layout RNG comes from another kind of device than {acc.device.type}: "
                 f"that stream starts fresh (the run continues, not bit-exactly)")


@contextmanager
def preserved_rng(device: torch.device):
    """Run a side job (sampling, evaluation) without moving the training RNG streams."""
    np_state, py_state = np.random.get_state(), random.getstate()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        yield
    np.random.set_state(np_state)
    random.setstate(py_state)
