"""Text data for LM fine-tuning and evaluation: jsonl lines -> (prompt, answer) token ids
(batched by mutor2d.lm.packing.collate). Light: no torch, so its command line answers at once.

Line formats of ``data.name: jsonl`` (recognised per line; each line is checked before any model loads,
a bad one is a one-line DataError naming file, line and the problem):

* ``{"prompt": str, "answer": str}`` and TRL's ``{"prompt": str, "completion": str}``: the prompt is
  tokenized with the tokenizer's special tokens (BOS), the answer without, plus EOS when ``add_eos``;
* chat ``{"messages": [{"role", "content"}, ...]}`` (and TRL's conversational ``{"prompt": [...],
  "completion": [...]}``): rendered with the tokenizer's chat template, which must exist. Loss only on
  assistant turns: each assistant turn (of the completion, for prompt/completion) is one example whose
  prompt is the rendered conversation before it (with the generation prompt) and whose answer is the
  rest of the rendering up to the end of that turn (the template's end-of-turn marks the end; no EOS
  is added). The template must render each earlier part as a prefix of the whole;
* any line may carry ``"gold"``: the final answer that eval/lm_accuracy.py compares with.

``gsm8k``: GSM8K's {"question", "answer"} lines -> prompt "Question: {q}\\n\\nAnswer:", answer " {a}",
gold = the ``#### N`` number (:func:`gsm8k_record`). ``math``: MATH's {"problem", "solution"} lines (or
OpenMathInstruct-2's {"problem", "generated_solution", "expected_answer"}) -> the same prompt form,
answer " {solution}", gold = the answer field, else the last ``\\boxed{}`` (:func:`math_record`).
Over-long prompts keep their last tokens, over-long answers their first. ``python -m mutor2d.lm.data
--help`` lists the converters (gsm8k, math, openmath, stargraph, arith) and ``check``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .. import io
from ..cli import HelpFormatter
from .accuracy import boxed_answer, gsm8k_answer

ROLES = ("system", "user", "assistant", "tool")
LINE_FORMATS = '{"prompt","answer"}, {"prompt","completion"} or {"messages": [...]}'
RAW_KEYS = {"question": "gsm8k", "problem": "math"}        # a key of a raw dataset line -> its data.name
QA_PROMPT = "Question: {}\n\nAnswer:"                      # the paper's fine-tuning and evaluation prompt


class DataError(ValueError):
    """Bad data; one line naming the file/line and what was expected."""


def read_jsonl(path: str | Path) -> list[tuple[str, dict]]:
    """[("FILE:LINE", object)] of the non-blank lines; DataError for a missing file, a line that is
    not a JSON object, or no lines."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data.path={str(path)!r}: no such file")
    lines = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{path}:{n}: expected a JSON object, got {type(rec).__name__}")
        lines.append((f"{path}:{n}", rec))
    if not lines:
        raise DataError(f"{path}: no records")
    return lines


def _strings(rec: dict, keys: tuple[str, ...], where: str) -> None:
    bad = [k for k in keys if not isinstance(rec.get(k), str)]
    if bad:
        raise DataError(f"{where}: expected string fields {list(keys)}; missing or not a string: {bad}")


def _gold(rec: dict, where: str) -> dict:
    gold = rec.get("gold")
    if gold is None:
        return {}
    if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
        raise DataError(f"{where}: 'gold' must be a string or a number, got {gold!r}")
    return {"gold": str(gold)}


