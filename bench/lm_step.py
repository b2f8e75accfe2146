"""LM fine-tuning step benchmark (mutor2d.lm): plain SFT (NTP) vs MuToR-1D sparse / dense, and a
padded batch of B vs a batch-1 loop over the same B samples (the authors' code trains at batch 1).

One step = forward + backward + AdamW of MutorLM (mutor2d.lm.run.LMTrainModule) on random ragged
(prompt, answer) pairs through a random Llama (full fine-tuning, or --lora); "b1loop" cases accumulate
over B batch-1 passes, then step once. Per case: seconds per step, slots (padding included), real tokens,
time vs padded NTP, answer tokens/s; then the batch-B vs b1loop speed-up for NTP and dense. With
``--self-distill``: dense_distill (reg_target self_distill) and ``distill_vs_token``. Round-robin, median
of --reps; the last stdout line is one JSON object.

    python bench/lm_step.py                 # hidden 512, 4 layers, vocab 32000, batch 8
    python bench/lm_step.py --quick         # seconds, for CI
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

import common             # the command line parses and checks before torch is imported
from mutor2d.checks import over_memory
from mutor2d.cli import HelpFormatter

if TYPE_CHECKING:
    import torch

    from mutor2d.lm.packing import LMBatch

POSITIONS = 2048          # max_position_embeddings of the benchmark model: longest prompt + answer
MUTOR_1D = {"name": "mutor-1d", "d_min": 1, "d_max": 4}     # the dense case (the default placement)


def build_model(args, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mutor2d.lm.model import MutorLM
    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                                      intermediate_size=4 * args.hidden, num_attention_heads=args.hidden // 64,
                                      num_key_value_heads=args.hidden // 64, max_position_embeddings=POSITIONS,
                                      attn_implementation="sdpa")).to(device)
    if args.lora:
        from mutor2d.lm.hf import apply_lora    # the runs' LoRA path (it keeps peft's deprecation notice quiet)
        lm = apply_lora(lm, r=16, alpha=32, dropout=0.0, targets=["q_proj", "k_proj", "v_proj", "o_proj"])
    return MutorLM(lm).to(device)


def ragged_batch(args, g: torch.Generator) -> LMBatch:
    import torch

    from mutor2d.lm.packing import LMBatch
    B = args.batch
    P = torch.randint(args.prompt[0], args.prompt[1] + 1, (B,), generator=g)
    N = torch.randint(args.answer[0], args.answer[1] + 1, (B,), generator=g)
    prompt = torch.randint(3, args.vocab, (B, int(P.max())), generator=g)
    answer = torch.randint(3, args.vocab, (B, int(N.max())), generator=g)
    return LMBatch(prompt, P, answer, N)


def one_sample(batch: LMBatch, b: int) -> LMBatch:
    from mutor2d.lm.packing import LMBatch
    P, N = int(batch.prompt_len[b]), int(batch.answer_len[b])
    return LMBatch(batch.prompt[b:b + 1, :P], batch.prompt_len[b:b + 1], batch.answer[b:b + 1, :N],
                   batch.answer_len[b:b + 1])


def make_step(module, opt, batches, g):
    def step():
        for b in batches:
            (module(b, g).loss / len(batches)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--hidden", type=int, default=512,
                    help="hidden size of the random Llama, a multiple of 64 (heads of 64; default 512)")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    ap.add_argument("--vocab", type=int, default=32000, help="vocabulary size (default 32000)")
    ap.add_argument("--batch", type=int, default=8, help="samples per step (default 8)")
    ap.add_argument("--prompt", type=int, nargs=2, default=[60, 120], metavar=("MIN", "MAX"),
                    help="prompt lengths drawn uniformly in MIN..MAX (default 60 120)")
    ap.add_argument("--answer", type=int, nargs=2, default=[80, 160], metavar=("MIN", "MAX"),
                    help="answer lengths drawn uniformly in MIN..MAX (default 80 160)")
    ap.add_argument("--sparse", type=int, default=16, help="K registers of the sparse case")
    ap.add_argument("--lora", action="store_true", help="LoRA adapters instead of full fine-tuning")
    ap.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    ap.add_argument("--self-distill", action="store_true",
                    help="also time dense MuToR-1D under objective.reg_target=self_distill (distill_vs_token)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for CI")
    common.add_timing_options(ap, 3)
    return ap


def parse(argv=None):
    """The options, checked before torch is imported (main resolves --device)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    common.check_at_least(ap, args, 1, "layers", "batch", "sparse", "reps", "threads")
    common.check_reps(ap, args)
    if args.hidden < 64 or args.hidden % 64:
        ap.error(f"--hidden {args.hidden}: expected a multiple of 64 (heads of 64)")
    if args.vocab < 4:
        ap.error(f"--vocab {args.vocab}: expected >= 4 (ids 0-2 are not drawn)")
    for flag, (low, high) in (("--prompt", args.prompt), ("--answer", args.answer)):
        if not 1 <= low <= high:
            ap.error(f"{flag} {low} {high}: expected 1 <= MIN <= MAX")
    if args.prompt[1] + args.answer[1] > POSITIONS:
        ap.error(f"--prompt {args.prompt[1]} + --answer {args.answer[1]}: expected at most {POSITIONS} tokens "
                 f"(the model's positions)")
    common.check_llama_size(ap, args.hidden, args.layers, args.vocab)
    common.check_at_most(ap, args, args.answer[1], "registers of the longest answer, --answer MAX", "sparse")
    logits = 3 * 4 * args.batch * (args.prompt[1] + 2 * args.answer[1]) * args.vocab   # fp32 logits, softmax, grad
    if short := over_memory(logits):
        ap.error(f"--batch {args.batch}: its logits alone, {short}")
    if args.quick:
        args.hidden, args.layers, args.vocab, args.prompt, args.answer, args.reps = 64, 2, 512, [8, 16], [10, 20], 1
    return args


