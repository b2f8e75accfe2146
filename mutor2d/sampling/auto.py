"""``--decode auto``: the fastest exact decoding mode for a batch size and device, from the crossover
that ``bench/sample.py --crossover`` measures (``crossover.json`` beside this file: per device type,
the fastest of plain / registers (default draft) / jacobi (default window) at each measured batch size,
with the date and command of the measurement; docs/BENCHMARKS.md)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from .config import checkpoint_spec

CROSSOVER = Path(__file__).with_name("crossover.json")


def auto_decode(images: int, device, has_registers: bool, table: dict | None = None) -> str:
    """The decoding mode to run a batch of ``images`` images on ``device`` (a torch.device or its
    name): the fastest measured at the nearest measured batch size (in log scale) on that device
    type; among plain and jacobi only when the checkpoint has no registers (``has_registers``).
    A device type with no measurement gets plain. ``table``: crossover.json's content (default: read it)."""
    table = table if table is not None else json.loads(CROSSOVER.read_text())
    if not (rows := table["devices"].get(str(device).split(":")[0], [])):
        return "plain"
    row = min(rows, key=lambda r: abs(math.log(r["images"]) - math.log(max(images, 1))))
    return row["fastest"] if has_registers else row["fastest_without_registers"]


def can_draft(objective) -> bool:
    """Whether a checkpoint's objective section (or its RegisterSpec) gives register drafts (isolated
    registers with offset (0, 2)); an objective this process does not know (a plugin's) gives none."""
    spec = checkpoint_spec(objective)
    return spec.register_visibility == "isolated" and bool(spec.draft_offsets())
