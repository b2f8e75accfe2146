"""What register decoding of a language model drafts with (``mutor2d.lm.speculative``): a MuToR-1D
checkpoint's register embedding and the RegisterSpec its objective trained (resolved once, where
they come from: a saved folder, a model being trained), and the text wing's ``--decode`` choice.

    regs = load_registers("runs/lm_tiny_arith")            # register_embedding + config.yaml's objective
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from safetensors.torch import load_file
from torch import Tensor

from ..config import make
from ..objectives.spec import RegisterSpec
from ..sampling.auto import can_draft as objective_drafts
from ..sampling.config import checkpoint_spec, useful_draft
from ..sampling.stats import DecodeStats
from .model import REGISTER_FILE


@dataclass(frozen=True)
class Registers:
    """A checkpoint's registers at decoding: ``embedding`` (D,), the trained ``spec``, ``draft`` K per round."""
    embedding: Tensor
    spec: RegisterSpec
    draft: int

    @property
    def offsets(self) -> tuple[int, ...]:
        """The distances d = 2..K+1 the registers draft."""
        return tuple(d for _, d in self.spec.draft_offsets()[:self.draft])


def registers_of(embedding: Tensor, objective, draft: int | None = None) -> Registers:
    """The Registers of an objective section (``draft`` default d_max - 1); ConfigError if it cannot draft."""
    return Registers(embedding, checkpoint_spec(objective), useful_draft(objective, draft, "draft", "decode"))


def run_objective(folder: str | Path):
    """The objective section of a saved folder's config.yaml (for RUN/step_N: RUN's); None if none."""
    folder = Path(folder)
    for where in (folder, folder.parent):
        if (where / "config.yaml").is_file():
            section = (yaml.safe_load((where / "config.yaml").read_text()) or {}).get("objective")
            return make("objective", **section) if isinstance(section, dict) else None
    return None


def load_registers(folder: str | Path, draft: int | None = None, objective=None) -> Registers:
    """The drafter of a saved run folder (or RUN/step_N): its register embedding and ``objective``'s offsets."""
    folder = Path(folder)
    if not (folder / REGISTER_FILE).is_file():
        raise ValueError(f"{folder}: no {REGISTER_FILE} (trained without registers); decode plain")
    objective = objective if objective is not None else run_objective(folder)
    if objective is None:
        raise ValueError(f"{folder}: no config.yaml naming the objective (its d_max sets the draft length)")
    return registers_of(load_file(str(folder / REGISTER_FILE))["register_embedding"], objective, draft)


def folder_mode(decode: str, folder: str | Path) -> str:
    """The mode a saved folder decodes with under ``--decode``: auto = registers when it drafts, else plain."""
    if decode != "auto":
        return decode
    objective = run_objective(folder) if (Path(folder) / REGISTER_FILE).is_file() else None
    return "registers" if objective is not None and objective_drafts(objective) else "plain"


def model_decoding(decode: str, model, objective) -> tuple[str, Registers | None]:
    """(mode, drafter) of a MutorLM trained under ``objective`` for ``eval.decode`` (auto: registers if it drafts)."""
    drafts = model.has_registers and objective_drafts(objective)
    mode = ("registers" if drafts else "plain") if decode == "auto" else decode
    if mode != "registers":
        return mode, None
    useful_draft(objective, None, "draft", "decode")          # no registers: a one-line ConfigError, first
    return mode, registers_of(model.register_embedding.detach(), objective)


def record_fields(mode: str, registers: Registers | None, stats: DecodeStats) -> dict:
    """An evaluation record's decoding settings (its ``sampling``): decode, decode_options, decode_stats."""
    options = {"draft": registers.draft, "offsets": list(registers.offsets)} if registers is not None else {}
    summary = {k: v for k, v in stats.summary().items() if not k.startswith("register_")}
    return {"decode": mode, "decode_options": options, "decode_stats": summary}
