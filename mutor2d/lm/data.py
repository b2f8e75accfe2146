"""``python -m mutor2d.lm.data``: write and check jsonl files for LM fine-tuning and evaluation (no
torch, so the command line answers at once). Converters write {"prompt", "answer", "gold"} lines of
``data.name: jsonl`` (mutor2d.lm.records): gsm8k, math, openmath (the paper's 1M-MATH / 1M-GSM splits
of OpenMathInstruct-2), stargraph (path-star graphs as text, :func:`stargraph_records`), arith
(mutor2d.lm.arith); ``check`` validates a file, with --tokenizer also against the model's positions.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial
from pathlib import Path

from .. import io
from ..cli import HelpFormatter
from . import arith
from .prompts import tokenize
from .records import LOADERS, OPENMATH_SOURCES, DataError, load_located, load_records, openmath_records, write_jsonl


STARGRAPH_FORMATS = ("words", "bn")


def stargraph_records(degree: int, path_len: int, num_nodes: int, count: int, seed: int,
                      fmt: str = "words") -> list[dict]:
    """Star-graph pairs as text: ``words`` (prompt "u v | ... / s g =", answer " s a1 ... g") or ``bn``
    (Bachmann & Nagarajan's "u,v|...|u,v/s,g=", answer "s,a1,...,g")."""
    from ..data.stargraph import NUM_SPECIAL, StarGraphShape, make_graphs
    if fmt not in STARGRAPH_FORMATS:
        raise DataError(f"--format {fmt!r}: expected one of {', '.join(STARGRAPH_FORMATS)}")
    shape = StarGraphShape(degree, path_len, num_nodes)
    prompts, answers = make_graphs(shape, count, seed)
    node = [str(v - NUM_SPECIAL) for v in range(shape.vocab_size)]
    write = _stargraph_words if fmt == "words" else _stargraph_bn
    return [write(p.tolist(), a.tolist(), node) for p, a in zip(prompts, answers)]


def _stargraph_words(prompt: list[int], answer: list[int], node: list[str]) -> dict:
    from ..data.stargraph import ANSWER, EDGE, QUERY
    word = {QUERY: "/", ANSWER: "=", EDGE: "|"}
    text = [word.get(t, node[t]) for t in prompt]
    return {"prompt": " ".join(text), "answer": " " + " ".join(node[t] for t in answer)}


def _stargraph_bn(prompt: list[int], answer: list[int], node: list[str]) -> dict:
    """The prompt tokens are E triples "u v EDGE", then QUERY s g ANSWER (mutor2d.data.stargraph)."""
    edges = [f"{node[prompt[i]]},{node[prompt[i + 1]]}" for i in range(0, len(prompt) - 4, 3)]
    source, goal = node[prompt[-3]], node[prompt[-2]]
    return {"prompt": "|".join(edges) + f"/{source},{goal}=", "answer": ",".join(node[t] for t in answer)}


def check_output(dst: str, src: str | None = None) -> None:
    """DataError (one line) for an output path that is a folder or (resolved) the input file itself."""
    if Path(dst).is_dir():
        raise DataError(f"{dst}: is a folder; expected the path of the jsonl file to write")
    if src is not None and Path(dst).exists() and Path(src).exists() and os.path.samefile(src, dst):
        raise DataError(f"{dst}: is the input file {src} (it would be overwritten by its conversion); "
                        f"expected another output path")


CHECK_CHARS = 16_384        # ``check`` without a model: characters of one line's text (prompt and answer)


def check_file(src: str, name: str, tokenizer: str | None) -> str:
    """``check``: every line valid and within the model's positions (else CHECK_CHARS); a one-line DataError."""
    located = load_located(name, src)
    positions = model_positions(tokenizer) if tokenizer else None
    if positions is None:
        for where, rec in located:
            if (chars := len(json.dumps(rec, ensure_ascii=False))) > CHECK_CHARS:
                raise DataError(f"{where}: {chars} characters, expected at most {CHECK_CHARS} (pass --tokenizer "
                                f"MODEL_FOLDER to check tokens against the model's positions)")
    if not tokenizer:
        return f"{src}: {len(located)} valid lines"
    from .hf import load_tokenizer
    tok, examples = load_tokenizer(tokenizer), []
    for where, rec in located:
        for prompt, answer in tokenize([rec], tok, 10**9, 10**9, where=[where]):
            if positions is not None and len(prompt) + len(answer) > positions:
                raise DataError(f"{where}: prompt and answer of {len(prompt) + len(answer)} tokens, expected at "
                                f"most {positions} (the positions of the model in {tokenizer})")
            examples.append((prompt, answer))
    return f"{src}: {len(located)} valid lines, {len(examples)} training examples"


def model_positions(folder: str | Path) -> int | None:
    """max_position_embeddings from ``folder``'s config.json, else its adapter's base's; None if neither says."""
    config = Path(folder) / "config.json"
    try:
        if not config.is_file():
            base = json.loads((Path(folder) / "adapter_config.json").read_text()).get("base_model_name_or_path")
            config = Path(base) / "config.json"
        return int(json.loads(config.read_text())["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m mutor2d.lm.data", formatter_class=HelpFormatter,
        description="Write and check jsonl files for LM fine-tuning and evaluation. Converters write "
                    '{"prompt", "answer", "gold"} lines (data.name: jsonl); "check" validates a file.')
    sub = ap.add_subparsers(dest="kind", required=True, metavar="{gsm8k,math,openmath,stargraph,arith,check}",
                            help="what to write or check (each takes --help)",
                            parser_class=partial(argparse.ArgumentParser, formatter_class=HelpFormatter))
    for name, what in (("gsm8k", 'GSM8K {"question", "answer"} lines (gold: the "#### N" number)'),
                       ("math", 'MATH {"problem", "solution"} lines (gold: "answer", else the last \\boxed{})')):
        p = sub.add_parser(name, help=f"convert {what}",
                           description=f"Convert {what} into prompt/answer/gold lines (data.name: jsonl). "
                                       "No options: the input file is read as is.")
        p.add_argument("src", help="input jsonl file")
        p.add_argument("dst", help="output jsonl file (overwritten; not the input file)")
    o = sub.add_parser("openmath", help="the paper's 1M-MATH or 1M-GSM split of OpenMathInstruct-2",
                       description="Keep the OpenMathInstruct-2 lines of one problem source (math: math and "
                                   "augmented_math; gsm: gsm8k and augmented_gsm8k) and convert them as 'math' does.")
    o.add_argument("src", help="OpenMathInstruct-2 jsonl (e.g. its train_1M split saved as jsonl)")
    o.add_argument("dst", help="output jsonl file (overwritten; not the input file)")
    o.add_argument("--split", choices=sorted(OPENMATH_SOURCES), default="math",
                   help="which problems to keep (default math)")
    s = sub.add_parser("stargraph", help="write path-star graph pairs (words = node ids)",
                       description="Write path-star graph prompt/answer pairs.")
    s.add_argument("dst", help="output jsonl file (overwritten)")
    s.add_argument("--format", choices=STARGRAPH_FORMATS, default="words",
                   help='words: "u v | ... / s g =" -> " s a1 ... g"; bn: Bachmann & Nagarajan\'s '
                        '"u,v|...|u,v/s,g=" -> "s,a1,...,g" (default words)')
    for flag, default, what in (("--degree", 2, "arms per graph"), ("--path-len", 5, "nodes per arm"),
                                ("--num-nodes", 50, "node ids to draw from"), ("--count", 1000, "pairs"),
                                ("--seed", 0, "random seed")):
        s.add_argument(flag, type=int, default=default, help=f"{what} (default {default})")
    a = sub.add_parser("arith", help="write synthetic arithmetic word problems (GSM8K lines; mutor2d.lm.arith)",
                       description='Write multi-step arithmetic word problems as GSM8K {"question", "answer"} '
                                   "lines (read them with data.name: gsm8k).")
    a.add_argument("dst", help="output jsonl file (overwritten)")
    a.add_argument("--steps", type=int, nargs="+", default=[2], help="changes per problem, cycled (default 2)")
    for flag, default, what in (("--count", 1000, "problems"), ("--seed", 0, "random seed"),
                                ("--max-value", 20, "largest count"), ("--max-change", 9, "largest change")):
        a.add_argument(flag, type=int, default=default, help=f"{what} (default {default})")
    c = sub.add_parser("check", help="validate every line of a file (and, with --tokenizer, tokenize it)",
                       description="Validate every line; exit 2 with a one-line error naming the first bad line.")
    c.add_argument("src", help="jsonl file")
    c.add_argument("--name", choices=list(LOADERS), default="jsonl",
                   help="the file's format (data.name; default jsonl)")
    c.add_argument("--tokenizer", default=None,
                   help="local tokenizer folder: also render chat lines and tokenize, as training does, "
                        "each example at most the positions of the model in it (config.json) (default: check "
                        f"the lines only, each at most {CHECK_CHARS} characters)")
    return ap


def check_generator_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--count, --seed, stargraph's --num-nodes and arith's --steps: one-line errors naming the flag."""
    from ..data.config import STARGRAPH_GRAPHS_LIMIT, STARGRAPH_NODES_LIMIT
    if not 1 <= args.count <= STARGRAPH_GRAPHS_LIMIT:
        ap.error(f"--count {args.count}: expected 1..{STARGRAPH_GRAPHS_LIMIT}")
    if args.seed < 0:
        ap.error(f"--seed {args.seed}: expected an integer >= 0")
    if args.kind == "stargraph" and args.num_nodes > STARGRAPH_NODES_LIMIT:
        ap.error(f"--num-nodes {args.num_nodes}: expected at most {STARGRAPH_NODES_LIMIT}")
    if args.kind == "arith" and not 1 <= min(args.steps) <= max(args.steps) <= arith.STEPS_LIMIT:
        ap.error(f"--steps {' '.join(map(str, args.steps))}: expected step counts 1..{arith.STEPS_LIMIT}")


def run(args: argparse.Namespace) -> str:
    if args.kind == "check":
        return check_file(args.src, args.name, args.tokenizer)
    check_output(args.dst, getattr(args, "src", None))
    if args.kind == "stargraph":
        records = stargraph_records(args.degree, args.path_len, args.num_nodes, args.count, args.seed, args.format)
    elif args.kind == "arith":
        records = arith.arith_records(args.count, args.steps, args.seed, args.max_value, args.max_change)
    elif args.kind == "openmath":
        records = openmath_records(args.src, args.split)
    else:
        records = load_records(args.kind, args.src)
    with io.exit_on_write_error(args.dst):
        write_jsonl(records, args.dst)
    return f"wrote {len(records)} records to {args.dst}"


def main(argv: list[str] | None = None) -> None:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.kind in ("stargraph", "arith"):
        check_generator_args(ap, args)
    try:
        print(run(args))
    except ValueError as e:          # DataError, LMModelError
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    from ..preempt import exit_on_ctrl_c
    exit_on_ctrl_c()        # python -m: a Ctrl-C mid-way is one line, exit 130
    main()
