"""The drafter of register decoding for language models (``mutor2d.lm.speculative``): a MuToR-1D
checkpoint's register embedding and the draft offsets its objective trained, where they come from
(a saved folder, a model being trained), and the text wing's ``--decode`` choice.

    regs = load_registers("runs/lm_tiny_arith")            # register_embedding + config.yaml's d_max
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from safetensors.torch import load_file
from torch import Tensor

from ..config import make
from ..sampling.auto import can_draft as objective_drafts
from ..sampling.config import useful_draft
from ..sampling.stats import DecodeStats
from .model import REGISTER_FILE


@dataclass(frozen=True)
class Registers:
    """A MuToR-1D checkpoint's drafter: ``embedding`` (D,) the trained register embedding and
    ``offsets`` the distances d = 2..K+1 its registers draft (K = ``draft``)."""
    embedding: Tensor
    offsets: tuple[int, ...]

    @property
    def draft(self) -> int:
        return len(self.offsets)


def draft_distances(objective, draft: int | None = None, key: str = "draft") -> tuple[int, ...]:
    """The first ``draft`` (default: all useful, d_max - 1) offsets d >= 2 of an objective config
    section; a one-line ConfigError when it cannot draft or ``draft`` is too long."""
    K = useful_draft(objective, draft, key, "decode")
    return tuple(d for _, d in objective.register_spec().draft_offsets()[:K])


def run_objective(folder: str | Path):
    """The objective config section of a saved folder: config.yaml in it or, for RUN/step_N, in RUN;
    None when neither has one."""
    folder = Path(folder)
    for where in (folder, folder.parent):
        if (where / "config.yaml").is_file():
            section = (yaml.safe_load((where / "config.yaml").read_text()) or {}).get("objective")
            return make("objective", **section) if isinstance(section, dict) else None
    return None


def load_registers(folder: str | Path, draft: int | None = None, objective=None) -> Registers:
    """The drafter of a saved run folder (or RUN/step_N): its register embedding and the draft offsets
    of ``objective`` (default: the run's config.yaml)."""
    folder = Path(folder)
    if not (folder / REGISTER_FILE).is_file():
        raise ValueError(f"{folder}: no {REGISTER_FILE} (trained without registers); decode plain")
    objective = objective if objective is not None else run_objective(folder)
    if objective is None:
        raise ValueError(f"{folder}: no config.yaml naming the objective (its d_max sets the draft length)")
    embedding = load_file(str(folder / REGISTER_FILE))["register_embedding"]
    return Registers(embedding, draft_distances(objective, draft))


def folder_drafts(folder: str | Path) -> bool:
    """Whether a saved folder has a register embedding whose objective drafts."""
    objective = run_objective(folder) if (Path(folder) / REGISTER_FILE).is_file() else None
    return objective is not None and objective_drafts(objective)


def folder_mode(decode: str, folder: str | Path) -> str:
    """The mode a saved folder decodes with under ``--decode`` (a text mode of ``decode_modes``):
    ``auto`` is registers when the folder can draft, else plain (``AutoDecode``)."""
    return ("registers" if folder_drafts(folder) else "plain") if decode == "auto" else decode


def model_decoding(decode: str, model, objective) -> tuple[str, Registers | None]:
    """(mode, drafter) of a MutorLM being trained under ``objective`` for ``eval.decode``: ``auto`` is
    registers when the model has a register embedding whose objective drafts, else plain."""
    drafts = model.has_registers and objective_drafts(objective)
    mode = ("registers" if drafts else "plain") if decode == "auto" else decode
    if mode != "registers":
        return mode, None
    offsets = draft_distances(objective)                     # no registers: a one-line ConfigError
    return mode, Registers(model.register_embedding.detach(), offsets)


def record_fields(mode: str, registers: Registers | None, stats: DecodeStats) -> dict:
    """An evaluation record's decoding settings (its ``sampling``): decode, decode_options, decode_stats
    (forwards_per_token among them; 1.0 for plain)."""
    options = {"draft": registers.draft, "offsets": list(registers.offsets)} if registers is not None else {}
    return {"decode": mode, "decode_options": options, "decode_stats": stats.summary()}