def main(argv=None) -> None:
    args = parse(argv)
    import torch

    from mutor2d.config import make
    from mutor2d.lm.run import LMTrainModule
    device = common.open_device(args)
    model = build_model(args, device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    batch = ragged_batch(args, torch.Generator().manual_seed(0))
    g = torch.Generator(device).manual_seed(1)
    sparse = {**MUTOR_1D, "placement": "sparse", "num_registers": args.sparse}
    objectives = {"ntp": {"name": "ntp"}, "sparse": sparse, "dense": MUTOR_1D}
    if args.self_distill:
        objectives["dense_distill"] = {**MUTOR_1D, "reg_target": "self_distill"}
    modules = {name: LMTrainModule(model, make("objective", **o), "right") for name, o in objectives.items()}
    singles = [one_sample(batch, b) for b in range(args.batch)]
    fns = {name: make_step(m, opt, [batch], g) for name, m in modules.items()}
    fns.update({f"{name}_b1loop": make_step(modules[name], opt, singles, g) for name in ("ntp", "dense")})
    common.log(f"timing {len(fns)} cases x {args.reps} reps on {device}")
    times = common.time_round_robin(fns, args.reps, warmup=1, device=device)
    answer_tokens = int(batch.answer_len.sum())
    real_tokens = int((batch.prompt_len + batch.answer_len - 1).sum())
    cases = {}
    for name, t in times.items():
        batches = singles if name.endswith("b1loop") else [batch]
        with torch.no_grad():
            slots = sum(int(modules[name.removesuffix("_b1loop")](b, g).tokens) for b in batches)
        cases[name] = {"s_per_step": t, "slots": slots, "regular_tokens": real_tokens,
                       "time_vs_ntp": t / times["ntp"], "answer_tokens_per_s": answer_tokens / t}
    result = {"bench": "lm_step", "machine": common.machine(device), "args": vars(args), "cases": cases,
              "batch_vs_b1loop_speedup": {n: times[f"{n}_b1loop"] / times[n] for n in ("ntp", "dense")}}
    if args.self_distill:
        result["distill_vs_token"] = times["dense_distill"] / times["dense"]
    common.emit(result)


if __name__ == "__main__":
    main()
