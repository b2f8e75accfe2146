"""Sizes of a scaled-up run, computed from the model (no GPU needed): parameters, memory per GPU and
time per 1,000 steps of GPT-B / L / XL at the paper's global batch, for NTP and MuToR-2D.

Memory per GPU = states + activations, all computed, not measured:
  * states: fp32 weights, fp32 gradients, AdamW's two fp32 moments = 16 bytes per parameter
    (bf16 autocast keeps fp32 master weights; DDP replicates them, FSDP divides them by the GPU count);
  * activations kept for backward under bf16 autocast with a fused attention kernel (no L x L
    scores): 34 x dim bytes per token and layer (Korthikanti et al. 2022, table 2 without the
    attention-score terms), plus the fp32 logits, their bf16 copy and gradient: 10 x vocab bytes per token.
Time per 1,000 steps = training FLOPs (mutor2d.engine.speed.train_flops) / (GPUs x peak x MFU), with
the peak of mutor2d.engine.speed.PEAK_BF16_FLOPS and an assumed MFU (``--mfu``, default 0.40).

    python bench/scaling.py [--gpus 8] [--batch 1024] [--gpu H100] [--mfu 0.4]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mutor2d.model import ModelConfig             # noqa: E402
from mutor2d.engine.speed import PEAK_BF16_FLOPS, train_flops  # noqa: E402
from mutor2d.model import GPT                      # noqa: E402
from mutor2d.registers import RegisterSpec, make_layout  # noqa: E402

GiB = 1024 ** 3


def sequence_length(objective: str, grid=(16, 16)) -> int:
    """Tokens per sequence the trunk processes: T regular inputs + the register slots (sparse: K = 80;
    dense D = 4: the grid's maximum, 240 on 16 x 16, fixed so compiled shapes never change; slots a
    drawn offset leaves empty are computed and masked)."""
    T = 1 + grid[0] * grid[1] - 1
    if objective == "ntp":
        return T
    spec = RegisterSpec("mutor-2d", d_max=4, placement="sparse" if objective == "sparse" else "dense",
                        num_registers=80)
    return T + make_layout(1, grid, 1, spec).num_registers


def row(preset: str, objective: str, args) -> dict:
    model = GPT(ModelConfig(preset=preset, vocab_size=16384, num_classes=1000), register_token=True)
    s, params = model.shape, model.num_params()
    L = sequence_length(objective)
    per_gpu = args.batch / args.gpus
    states = 16 * params
    acts = per_gpu * L * (34 * s.dim * s.n_layer + 10 * model.cfg.vocab_size)
    flops = train_flops(s, model.cfg.vocab_size, args.batch, L)
    secs = 1000 * flops / (args.gpus * PEAK_BF16_FLOPS[args.gpu] * args.mfu)
    return {"preset": preset, "objective": objective, "params_M": round(params / 1e6, 1),
            "tokens_per_seq": round(L, 1), "states_GiB": round(states / GiB, 1),
            "activations_GiB": round(acts / GiB, 1), "total_GiB_ddp": round((states + acts) / GiB, 1),
            "total_GiB_fsdp": round((states / args.gpus + acts) / GiB, 1),
            "train_PFLOP_per_step": round(flops / 1e15, 2), "minutes_per_1000_steps": round(secs / 60, 1)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1024, help="global batch")
    ap.add_argument("--gpu", choices=sorted(PEAK_BF16_FLOPS), default="H100")
    ap.add_argument("--mfu", type=float, default=0.40, help="assumed model FLOPs utilisation")
    args = ap.parse_args(argv)
    rows = [row(p, o, args) for p in ("B", "L", "XL") for o in ("ntp", "sparse", "dense")]
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    print(json.dumps({"args": vars(args), "rows": rows}))


if __name__ == "__main__":
    main()
