"""The register attention mask of one sample as a picture (docs/METHOD.md's figures):

    python -m mutor2d.objectives.figure --grid 4x4 --dmax2d 3 --out mask.png

Rows attend to columns; regular tokens blue, registers orange (purple: a register seeing a
register). The layout comes from mutor2d.objectives.layout; this module parses its flags before torch loads.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..cli import HelpFormatter, grid_arg
from .spec import MAX_D_1D, MAX_D_2D, LayoutError, RegisterSpec1D, RegisterSpec2D


def draw_mask(layout, sample: int, path: str, order: str = "interleaved") -> None:
    """Save the attention matrix of one sample as a PNG: rows attend to columns; regular tokens
    in blue, registers in orange, unused register slots omitted."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    T, P = layout.num_regular, layout.prefix_len
    keep = torch.cat([torch.ones(T, dtype=torch.bool), layout.reg_valid[sample]])
    idx = layout.interleaved_order()[sample] if order == "interleaved" else torch.arange(len(keep))
    idx = idx[keep[idx]]
    m = layout.dense_mask()[sample][idx][:, idx].numpy()
    is_reg = (idx >= T).numpy()
    anchor, target = layout.reg_anchor[sample].tolist(), layout.reg_target[sample].tolist()
    labels = [f"p{j}" if j < P else f"x{j - P}" if j < T else f"r{anchor[j - T]}→x{target[j - T]}"
              for j in idx.tolist()]
    L = len(idx)
    blue, orange, purple = np.array([0.2, 0.4, 0.85]), np.array([0.95, 0.55, 0.1]), np.array([0.55, 0.3, 0.7])
    reg_to_reg = (is_reg[:, None] & is_reg[None, :])[..., None]                    # (L, L, 1)
    colour = np.where(reg_to_reg, purple, np.where(is_reg[:, None, None], orange, blue))    # (L, L, 3)
    img = np.where(m[..., None], colour, 1.0)                                        # white: hidden
    size = max(4.0, 0.22 * L)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(img, interpolation="nearest")
    ax.set_xticks(range(L), labels, rotation=90, fontsize=6)
    ax.set_yticks(range(L), labels, fontsize=6)
    for tick, r in zip(ax.get_xticklabels() + ax.get_yticklabels(), np.tile(is_reg, 2)):
        tick.set_color("darkorange" if r else "navy")
    H, W = layout.grid
    ax.set_title(f"grid {H}x{W}, prefix {P}: rows attend to columns\n"
                 f"blue: regular, orange: register → regular, purple: register → itself", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m mutor2d.objectives.figure", formatter_class=HelpFormatter,
                                 description="Draw the MuToR attention mask of one sample (rows attend to "
                                             "columns) as a PNG, and print its registers' offsets.")
    ap.add_argument("--grid", type=grid_arg, default=(4, 4), help="HxW body grid (1xN for 1D)")
    ap.add_argument("--prefix", type=int, default=1, help="prefix length P (1: a class label)")
    ap.add_argument("--objective", default=None, choices=["mutor-1d", "mutor-2d"],
                    help="default: mutor-2d for H > 1, mutor-1d for H = 1")
    ap.add_argument("--dmax2d", type=int, default=3,
                    help="D of the 2D offsets (objective.d_max): (dr, dc) in {0..D-1}^2 minus (0, 0)")
    ap.add_argument("--dmin", type=int, default=1, help="1D offsets: the nearest token ahead a register predicts")
    ap.add_argument("--dmax", type=int, default=4, help="1D offsets: the farthest token ahead (d = dmin..dmax)")
    ap.add_argument("--sparse", type=int, default=0,
                    help="K registers at random anchors (objective.placement=sparse); 0 = dense, one per token")
    ap.add_argument("--per-register-offsets", action="store_true",
                    help="draw an offset per register (default: one offset per sequence, the paper's rule)")
    ap.add_argument("--edge", choices=["geometric", "raster"], default="geometric",
                    help="targets past the right edge: invalid (geometric) or wrapped to the next row (raster)")
    ap.add_argument("--visibility", choices=["isolated", "earlier_registers"], default="isolated",
                    help="objective.register_visibility: a register sees no register (isolated, the paper's "
                         "rule) or also the registers of earlier anchors")
    ap.add_argument("--order", choices=["interleaved", "appended"], default="interleaved",
                    help="draw each register after its anchor (interleaved) or in memory order (appended)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the offset / anchor draw")
    ap.add_argument("--out", default="mask.png", help="PNG to write (default mask.png)")
    return ap


FIGURE_TOKENS = 256      # prefix + grid tokens a figure draws at most: one labelled row and column each


def check_args(ap: argparse.ArgumentParser, args, kind: str) -> None:
    """Values the layout would accept or fail on deep inside: one-line errors naming the flag."""
    tokens = args.prefix + args.grid[0] * args.grid[1]
    if tokens > FIGURE_TOKENS:
        ap.error(f"--grid {args.grid[0]}x{args.grid[1]} --prefix {args.prefix}: {tokens} tokens; "
                 f"expected at most {FIGURE_TOKENS} in a figure")
    if kind == "mutor-2d" and not 2 <= args.dmax2d <= MAX_D_2D:
        ap.error(f"--dmax2d {args.dmax2d}: expected 2..{MAX_D_2D} (D=1 has no 2D offsets)")
    if kind == "mutor-1d" and not 1 <= args.dmin <= args.dmax <= MAX_D_1D:
        ap.error(f"--dmin {args.dmin} --dmax {args.dmax}: expected 1 <= dmin <= dmax <= {MAX_D_1D}")
    if args.sparse < 0:
        ap.error(f"--sparse {args.sparse}: expected >= 0 (0: dense)")
    if Path(args.out).is_dir() or Path(args.out).suffix.lower() != ".png":
        ap.error(f"--out {args.out!r}: expected the path of a .png file")


def main(argv: list[str] | None = None) -> None:
    ap = build_parser()
    args = ap.parse_args(argv)
    kind = args.objective or ("mutor-1d" if args.grid[0] == 1 else "mutor-2d")
    check_args(ap, args, kind)
    import torch
    from .layout import make_layout
    rules = dict(placement="sparse" if args.sparse else "dense", num_registers=max(args.sparse, 1),
                 per_register_offsets=args.per_register_offsets, edge=args.edge, register_visibility=args.visibility)
    spec = RegisterSpec2D(args.dmax2d, **rules) if kind == "mutor-2d" else RegisterSpec1D(args.dmin, args.dmax, **rules)
    try:
        layout = make_layout(1, args.grid, args.prefix, spec, torch.Generator().manual_seed(args.seed))
    except LayoutError as e:
        raise SystemExit(f"error: {e}")
    draw_mask(layout, 0, args.out, args.order)
    offs = sorted({tuple(o) for o in layout.reg_offset[0][layout.reg_valid[0]].tolist()})
    print(f"wrote {args.out}: {layout.num_regular} regular tokens, "
          f"{int(layout.reg_valid[0].sum())} registers, offsets {offs}")


if __name__ == "__main__":
    from ..preempt import exit_on_ctrl_c
    exit_on_ctrl_c()        # python -m: a Ctrl-C mid-way is one line, exit 130
    main()
