"""Exact-match accuracy (GSM8K / MATH answers, word paths) of a fine-tuned language model, or of saved outputs.

    python eval/lm_accuracy.py --ckpt RUN [--data FILE.jsonl] [--kind gsm8k|math|path] [--limit N]
        [--max-new-tokens N] [--batch-size B] [--stop TEXT ...] [--out PRED.jsonl] [--decode plain|registers|auto]
    accelerate launch eval/lm_accuracy.py --ckpt RUN --data FILE.jsonl        # each process a share
    python eval/lm_accuracy.py --score PRED.jsonl --kind gsm8k|math|path       # no model

Generation is greedy through the model's own ``generate`` (mutor2d.lm.hf.load_for_inference: LoRA
merged), left-padded batches, stopping at EOS, at a stop string or after --max-new-tokens; with
--decode registers the same tokens come register-drafted (mutor2d.lm.speculative: fewer forwards
per token; auto: registers when the run has them). Each item
goes to PRED.jsonl (index, prompt, output, extracted, gold, correct; default RUN/eval/
predictions_<data>[_stepN].jsonl) as soon as its batch is done: a rerun skips items already there.
A JSON record goes to RUN/eval/ (eval/leaderboard.py shows its accuracy). The last line printed is
one JSON object: {"accuracy", "n", "correct", "no_answer", "kind", ...}. Rules: mutor2d/lm/accuracy.py.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

import yaml

from mutor2d.cli import HelpFormatter          # the command line parses and checks before torch is imported
from mutor2d.engine.entry import run_entry
from mutor2d.lm import accuracy, prompts, records
from mutor2d.sampling.config import decode_modes

DEFAULT_STOP = ["\nQuestion:", "\nProblem:"]
DEFAULT_MAX_NEW_TOKENS = 512


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:5]))
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--ckpt", help="run folder or its step_N/ folder of an LM fine-tuning (train.py, task: lm)")
    mode.add_argument("--score", metavar="PRED.jsonl", help="score saved outputs (lines with output and gold)")
    ap.add_argument("--data", help="jsonl file to evaluate on (lines as in training, with a gold answer: "
                                   "'gold', else the answer / last assistant turn; required with --ckpt)")
    ap.add_argument("--data-name", choices=["jsonl", "gsm8k", "math"], default="jsonl",
                    help="format of --data, as the config's data.name (gsm8k / math: the raw files)")
    ap.add_argument("--kind", choices=accuracy.KINDS,
                    help="answer rules (default: math when --data-name math or the answers hold \\boxed, else gsm8k)")
    ap.add_argument("--limit", type=int, default=0, help="evaluate the first N items only (0 = all)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help=f"generation length limit (default {DEFAULT_MAX_NEW_TOKENS}, or the positions of --ckpt's "
                         "model when it has fewer)")
    ap.add_argument("--batch-size", type=int, default=16, help="prompts per generate call (default 16)")
    ap.add_argument("--stop", action="append", default=None, metavar="TEXT",
                    help=f"stop string, repeatable; \\n is a newline (default {DEFAULT_STOP!r})")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                    help="weights dtype for generation (default float32)")
    ap.add_argument("--out", help="per-item prediction file (default RUN/eval/predictions_<data>[_stepN].jsonl)")
    ap.add_argument("--decode", choices=decode_modes("text"), default="plain",
                    help="plain generate, register-drafted (exact: the same outputs), or auto: registers when the "
                         "run has a register embedding whose objective drafts (default plain)")
    ap.add_argument("--draft", type=int, default=None, metavar="K",
                    help="register drafts per forward (default: the objective's d_max - 1)")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    args.stop = DEFAULT_STOP if args.stop is None else [t.replace("\\n", "\n") for t in args.stop]
    for flag in ("ckpt", "score", "data", "out"):
        if getattr(args, flag) == "":                  # was: no --out written; the current folder as --ckpt
            ap.error(f"--{flag} '': expected a path")
    if args.score and not args.kind:
        ap.error("--score needs --kind gsm8k|math|path")
    if args.ckpt and not args.data:
        ap.error("--ckpt needs --data FILE.jsonl")
    for flag, low in (("draft", 1), ("limit", 0), ("max_new_tokens", 1), ("batch_size", 1)):
        if (value := getattr(args, flag)) is not None and value < low:
            ap.error(f"--{flag.replace('_', '-')} {value}: expected >= {low}")
    check_paths(args)
    return args


def check_paths(args) -> None:
    """One-line ValueErrors: --out naming a folder, --ckpt without a saved model (both before torch is
    imported), --max-new-tokens beyond the positions of --ckpt's model."""
    if args.out and Path(args.out).exists() and not Path(args.out).is_file():
        what = "a folder" if Path(args.out).is_dir() else "a device, pipe or socket"
        raise ValueError(f"--out {args.out}: is {what}; expected the path of the prediction .jsonl file to write")
    if not args.ckpt:
        return
    run_info(Path(args.ckpt))
    from mutor2d.lm.data import model_positions
    positions = model_positions(args.ckpt)
    if args.max_new_tokens is None:                 # the default fits the model
        args.max_new_tokens = min(DEFAULT_MAX_NEW_TOKENS, positions or DEFAULT_MAX_NEW_TOKENS)
    if positions is not None and args.max_new_tokens > positions:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}: expected at most {positions}, the positions of "
                         f"the model in {args.ckpt} (max_position_embeddings, prompt included)")


