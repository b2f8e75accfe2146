"""Register-drafted decoding of a fine-tuned language model against plain decoding and prompt lookup,
side by side in one process (mutor2d.lm.speculative).

The tiny character-level Llama (mutor2d.lm.tiny), fine-tuned with MuToR-1D (d_max 4, dense, a = 0.3) on
2-step arithmetic problems for --steps steps (kept in --work), answers --answers test prompts at batch 1
and 8, greedy and at temperature 1: plain ``generate``, prompt lookup (batch 1 only) and register drafts
K = 1..d_max-1. Per case: forward calls and forwards per token, time per answer and per token, against
plain and prompt lookup, acceptance by distance; greedy outputs checked equal to plain greedy's. Also one
decode step against its weight-bytes / read-bandwidth floor. The last stdout line is one JSON object.

    python bench/lm_decode.py --threads 1 --clock cpu       # trains ~400 steps once, then benchmarks
    python bench/lm_decode.py --quick                       # seconds, for CI
"""
from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

import common             # the command line parses and checks before torch is imported
import mutor2d.lm as lm_pkg
from mutor2d.cli import HelpFormatter
from mutor2d.lm import prompts as lm_prompts
from mutor2d.lm.arith import arith_records
from mutor2d.lm.records import load_located, write_jsonl
from mutor2d.lm.tiny import DEFAULT_POSITIONS, write_tiny_llama


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--work", default="runs/bench_lm_decode", help="folder of the model, data and fine-tuned run")
    ap.add_argument("--steps", type=int, default=400, help="MuToR-1D fine-tuning steps (default 400)")
    ap.add_argument("--hidden", type=int, default=64, help="width of the tiny Llama, a multiple of 8 (default 64)")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    ap.add_argument("--answers", type=int, default=16, help="test prompts answered per case (default 16)")
    ap.add_argument("--max-new-tokens", type=int, default=40, help="answer length limit (default 40)")
    ap.add_argument("--quick", action="store_true", help="a few training steps and answers, for CI")
    common.add_timing_options(ap, 3, threads=1, clock="cpu")
    return ap


