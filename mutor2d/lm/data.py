"""Text data for LM fine-tuning: jsonl (prompt, answer) pairs -> token ids -> LMBatch.

Formats. ``jsonl``: one {"prompt": str, "answer": str} object per line. ``gsm8k``: GSM8K's own
{"question": str, "answer": str} lines, turned into prompt "Question: {q}\\nAnswer:" and answer
" {a}" by :func:`gsm8k_record`. The prompt is tokenized with the tokenizer's special tokens (BOS),
the answer without, plus EOS when ``add_eos``; over-long prompts keep their last tokens, over-long
answers their first. ``python -m mutor2d.lm.data gsm8k IN OUT`` converts a GSM8K file;
``python -m mutor2d.lm.data stargraph OUT --count N`` writes star-graph pairs (words = node ids).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from .packing import LMBatch


class DataError(ValueError):
    """Bad data; one line naming the file/line and what was expected."""


def read_jsonl(path: str | Path, keys: tuple[str, str] = ("prompt", "answer")) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data.path={str(path)!r}: no such file")
    records = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict) or not all(isinstance(rec.get(k), str) for k in keys):
            raise DataError(f"{path}:{n}: expected an object with string fields {keys}")
        records.append(rec)
    if not records:
        raise DataError(f"{path}: no records")
    return records


def gsm8k_record(rec: dict) -> dict:
    """GSM8K {"question", "answer"} -> {"prompt", "answer"}."""
    return {"prompt": f"Question: {rec['question'].strip()}\nAnswer:", "answer": " " + rec["answer"].strip()}


LOADERS = {
    "jsonl": lambda path: read_jsonl(path),
    "gsm8k": lambda path: [gsm8k_record(r) for r in read_jsonl(path, ("question", "answer"))],
}


def load_records(name: str, path: str | Path) -> list[dict]:
    if name not in LOADERS:
        raise DataError(f"data.name={name!r}: expected one of {', '.join(LOADERS)}")
    return LOADERS[name](path)


def tokenize(records: list[dict], tokenizer, max_prompt_len: int, max_answer_len: int,
             add_eos: bool = True) -> list[tuple[list[int], list[int]]]:
    """-> [(prompt ids, answer ids)]; raises DataError for an empty prompt or a < 2 token answer."""
    out = []
    eos = [tokenizer.eos_token_id] if add_eos and tokenizer.eos_token_id is not None else []
    for n, rec in enumerate(records):
        prompt = tokenizer(rec["prompt"], add_special_tokens=True)["input_ids"][-max_prompt_len:]
        answer = (tokenizer(rec["answer"], add_special_tokens=False)["input_ids"] + eos)[:max_answer_len]
        if len(prompt) < 1 or len(answer) < 2:
            raise DataError(f"record {n}: prompt/answer of {len(prompt)}/{len(answer)} tokens, "
                            "expected >= 1 / >= 2")
        out.append((prompt, answer))
    return out


def collate(examples: list[tuple[list[int], list[int]]], pad_id: int = 0) -> LMBatch:
    """Right-pad prompts and answers into an LMBatch."""
    P = torch.tensor([len(p) for p, _ in examples])
    N = torch.tensor([len(a) for _, a in examples])
    prompt = torch.full((len(examples), int(P.max())), pad_id, dtype=torch.long)
    answer = torch.full((len(examples), int(N.max())), pad_id, dtype=torch.long)
    for b, (p, a) in enumerate(examples):
        prompt[b, :len(p)] = torch.tensor(p)
        answer[b, :len(a)] = torch.tensor(a)
    return LMBatch(prompt, P, answer, N)


def char_tokenizer(chars: str, model_max_length: int = 4096):
    """An offline character-level PreTrainedTokenizerFast: one id per character of ``chars`` after
    the specials <pad>=0, <bos>=1, <eos>=2, <unk>=3; BOS is prepended to prompts."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(set(chars)))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>", model_max_length=model_max_length)


def stargraph_records(degree: int, path_len: int, num_nodes: int, count: int, seed: int) -> list[dict]:
    """Star-graph pairs as text: prompt "u v | ... / s g =", answer " s a1 ... g" (node ids)."""
    from ..stargraph import ANSWER, EDGE, QUERY, StarGraphShape, make_graphs
    from ..stargraph import NUM_SPECIAL
    prompts, answers = make_graphs(StarGraphShape(degree, path_len, num_nodes), count, seed)
    word = {QUERY: "/", ANSWER: "=", EDGE: "|"}

    def text(tokens):
        return " ".join(word.get(int(t), str(int(t) - NUM_SPECIAL)) for t in tokens)
    return [{"prompt": text(p), "answer": " " + text(a)} for p, a in zip(prompts, answers)]


def write_jsonl(records: list[dict], path: str | Path) -> None:
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in records))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Write {prompt, answer} jsonl files for LM fine-tuning.")
    sub = ap.add_subparsers(dest="kind", required=True)
    g = sub.add_parser("gsm8k", help="convert GSM8K question/answer lines")
    g.add_argument("src")
    g.add_argument("dst")
    s = sub.add_parser("stargraph", help="write star-graph pairs")
    s.add_argument("dst")
    for flag, default in (("--degree", 2), ("--path-len", 5), ("--num-nodes", 50), ("--count", 1000), ("--seed", 0)):
        s.add_argument(flag, type=int, default=default)
    args = ap.parse_args(argv)
    try:
        if args.kind == "gsm8k":
            records = load_records("gsm8k", args.src)
        else:
            records = stargraph_records(args.degree, args.path_len, args.num_nodes, args.count, args.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    write_jsonl(records, args.dst)
    print(f"wrote {len(records)} records to {args.dst}")


if __name__ == "__main__":
    main()
