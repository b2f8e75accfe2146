"""Sizes of a scaled-up run, computed from the model (no GPU needed): parameters, memory per GPU and
time per 1,000 steps of LlamaGen's GPT presets at the paper's global batch, for NTP and MuToR-2D, with
DDP and with FSDP2; and memory per GPU of Llama-3-8B fine-tuning (full under FSDP2, LoRA under DDP).

Memory per GPU = states (16 bytes per parameter: fp32 weights, gradients, two AdamW moments; divided by
the GPU count under FSDP) + activations (bf16, fused attention: 34 x dim bytes per token and layer,
Korthikanti et al. 2022, plus 10 x vocab bytes per token of logits; 6 x vocab for --lm). LoRA (r = 16,
every projection) keeps the bf16 base (2 bytes per parameter) and 16 bytes per adapter parameter.
Time per 1,000 steps = train_flops (mutor2d.engine.speed) / (GPUs x PEAK_BF16_FLOPS x --mfu).

    python bench/scaling.py [--gpus 8] [--batch 1024] [--gpu H100] [--mfu 0.4]
    python bench/scaling.py --presets XL,XXL,3B --grid 24 --batch 256      # LlamaGen's 384-px recipes
    python bench/scaling.py --lm                                            # Llama-3-8B fine-tuning
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

from mutor2d.cli import GRID_TOKENS_LIMIT, HelpFormatter  # noqa: E402  (parsed and checked before torch is imported)
from mutor2d.model.config import PRESETS                 # noqa: E402
from mutor2d.engine.peaks import PEAK_BF16_FLOPS                 # noqa: E402
from mutor2d.evaluation.records import markdown                   # noqa: E402

GiB = 1024 ** 3


def sequence_length(objective: str, grid: tuple[int, int] = (16, 16)) -> int:
    """Tokens per sequence the trunk processes: T regular inputs + the register slots (sparse: K = 80;
    dense D = 4: the grid's maximum, 240 on 16 x 16, fixed so compiled shapes never change; slots a
    drawn offset leaves empty are computed and masked)."""
    from mutor2d.objectives.spec import RegisterSpec2D
    from mutor2d.objectives.layout import make_layout
    T = 1 + grid[0] * grid[1] - 1
    if objective == "ntp":
        return T
    spec = RegisterSpec2D(d_max=4, placement="sparse" if objective == "sparse" else "dense",
                          num_registers=80)
    return T + make_layout(1, grid, 1, spec).num_registers


def row(preset: str, objective: str, args) -> dict:
    import torch

    from mutor2d.engine.speed import train_flops
    from mutor2d.model.gpt import GPT
    from mutor2d.model.config import ModelConfig
    with torch.device("meta"):
        model = GPT(ModelConfig(preset=preset, vocab_size=16384, num_classes=1000), register_token=True)
    s, params = model.shape, sum(p.numel() for p in model.parameters())
    L = sequence_length(objective, (args.grid, args.grid))
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


LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lm_rows(args) -> list[dict]:
    """Llama-3-8B at ``--lm-tokens`` tokens per sequence and ``--lm-batch`` sequences per GPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mutor2d.lm.hf import apply_lora
    config = LlamaConfig(**LLAMA3_8B)
    with torch.device("meta"):
        lm = apply_lora(LlamaForCausalLM(config), r=16, alpha=8, dropout=0.0, targets=LORA_TARGETS)
    total = sum(p.numel() for p in lm.parameters())
    adapters = sum(p.numel() for p in lm.parameters() if p.requires_grad)
    tokens = args.lm_batch * args.lm_tokens
    acts = tokens * (34 * config.hidden_size * config.num_hidden_layers + 6 * config.vocab_size)
    cases = {"full, DDP": 16 * total, "full, FSDP2": 16 * total / args.gpus,
             "LoRA r=16, DDP": 2 * (total - adapters) + 16 * adapters}
    return [{"model": "Llama-3-8B", "finetune": case, "params_B": round(total / 1e9, 2),
             "trainable_M": round((adapters if "LoRA" in case else total) / 1e6, 1),
             "states_GiB_per_gpu": round(states / GiB, 1), "activations_GiB": round(acts / GiB, 1),
             "total_GiB_per_gpu": round((states + acts) / GiB, 1)} for case, states in cases.items()]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--gpus", type=int, default=8, help="GPUs of the estimated run")
    ap.add_argument("--batch", type=int, default=1024, help="global batch")
    ap.add_argument("--gpu", choices=sorted(PEAK_BF16_FLOPS), default="H100", help="GPU model (its bf16 peak)")
    ap.add_argument("--mfu", type=float, default=0.40, help="assumed model FLOPs utilisation")
    ap.add_argument("--presets", default="B,L,XL", help="comma-separated GPT presets (XXL, 3B: LlamaGen's largest)")
    ap.add_argument("--grid", type=int, default=16, help="token grid side (16: 256 px, 24: 384 px with VQ-16)")
    ap.add_argument("--lm", action="store_true", help="Llama-3-8B fine-tuning memory instead of the GPT table")
    ap.add_argument("--lm-tokens", type=int, default=1024, help="--lm: tokens per sequence (prompt + answer)")
    ap.add_argument("--lm-batch", type=int, default=4, help="--lm: sequences per GPU")
    return ap


def parse(argv=None) -> argparse.Namespace:
    """The options, checked before torch is imported."""
    ap = build_parser()
    args = ap.parse_args(argv)
    for flag in ("gpus", "batch", "grid", "lm_tokens", "lm_batch"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: expected >= 1")
    if not 0 < args.mfu <= 1:
        ap.error(f"--mfu {args.mfu}: expected a fraction in (0, 1]")
    if args.grid ** 2 > GRID_TOKENS_LIMIT:
        ap.error(f"--grid {args.grid}: expected at most {math.isqrt(GRID_TOKENS_LIMIT)} ({GRID_TOKENS_LIMIT} tokens)")
    unknown = [p for p in args.presets.split(",") if p not in PRESETS]
    if unknown and not args.lm:
        ap.error(f"--presets {args.presets!r}: {unknown[0]!r} is not a preset; expected a comma-separated "
                 f"list of {', '.join(PRESETS)}")
    return args


def main(argv=None) -> None:
    args = parse(argv)
    if args.lm:
        rows = lm_rows(args)
    else:
        rows = [row(p, o, args) for p in args.presets.split(",") for o in ("ntp", "sparse", "dense")]
    print(markdown(list(rows[0]), [[str(v) for v in r.values()] for r in rows]))
    print(json.dumps({"args": vars(args), "rows": rows}))


if __name__ == "__main__":
    main()
