"""Position extrapolation (docs/METHOD.md): teacher-forced regular-token NLL by position (a grid row, or
an answer position for text), registers absent, cut by the trained limits into inside / beyond. Images:
``stack`` test images of one class stacked into one grid; the control ``wrap`` reuses the trained rows'
position ids (row mod H). A model with 1D RoPE or another width is refused."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checkpoint import inference, locate
from ..data.tokens import build_dataset, collate
from ..objectives.layout import regular_position_ids
from .records import markdown


class ExtrapolationError(ValueError):
    """A setting or input the evaluation cannot use (one line)."""


@dataclass
class Curve:
    """NLL by position of one run: ``nll_sum[k]`` nats over ``count[k]`` regular tokens at position k.
    ``edges``: the trained limits, ascending (position k is past edge e iff k >= e); ``bins``: the
    names of the len(edges) + 1 ranges they cut, first "inside", last "beyond"."""
    nll_sum: list[float]
    count: list[int]
    edges: list[int]
    bins: list[str]

    def nll(self) -> list[float | None]:
        """Mean NLL per position (None where no token)."""
        return [s / n if n else None for s, n in zip(self.nll_sum, self.count)]

    def ranges(self) -> list[tuple[int, int]]:
        """[start, stop) positions of each bin."""
        cuts = [0, *self.edges, max(len(self.count), self.edges[-1] if self.edges else 0)]
        return [(a, max(a, b)) for a, b in zip(cuts, cuts[1:])]

    def binned(self) -> dict[str, float | None]:
        """Bin name -> NLL pooled over its tokens (None when it holds none)."""
        sums = [(sum(self.nll_sum[a:b]), sum(self.count[a:b])) for a, b in self.ranges()]
        return {name: nll / n if n else None for name, (nll, n) in zip(self.bins, sums)}

    def to_dict(self) -> dict:
        return {"nll": self.nll(), "count": self.count, "edges": self.edges, "binned": self.binned()}


def curve_from(nll: Tensor, valid: Tensor, edges: list[int], bins: list[str]) -> Curve:
    """nll, valid (B, L): per-token NLL and which tokens count, position = column -> the Curve."""
    kept = torch.where(valid, nll.double(), 0.0)
    return Curve(kept.sum(0).tolist(), valid.sum(0).tolist(), list(edges), list(bins))


# ----------------------------------------------------------------------------- images

def stacked_grids(codes: Tensor, labels: Tensor, stack: int) -> Tensor:
    """codes (n, H, W), labels (n,) -> (n, stack * H, W): grid i is image i, then the next stack - 1
    images of its class (in split order, cyclically: each image appears once in every block)."""
    if stack < 2:
        raise ExtrapolationError(f"stack {stack}: expected >= 2 (a grid taller than trained)")
    later = torch.empty(stack, len(labels), dtype=torch.long)
    for c in labels.unique():
        members = torch.nonzero(labels == c)[:, 0]
        for k in range(stack):
            later[k, members] = members.roll(-k)
    return torch.cat([codes[later[k]] for k in range(stack)], dim=1)


def check_grid(model_cfg, trained: tuple[int, int], grid: tuple[int, int]) -> None:
    """One-line refusals: 1D RoPE on a grid of several rows; a width other than the trained one; fewer rows."""
    (H, W), (h, w) = trained, grid
    if model_cfg.rope == "1d":
        raise ExtrapolationError("model.rope=1d: rows have no position of their own (all pairs turn by column); "
                                 "taller grids need 2D RoPE")
    if model_cfg.conditioning != "class":
        raise ExtrapolationError(f"model.conditioning={model_cfg.conditioning}: stacked grids pair images by class label")
    if w != W:
        raise ExtrapolationError(f"grid {h}x{w}: the model was trained on width {W} (a taller grid keeps the width)")
    if h < H:
        raise ExtrapolationError(f"grid {h}x{w}: fewer rows than the trained {H}x{W}")


@torch.no_grad()
def grid_token_nll(model, codes: Tensor, labels: Tensor, batch_size: int = 256, wrap: int = 0) -> Tensor:
    """codes (n, h, w), class labels (n,) -> (n, h, w) teacher-forced NLL of every body token (nats),
    regular pathway, position ids of an h x w grid (``registers.regular_position_ids``); ``wrap`` > 0:
    rows take row mod ``wrap`` (the control: the same context, no new positions)."""
    n, h, w = codes.shape
    pos = regular_position_ids((h, w), 1)
    if wrap:
        pos = torch.stack([torch.where(pos[:, 0] >= 0, pos[:, 0] % wrap, -1), pos[:, 1]], dim=-1)
    out = []
    for i in range(0, n, batch_size):
        body, prefix = codes[i:i + batch_size].flatten(1), labels[i:i + batch_size]
        logits = model(body[:, :-1], pos.expand(len(body), -1, -1), prefix)       # (B, 1 + N - 1, V)
        out.append(F.cross_entropy(logits.transpose(1, 2).float(), body, reduction="none"))
    return torch.cat(out).view(n, h, w)


def image_curve(model, model_cfg, trained: tuple[int, int], codes: Tensor, labels: Tensor,
                stack: int, wrap: bool = False) -> Curve:
    """NLL by grid row of ``stack``-high stacks of the images ``codes`` (n, H, W): rows < H inside the
    trained grid, rows >= H beyond it. ``wrap``: every block at the trained rows' positions (row mod H),
    so that "beyond" holds the cost of the context above without new positions."""
    grids = stacked_grids(codes, labels, stack)
    check_grid(model_cfg, trained, tuple(grids.shape[1:]))
    nll = grid_token_nll(model, grids, labels, wrap=trained[0] if wrap else 0)     # (n, stack H, W)
    rows = nll.transpose(1, 2).flatten(0, 1)                             # (n W, stack H): position = row
    return curve_from(rows, torch.ones_like(rows, dtype=torch.bool), [trained[0]], ["inside", "beyond"])


def open_image_run(run: str, split: str = "test"):
    """(model in eval mode, ImageRunConfig, trained grid (H, W), codes (n, H, W), labels (n,)) of an image
    run folder or checkpoint (EMA weights when kept) and its data's ``split``."""
    try:
        model, cfg, meta = inference.open_model(locate.resolve(run))
    except FileNotFoundError as e:
        raise ExtrapolationError(f"--run {run}: {e}") from None
    ds = build_dataset(cfg.data, split)
    grid = tuple(int(v) for v in (meta.get("grid") or ds.grid))
    batch = collate([ds[i] for i in range(len(ds))])
    return model, cfg, grid, batch["body"].view(-1, *grid), batch["prefix"]