def run_info(ckpt: Path) -> tuple[Path, dict, int | None]:
    """(run folder, its config as a dict, step) of a run folder or its step_N/ folder."""
    if not (ckpt / "config.json").is_file() and not (ckpt / "adapter_config.json").is_file():
        raise ValueError(f"--ckpt {ckpt}: no saved model (config.json or adapter_config.json) in it")
    m = re.fullmatch(r"step_(\d+)", ckpt.name)
    run_dir = ckpt.parent if m else ckpt
    config = run_dir / "config.yaml"
    cfg = yaml.safe_load(config.read_text()) if config.is_file() else {}
    return run_dir, cfg, int(m.group(1)) if m else (cfg.get("train") or {}).get("max_steps")


def guess_kind(located: list[tuple[str, dict]], data_name: str) -> str:
    if data_name in accuracy.KINDS:
        return data_name
    texts = [r.get("gold", "") + r.get("answer", "") + "".join(m["content"] for m in r.get("messages", []))
             for _, r in located]
    return "math" if any("\\boxed" in t for t in texts) else "gsm8k"


def generate_all(args, located, kind: str, out: Path):
    """This process's share of the items: greedy outputs appended to its part file; once every
    process is done, returns (accelerate's PartialState, the decoding settings of the record)."""
    from accelerate import PartialState
    from mutor2d.lm import drafter, hf
    from mutor2d.sampling.stats import DecodeStats
    state = PartialState()
    tokenizer = hf.load_tokenizer(args.ckpt)
    items = prompts.eval_prompts(located, tokenizer)              # every line checked before the model loads
    mode = drafter.folder_mode(args.decode, args.ckpt)
    registers = drafter.load_registers(args.ckpt, args.draft) if mode == "registers" else None
    model = hf.load_for_inference(args.ckpt, args.dtype).to(state.device)
    stats = DecodeStats()
    accuracy.predict(items, lambda batch: hf.generate(model, tokenizer, [it["prompt_ids"] for it in batch],
                                                      args.max_new_tokens, args.stop, decode=mode,
                                                      registers=registers, stats=stats),
                     out, kind, state.process_index, state.num_processes, args.batch_size)
    state.wait_for_everyone()
    return state, drafter.record_fields(mode, registers, stats)


def evaluate(args) -> dict | None:
    from mutor2d import io
    from mutor2d.lm import hf
    ckpt = Path(args.ckpt)
    run_dir, cfg, step = run_info(ckpt)
    located = records.load_located(args.data_name, args.data)[:args.limit or None]
    kind = args.kind or guess_kind(located, args.data_name)
    suffix = f"_step{step}" if ckpt != run_dir else ""
    out = Path(args.out) if args.out else run_dir / "eval" / f"predictions_{Path(args.data).stem}{suffix}.jsonl"
    with io.exit_on_write_error(str(out)):         # the model's files are read as LMModelError, not OSError
        out.parent.mkdir(parents=True, exist_ok=True)
        state, decoding = generate_all(args, located, kind, out)
        if not state.is_main_process:
            return None
        generation = {"max_new_tokens": args.max_new_tokens, "stop": args.stop, "batch_size": args.batch_size,
                      "prompt_attention": hf.saved_prompt_attention(ckpt), **decoding}
        result, path = accuracy.write_scores(out, len(located), kind, run_dir / "eval", run_config=cfg, step=step,
                                             data=str(args.data), checkpoint=str(ckpt), generation=generation)
    return {**result, "predictions": str(out), "record": str(path)}


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    result = accuracy.score_file(args.score, args.kind) if args.score else evaluate(args)
    if result is None:                           # not the main process
        return None
    print(f"accuracy {result['accuracy']:.4f} ({result['correct']}/{result['n']}, {result['kind']})",
          file=sys.stderr)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    run_entry(main)
