"""A small randomly initialised Llama with a character tokenizer, written as a local model folder: the
language path's offline starting point (nothing downloads), used by the README's first run and the
CPU studies.

    python -m mutor2d.lm.tiny models/tiny-llama [--hidden 64] [--layers 2] [--heads 4] [--seed 0]
    python -m mutor2d.lm.tiny models/tiny-gpt2 --arch gpt2 --chars "0123456789,|/="   # star graphs, B&N text

The tokenizer has one id per character (default: those of the synthetic arithmetic problems,
``mutor2d.lm.arith``) after <pad>=0, <bos>=1, <eos>=2, <unk>=3; the model is ``LlamaForCausalLM`` with
an MLP 4x the width, or ``GPT2LMHeadModel`` (learned absolute positions, the star graph's family).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .arith import arith_alphabet
from .offline_tokenizers import char_tokenizer

DEFAULT_POSITIONS = 256    # positions of a tiny model (prompt and answer together)


def write_tiny_llama(folder: str | Path, tokenizer=None, hidden: int = 64, layers: int = 2, heads: int = 4,
                     seed: int = 0, max_positions: int = DEFAULT_POSITIONS, init_std: float = 0.02) -> Path:
    """Write the model (``seed``, std ``init_std``) and ``tokenizer`` (default: arithmetic characters) to ``folder``."""
    from transformers import LlamaConfig, LlamaForCausalLM
    tok = char_tokenizer(arith_alphabet()) if tokenizer is None else tokenizer
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=max_positions, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                         initializer_range=init_std)
    return _write(folder, LlamaForCausalLM, config, tok, seed)


def write_tiny_gpt2(folder: str | Path, tokenizer, hidden: int = 64, layers: int = 2, heads: int = 4,
                    seed: int = 0, max_positions: int = DEFAULT_POSITIONS) -> Path:
    """A GPT-2 of that size with ``tokenizer`` in ``folder`` (kept if it already holds a model)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=hidden, n_layer=layers, n_head=heads,
                        n_positions=max_positions, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return _write(folder, GPT2LMHeadModel, config, tokenizer, seed)


def _write(folder: str | Path, model_class, config, tokenizer, seed: int) -> Path:
    """``model_class(config)`` initialised from ``seed``, and ``tokenizer``, into ``folder`` (kept if full)."""
    import torch
    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(seed)
    model_class(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


POSITIONS_LIMIT = 1 << 20   # longest sequence of a character model: a million characters
PARAMS_LIMIT = 10 ** 9      # weights of a "tiny" model: 4 GB of float32 (16 hidden^2 a layer, plus GPT-2's positions)


def build_parser() -> argparse.ArgumentParser:
    from ..cli import HelpFormatter
    ap = argparse.ArgumentParser(prog="python -m mutor2d.lm.tiny", description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("out", help="model folder to write (kept if it already holds a model)")
    ap.add_argument("--arch", choices=("llama", "gpt2"), default="llama", help="model family (default llama)")
    ap.add_argument("--chars", default=None, help="the tokenizer's characters (default: the arithmetic problems')")
    for flag, default, what in (("--hidden", 64, "width"), ("--layers", 2, "decoder layers"),
                                ("--heads", 4, "attention heads"), ("--seed", 0, "initialisation seed"),
                                ("--max-positions", DEFAULT_POSITIONS, "longest prompt + answer in tokens")):
        ap.add_argument(flag, type=int, default=default, help=what)
    return ap


def check_args(args: argparse.Namespace) -> None:
    """Sizes, seed and folder: one-line errors naming the flag, before torch is imported."""
    for flag in ("hidden", "layers", "heads", "max_positions"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"error: --{flag.replace('_', '-')} {getattr(args, flag)}: expected >= 1")
    if args.seed < 0:
        raise SystemExit(f"error: --seed {args.seed}: expected >= 0")
    if args.hidden % args.heads:
        raise SystemExit(f"error: --hidden {args.hidden} is not divisible by --heads {args.heads}")
    if args.max_positions > POSITIONS_LIMIT:
        raise SystemExit(f"error: --max-positions {args.max_positions}: expected at most {POSITIONS_LIMIT}")
    params = args.layers * 16 * args.hidden ** 2 + args.max_positions * args.hidden * (args.arch == "gpt2")
    if params > PARAMS_LIMIT:
        raise SystemExit(f"error: --hidden {args.hidden} --layers {args.layers} --max-positions {args.max_positions}: "
                         f"about {params:.3g} parameters; expected at most {PARAMS_LIMIT:.0e}")
    if not args.out or (Path(args.out).exists() and not Path(args.out).is_dir()):
        raise SystemExit(f"error: out {args.out!r}: expected the path of a model folder (a new or existing folder)")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    check_args(args)
    write = write_tiny_gpt2 if args.arch == "gpt2" else write_tiny_llama
    folder = write(args.out, char_tokenizer(args.chars or arith_alphabet()), args.hidden, args.layers, args.heads,
                   args.seed, args.max_positions)
    print(f"wrote {folder} ({'GPT-2' if args.arch == 'gpt2' else 'Llama'}, {args.layers} layers x {args.hidden}, "
          f"character tokenizer)")


if __name__ == "__main__":
    from ..preempt import exit_on_ctrl_c
    exit_on_ctrl_c()        # python -m: a Ctrl-C mid-way is one line, exit 130
    main()