# ----------------------------------------------------------------------------- several runs

def summarise(results: list[dict]) -> dict[str, dict]:
    """Per label (runs of one label: seeds): per bin the mean and sd over runs of the binned NLL, and
    of the paired "beyond minus inside". ``results``: {"label", "curve": Curve}."""
    out = {}
    for label in dict.fromkeys(r["label"] for r in results):
        curves = [r["curve"] for r in results if r["label"] == label]
        if any(c.edges != curves[0].edges for c in curves):
            raise ExtrapolationError(f"label {label}: its runs were trained on different lengths "
                                     f"({sorted({tuple(c.edges) for c in curves})}); give them different labels")
        binned = [c.binned() for c in curves]
        values = {b: [x[b] for x in binned] for b in curves[0].bins}
        values["beyond - inside"] = [None if None in (x["beyond"], x["inside"]) else x["beyond"] - x["inside"]
                                     for x in binned]
        out[label] = {"runs": len(curves), "edges": curves[0].edges, **{k: mean_sd(v) for k, v in values.items()}}
    return out


def mean_sd(values: list[float | None]) -> dict:
    """{"mean", "sd"} over the values that exist (sd None for fewer than two; both None for none)."""
    v = [x for x in values if x is not None]
    return {"mean": statistics.fmean(v) if v else None, "sd": statistics.stdev(v) if len(v) > 1 else None}


def table(summary: dict[str, dict], unit: str) -> str:
    """Markdown: one row per label, one column per bin in position order, then "beyond - inside" (mean ± sd
    over runs, nats per token); "limits": the trained limits (positions at or past them are beyond)."""
    keys = list(dict.fromkeys(k for s in summary.values() for k in s if isinstance(s[k], dict)))
    cols = sorted(keys, key=lambda k: {"inside": 0, "beyond": 2, "beyond - inside": 3}.get(k, 1))
    return markdown(["run", "runs", f"limits ({unit}s)", *cols],
                    [[label, str(s["runs"]), ", ".join(map(str, s["edges"])), *(fmt(s.get(c)) for c in cols)]
                     for label, s in summary.items()])


def fmt(cell: dict | None) -> str:
    if not cell or cell["mean"] is None:
        return "-"
    return f"{cell['mean']:.3f}" + (f" ± {cell['sd']:.3f}" if cell["sd"] is not None else "")