def _messages(value, where: str, field: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: '{field}' must be a non-empty list of {{role, content}} objects")
    for k, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: {field}[{k}] must be {{\"role\": one of {list(ROLES)}, "
                            f"\"content\": str}}, got {m!r:.80}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def jsonl_record(rec: dict, where: str) -> dict:
    """A line of any jsonl format -> {"prompt", "answer"} or {"messages", "train_from"} (+ "gold")."""
    if "messages" in rec:
        return {"messages": _messages(rec["messages"], where, "messages"), "train_from": 0, **_gold(rec, where)}
    if "completion" in rec and isinstance(rec.get("prompt"), list):
        prompt = _messages(rec["prompt"], where, "prompt")
        return {"messages": prompt + _messages(rec["completion"], where, "completion"),
                "train_from": len(prompt), **_gold(rec, where)}
    if "completion" in rec:
        _strings(rec, ("prompt", "completion"), where)
        return {"prompt": rec["prompt"], "answer": rec["completion"], **_gold(rec, where)}
    if "prompt" in rec and "answer" in rec:
        _strings(rec, ("prompt", "answer"), where)
        return {"prompt": rec["prompt"], "answer": rec["answer"], **_gold(rec, where)}
    hint = "".join(f" (raw {name} lines: data.name {name})" for key, name in RAW_KEYS.items() if key in rec)
    raise DataError(f"{where}: expected {LINE_FORMATS}, got keys {sorted(rec)}{hint}")


def gsm8k_record(rec: dict, where: str = "gsm8k record") -> dict:
    """GSM8K {"question", "answer"} -> {"prompt", "answer", "gold"} (gold: the ``#### N`` number)."""
    _strings(rec, ("question", "answer"), where)
    if "####" not in rec["answer"] or gsm8k_answer(rec["answer"]) is None:
        raise DataError(f"{where}: the GSM8K answer has no '#### N' final-answer line")
    return {"prompt": QA_PROMPT.format(rec["question"].strip()), "answer": " " + rec["answer"].strip(),
            "gold": gsm8k_answer(rec["answer"])}


def math_record(rec: dict, where: str = "MATH record") -> dict:
    """MATH {"problem", "solution"} or OpenMathInstruct-2 {"problem", "generated_solution"} -> {"prompt",
    "answer", "gold"}; gold: the line's ``expected_answer`` or ``answer`` string, else the solution's
    last boxed answer. The prompt is GSM8K's (``QA_PROMPT``), as the paper formats both."""
    solution_key = "generated_solution" if "generated_solution" in rec else "solution"
    _strings(rec, ("problem", solution_key), where)
    given = [rec[k] for k in ("expected_answer", "answer") if isinstance(rec.get(k), str) and rec[k].strip()]
    gold = given[0] if given else boxed_answer(rec[solution_key])
    if gold is None:
        raise DataError(f"{where}: the MATH solution has no \\boxed{{...}} answer and no 'answer' field")
    return {"prompt": QA_PROMPT.format(rec["problem"].strip()), "answer": " " + rec[solution_key].strip(),
            "gold": gold}


OPENMATH_SOURCES = {"math": ("math", "augmented_math"), "gsm": ("gsm8k", "augmented_gsm8k")}


def openmath_records(src: str | Path, split: str) -> list[dict]:
    """The paper's 1M-MATH / 1M-GSM splits: OpenMathInstruct-2 lines whose ``problem_source`` is one of
    ``OPENMATH_SOURCES[split]``, converted by :func:`math_record`."""
    keep = OPENMATH_SOURCES[split]
    located = [(w, r) for w, r in read_jsonl(src) if r.get("problem_source") in keep]
    if not located:
        raise DataError(f"{src}: no line has problem_source in {list(keep)} (OpenMathInstruct-2 lines expected)")
    return [math_record(rec, where) for where, rec in located]


LOADERS = {"jsonl": jsonl_record, "gsm8k": gsm8k_record, "math": math_record}


def load_located(name: str, path: str | Path) -> list[tuple[str, dict]]:
    """[("FILE:LINE", record)] with every line checked."""
    if name not in LOADERS:
        raise DataError(f"data.name={name!r}: expected one of {', '.join(LOADERS)}")
    return [(where, LOADERS[name](rec, where)) for where, rec in read_jsonl(path)]


def load_records(name: str, path: str | Path) -> list[dict]:
    return [rec for _, rec in load_located(name, path)]


def check_chat_template(tokenizer, where: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{where}: chat lines need a tokenizer with a chat template; "
                        f"{getattr(tokenizer, 'name_or_path', '') or 'this tokenizer'!s} has none")


def chat_prompt(messages: list[dict], tokenizer) -> str:
    """The rendered conversation ``messages`` followed by the assistant's generation prompt."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def render(rec: dict, tokenizer, where: str) -> list[tuple[str, str, bool]]:
    """A record -> [(prompt text, answer text, templated)]; chat records give one per trained
    assistant turn (templated: the text carries its special tokens)."""
    if "messages" not in rec:
        return [(rec["prompt"], rec["answer"], False)]
    check_chat_template(tokenizer, where)
    messages = rec["messages"]
    turns = [k for k, m in enumerate(messages) if m["role"] == "assistant" and k >= rec["train_from"]]
    if not turns:
        raise DataError(f"{where}: no assistant turn to train on")
    out = []
    for k in turns:
        prompt = chat_prompt(messages[:k], tokenizer)
        full = tokenizer.apply_chat_template(messages[:k + 1], tokenize=False)
        if not full.startswith(prompt):
            raise DataError(f"{where}: the chat template does not render the turns before assistant "
                            f"turn {k} as a prefix of the conversation; cannot mask the loss")
        out.append((prompt, full[len(prompt):], True))
    return out


def encode_prompt(text: str, tokenizer, templated: bool) -> list[int]:
    """Prompt ids: with the tokenizer's special tokens, unless the text is a rendered chat template."""
    return tokenizer(text, add_special_tokens=not templated)["input_ids"]


def tokenize(records: list[dict], tokenizer, max_prompt_len: int, max_answer_len: int,
             add_eos: bool = True, where: list[str] | None = None) -> list[tuple[list[int], list[int]]]:
    """-> [(prompt ids, answer ids)]; raises DataError for an empty prompt or a < 2 token answer.
    ``where``: the "FILE:LINE" of each record, for messages."""
    out = []
    eos = [tokenizer.eos_token_id] if add_eos and tokenizer.eos_token_id is not None else []
    for n, rec in enumerate(records):
        at = where[n] if where else f"record {n}"
        for prompt_text, answer_text, templated in render(rec, tokenizer, at):
            prompt = encode_prompt(prompt_text, tokenizer, templated)[-max_prompt_len:]
            answer = tokenizer(answer_text, add_special_tokens=False)["input_ids"]
            answer = (answer + ([] if templated else eos))[:max_answer_len]
            if len(prompt) < 1 or len(answer) < 2:
                raise DataError(f"{at}: prompt/answer of {len(prompt)}/{len(answer)} tokens, "
                                "expected >= 1 / >= 2")
            out.append((prompt, answer))
    return out


def eval_prompts(located: list[tuple[str, dict]], tokenizer) -> list[dict]:
    """Evaluation items: {"prompt" text, "prompt_ids", "gold"} per record. A chat record is asked its
    conversation before its last assistant turn (or all of it, when it ends with no assistant turn);
    gold: the "gold" field, else the answer / last assistant turn (a solution text is allowed)."""
    items = []
    for where, rec in located:
        if "messages" in rec:
            check_chat_template(tokenizer, where)
            messages = rec["messages"]
            last = max((k for k, m in enumerate(messages) if m["role"] == "assistant"), default=len(messages))
            prompt, templated = chat_prompt(messages[:last], tokenizer), True
            gold = rec.get("gold", messages[last]["content"] if last < len(messages) else None)
        else:
            prompt, templated, gold = rec["prompt"], False, rec.get("gold", rec["answer"])
        if gold is None:
            raise DataError(f"{where}: no gold answer (add a 'gold' field or a final assistant turn)")
        items.append({"prompt": prompt, "prompt_ids": encode_prompt(prompt, tokenizer, templated), "gold": gold})
    return items


def _offline_tokenizer(symbols: list[str], split, decoder, model_max_length: int):
    """A WordLevel PreTrainedTokenizerFast: specials <pad>=0, <bos>=1, <eos>=2, <unk>=3, then one id per
    symbol (sorted); ``split`` cuts text into symbols, ``decoder`` joins them (None: with single
    spaces); BOS is prepended to prompts."""
    from tokenizers import Tokenizer, models, processors
    from transformers import PreTrainedTokenizerFast
    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(set(symbols)))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer, tk.decoder = split, decoder
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>", model_max_length=model_max_length)


def char_tokenizer(chars: str, model_max_length: int = 4096):
    """An offline character-level tokenizer: one id per character of ``chars`` (after the specials
    of :func:`_offline_tokenizer`)."""
    from tokenizers import Regex, decoders, pre_tokenizers
    every_character = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")    # newlines too
    return _offline_tokenizer(list(chars), every_character, decoders.Fuse(), model_max_length)


def word_tokenizer(words: list[str], model_max_length: int = 4096):
    """An offline word-level tokenizer: one id per word of ``words`` (text is split at whitespace,
    which is dropped; decoding joins the words with single spaces)."""
    from tokenizers import pre_tokenizers
    return _offline_tokenizer(words, pre_tokenizers.WhitespaceSplit(), None, model_max_length)


STARGRAPH_FORMATS = ("words", "bn")


def stargraph_records(degree: int, path_len: int, num_nodes: int, count: int, seed: int,
                      fmt: str = "words") -> list[dict]:
    """Star-graph pairs as text (node ids as numbers), in one of two formats:

    * ``words``: prompt "u v | ... / s g =", answer " s a1 ... g" (one word per node or delimiter);
    * ``bn``: Bachmann & Nagarajan's own text, prompt "u,v|u,v|...|u,v/s,g=", answer "s,a1,...,g"
      (through a BPE tokenizer such as GPT-2's the commas are tokens, so register offsets count
      tokens, not nodes)."""
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
    """DataError (one line) for an output path that is a folder or the input file itself (resolved:
    the same file through a symlink or hard link too), which the conversion would destroy."""
    if Path(dst).is_dir():
        raise DataError(f"{dst}: is a folder; expected the path of the jsonl file to write")
    if src is not None and Path(dst).exists() and Path(src).exists() and os.path.samefile(src, dst):
        raise DataError(f"{dst}: is the input file {src} (it would be overwritten by its conversion); "
                        f"expected another output path")


CHECK_CHARS = 16_384        # ``check`` without a model: characters of one line's text (prompt and answer)


def check_file(src: str, name: str, tokenizer: str | None) -> str:
    """``check``: every line valid and not too long: at most the positions of the model in the
    --tokenizer folder (its config.json's max_position_embeddings) in tokens, else CHECK_CHARS
    characters; a one-line DataError naming the first bad line."""
    located = load_located(name, src)
    positions = model_positions(tokenizer) if tokenizer else None
    if positions is None:
        for where, rec in located:
            chars = len(json.dumps(rec, ensure_ascii=False))
            if chars > CHECK_CHARS:
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
    """max_position_embeddings of the model in ``folder``: its config.json, else that of the base model
    its adapter_config.json names (relative paths from the working directory); None when neither says."""
    config = Path(folder) / "config.json"
    try:
        if not config.is_file():
            base = json.loads((Path(folder) / "adapter_config.json").read_text()).get("base_model_name_or_path")
            config = Path(base) / "config.json"
        return int(json.loads(config.read_text())["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_jsonl(records: list[dict], path: str | Path) -> None:
    """One JSON line per record, written atomically (a failed write leaves no partial file)."""
    io.write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in records))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m mutor2d.lm.data", formatter_class=HelpFormatter,
        description="Write and check jsonl files for LM fine-tuning and evaluation. Converters write "
                    '{"prompt", "answer", "gold"} lines (data.name: jsonl); "check" validates a file.')
    sub = ap.add_subparsers(dest="kind", required=True, metavar="{gsm8k,math,openmath,stargraph,arith,check}",
                            help="what to write or check (each takes --help)")
    for name, what in (("gsm8k", 'GSM8K {"question", "answer"} lines (gold: the "#### N" number)'),
                       ("math", 'MATH {"problem", "solution"} lines (gold: "answer", else the last \\boxed{})')):
        p = sub.add_parser(name, help=f"convert {what}", formatter_class=HelpFormatter,
                           description=f"Convert {what} into prompt/answer/gold lines (data.name: jsonl). "
                                       "No options: the input file is read as is.")
        p.add_argument("src", help="input jsonl file")
        p.add_argument("dst", help="output jsonl file (overwritten; not the input file)")
    o = sub.add_parser("openmath", help="the paper's 1M-MATH or 1M-GSM split of OpenMathInstruct-2",
                       formatter_class=HelpFormatter,
                       description="Keep the OpenMathInstruct-2 lines of one problem source (math: math and "
                                   "augmented_math; gsm: gsm8k and augmented_gsm8k) and convert them as 'math' does.")
    o.add_argument("src", help="OpenMathInstruct-2 jsonl (e.g. its train_1M split saved as jsonl)")
    o.add_argument("dst", help="output jsonl file (overwritten; not the input file)")
    o.add_argument("--split", choices=sorted(OPENMATH_SOURCES), default="math",
                   help="which problems to keep (default math)")
    s = sub.add_parser("stargraph", help="write path-star graph pairs (words = node ids)",
                       formatter_class=HelpFormatter,
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
                       formatter_class=HelpFormatter,
                       description='Write multi-step arithmetic word problems as GSM8K {"question", "answer"} '
                                   "lines (read them with data.name: gsm8k).")
    a.add_argument("dst", help="output jsonl file (overwritten)")
    a.add_argument("--steps", type=int, nargs="+", default=[2], help="changes per problem, cycled (default 2)")
    for flag, default, what in (("--count", 1000, "problems"), ("--seed", 0, "random seed"),
                                ("--max-value", 20, "largest count"), ("--max-change", 9, "largest change")):
        a.add_argument(flag, type=int, default=default, help=f"{what} (default {default})")
    c = sub.add_parser("check", help="validate every line of a file (and, with --tokenizer, tokenize it)",
                       formatter_class=HelpFormatter,
                       description="Validate every line; exit 2 with a one-line error naming the first bad line.")
    c.add_argument("src", help="jsonl file")
    c.add_argument("--name", choices=list(LOADERS), default="jsonl",
                   help="the file's format (data.name; default jsonl)")
    c.add_argument("--tokenizer", default=None,
                   help="local tokenizer folder: also render chat lines and tokenize, as training does, "
                        "each example at most the positions of the model in it (config.json) (default: check "
                        f"the lines only, each at most {CHECK_CHARS} characters)")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.kind in ("stargraph", "arith"):
        check_generator_args(ap, args)
    return args


def check_generator_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--count, --seed, stargraph's --num-nodes and arith's --steps: one-line errors naming the flag."""
    from ..data.config import STARGRAPH_GRAPHS_LIMIT, STARGRAPH_NODES_LIMIT
    from .arith import STEPS_LIMIT
    if not 1 <= args.count <= STARGRAPH_GRAPHS_LIMIT:
        ap.error(f"--count {args.count}: expected 1..{STARGRAPH_GRAPHS_LIMIT}")
    if args.seed < 0:
        ap.error(f"--seed {args.seed}: expected an integer >= 0")
    if args.kind == "stargraph" and args.num_nodes > STARGRAPH_NODES_LIMIT:
        ap.error(f"--num-nodes {args.num_nodes}: expected at most {STARGRAPH_NODES_LIMIT}")
    if args.kind == "arith" and not 1 <= min(args.steps) <= max(args.steps) <= STEPS_LIMIT:
        ap.error(f"--steps {' '.join(map(str, args.steps))}: expected step counts 1..{STEPS_LIMIT}")


def run(args: argparse.Namespace) -> str:
    if args.kind != "check":
        check_output(args.dst, getattr(args, "src", None))
    if args.kind == "stargraph":
        records = stargraph_records(args.degree, args.path_len, args.num_nodes, args.count, args.seed, args.format)
    elif args.kind == "arith":
        from .arith import arith_records
        records = arith_records(args.count, args.steps, args.seed, args.max_value, args.max_change)
    elif args.kind == "openmath":
        records = openmath_records(args.src, args.split)
    elif args.kind == "check":
        return check_file(args.src, args.name, args.tokenizer)
    else:
        records = load_records(args.kind, args.src)
    try:
        write_jsonl(records, args.dst)
    except OSError as e:             # disk full, read-only folder, a file where a folder should be
        why = "no space left on the device" if io.is_disk_full(e) else (e.strerror or str(e))
        print(f"error: could not write {args.dst} ({why}); no partial file is left", file=sys.stderr)
        raise SystemExit(74 if io.is_disk_full(e) else 2) from None
    return f"wrote {len(records)} records to {args.dst}"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        print(run(args))
    except ValueError as e:          # DataError, LMModelError
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