def fine_tuned(args) -> Path:
    """The MuToR-1D run folder (trained here unless --work already holds it)."""
    work = Path(args.work)
    run = work / f"run_{args.hidden}x{args.layers}_{args.steps}"
    if (run / "register_embedding.safetensors").is_file():
        return run
    work.mkdir(parents=True, exist_ok=True)
    write_tiny_llama(work / f"base_{args.hidden}x{args.layers}", hidden=args.hidden, layers=args.layers)
    write_jsonl(arith_records(4000, [2], 0), work / "train.jsonl")
    cfg = {"task": "lm", "model": {"hf": str(work / f"base_{args.hidden}x{args.layers}"), "finetune": "full"},
           "data": {"name": "gsm8k", "path": str(work / "train.jsonl"), "max_prompt_len": 160, "max_answer_len": 64},
           "objective": {"name": "mutor-1d", "reg_weight": 0.3, "d_min": 1, "d_max": 4, "placement": "dense"},
           "optim": {"lr": 3e-3, "betas": [0.9, 0.95], "schedule": "cosine", "warmup_steps": min(80, args.steps // 5),
                     "min_lr": 3e-4},
           "train": {"batch_size": 32, "max_steps": args.steps, "log_every": 50, "ckpt_every": 0, "tracker": "none",
                     "mixed_precision": "no"}}
    common.log(f"fine-tuning {run} ({args.steps} steps)")
    return lm_pkg.train(cfg, run)


def plain_case(lm, batches, eos: int, max_new: int, sample: bool, lookup: int = 0):
    """Plain model.generate (``lookup`` > 0: prompt-lookup decoding) over every batch -> new tokens
    (sampling seeded: every repetition draws the same answers)."""
    import torch

    options = {"do_sample": sample, **({"temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {})}
    options.update({"prompt_lookup_num_tokens": lookup} if lookup else {})

    def run():
        out = []
        torch.manual_seed(0)
        for ids, mask in batches:
            gen = lm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, pad_token_id=0,
                              **options)
            out += [row[:(row.index(eos) + 1) if eos in row else None] for row in gen[:, ids.shape[1]:].tolist()]
        return out
    return run


def register_case(lm, batches, eos: int, max_new: int, sample: bool, registers, stats):
    """Register drafts (mutor2d.lm.speculative) over every batch -> new tokens (sampling seeded)."""
    import torch

    from mutor2d.lm.speculative import GREEDY, generate_ids
    from mutor2d.sampling.rules import SamplingRules
    rules = SamplingRules(temperature=1.0) if sample else GREEDY

    def run():
        out, generator = [], torch.Generator().manual_seed(0)
        for ids, mask in batches:
            out += generate_ids(lm, ids, mask, max_new, registers=registers, rules=rules, eos=[eos], stats=stats,
                                generator=generator)
        return out
    return run


def decode_step_floor(lm) -> dict:
    """One plain decode step (batch 1, a 64-token cache) against weight bytes / read bandwidth."""
    import torch

    from mutor2d.lm.model import cache_kwarg
    from mutor2d.lm.speculative import new_cache
    weight_bytes = sum(p.numel() * p.element_size() for p in lm.parameters())
    cache = new_cache()
    kw = {cache_kwarg(lm): cache, "use_cache": True}
    with torch.no_grad():
        lm(input_ids=torch.ones(1, 64, dtype=torch.long), **kw)

        def step():
            lm(input_ids=torch.ones(1, 1, dtype=torch.long), **kw)
            cache.crop(-1)
        t = common.time_round_robin({"step": step}, 20, warmup=3)["step"]
    floor = weight_bytes / common.read_bandwidth(torch.device("cpu"), nbytes=256 << 20, reps=3)
    return {"weight_bytes": weight_bytes, "step_s": t, "floor_s": floor, "step_vs_floor": t / floor}


def parse(argv=None):
    """The options, checked before torch is imported."""
    ap = build_parser()
    args = ap.parse_args(argv)
    common.check_at_least(ap, args, 1, "steps", "hidden", "layers", "answers", "max_new_tokens", "reps", "threads")
    common.check_at_most(ap, args, DEFAULT_POSITIONS, "the tiny model's positions", "max_new_tokens")
    common.check_reps(ap, args)
    if args.hidden % 8:
        ap.error(f"--hidden {args.hidden}: expected a multiple of 8 (4 heads of an even size)")
    common.check_llama_size(ap, args.hidden, args.layers, 0)
    if Path(args.work).exists() and not Path(args.work).is_dir():
        ap.error(f"--work {args.work!r}: exists and is not a folder; expected a work folder")
    if args.quick:
        args.steps, args.answers, args.reps, args.max_new_tokens = 5, 2, 1, 12
        args.work = str(Path(args.work) / "quick")
    return args


def main(argv=None) -> None:
    args = parse(argv)
    import torch
    common.setup(args.threads, args.clock, torch.device("cpu"))
    from mutor2d.lm import drafter, hf
    from mutor2d.sampling.stats import DecodeStats
    run = fine_tuned(args)
    lm, tok = hf.load_for_inference(run), hf.load_tokenizer(run)
    test_file = Path(args.work) / "test.jsonl"
    if not test_file.is_file():                           # 200 held-out problems (seed 1), written once
        write_jsonl(arith_records(200, [2], 1), test_file)
    test = load_located("gsm8k", test_file)[:args.answers]
    prompts = [it["prompt_ids"] for it in lm_prompts.eval_prompts(test, tok)]
    d_max = drafter.run_objective(run).d_max
    cases, stats, batches_of = {}, {}, {}
    for B in (1, 8):
        padded = [tok.pad({"input_ids": prompts[i:i + B]}, padding=True, padding_side="left", return_tensors="pt")
                  for i in range(0, len(prompts), B)]
        batches_of[B] = [(p["input_ids"], p["attention_mask"]) for p in padded]
        for sample, temp in ((False, "greedy"), (True, "t1")):
            settings = (lm, batches_of[B], tok.eos_token_id, args.max_new_tokens, sample)
            cases[f"plain/{temp}/b{B}"] = plain_case(*settings)
            if B == 1:
                cases[f"prompt_lookup/{temp}/b{B}"] = plain_case(*settings, lookup=4)
            for K in range(1, d_max):
                name = f"registers_K{K}/{temp}/b{B}"
                stats[name] = DecodeStats()
                cases[name] = register_case(*settings, drafter.load_registers(run, K), stats[name])
    calls, outputs = Counter(), {}                       # the decoder's forward calls per case
    for name, fn in cases.items():                       # one counted pass each (also checks exactness)
        with lm.get_decoder().register_forward_pre_hook(lambda *_, name=name: calls.update([name])):
            outputs[name] = fn()
    common.log(f"timing {len(cases)} cases x {args.reps} reps")
    times = common.time_round_robin(cases, args.reps, warmup=0)
    result = {"bench": "lm_decode", "machine": common.machine(torch.device("cpu")), "args": vars(args),
              "run": str(run), "d_max": d_max, "answers": len(prompts), "cases": {}}
    tokens = {k: sum(map(len, new)) for k, new in outputs.items()}     # every answer ends at its first EOS
    per_token = {k: times[k] / tokens[k] for k in times}
    for name, t in times.items():
        _, temp, b = name.split("/")
        rows = len(prompts) / len(batches_of[int(b[1:])])              # answers per batch
        plain, lookup = per_token[f"plain/{temp}/{b}"], per_token.get(f"prompt_lookup/{temp}/{b}")
        row = {"forward_calls": calls[name], "forwards_per_token": calls[name] * rows / tokens[name],
               "tokens": tokens[name], "s_per_answer": t / len(prompts), "s_per_token": per_token[name],
               "time_vs_plain": per_token[name] / plain,
               "time_vs_prompt_lookup": per_token[name] / lookup if lookup else None}
        if temp == "greedy":
            row["same_as_plain_greedy"] = outputs[name] == outputs[f"plain/greedy/{b}"]
        if name in stats:
            summary = stats[name].summary()
            row["acceptance_by_distance"] = summary["acceptance_by_distance"]
            row["row_forwards_per_token"] = summary["forwards_per_token"]
        result["cases"][name] = row
    best = min((k for k in result["cases"] if k.startswith("registers") and k.endswith("greedy/b1")),
               key=lambda k: result["cases"][k]["s_per_answer"])
    c = result["cases"]
    result["targets"] = {
        "fewer_forwards_ge_1.8x": c["plain/greedy/b1"]["forwards_per_token"] / c[best]["forwards_per_token"] >= 1.8,
        "faster_than_plain_b1": c[best]["time_vs_plain"] < 1.0,
        "faster_than_prompt_lookup_b1": c[best]["time_vs_prompt_lookup"] < 1.0,
        "greedy_exact": all(r.get("same_as_plain_greedy", True) for r in c.values())}
    result["best_greedy_b1"] = best
    result["decode_step"] = decode_step_floor(lm)
    common.emit(result)


if __name__ == "__main__":
    main()
