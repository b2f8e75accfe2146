"""LM data lines -> records (no torch); records become token ids in mutor2d.lm.prompts.

``jsonl`` lines: {"prompt","answer"}, TRL's {"prompt","completion"}, or chat {"messages": [...]} (chat
template; loss only on assistant turns); any line may carry ``"gold"``. A bad line is a one-line DataError.
``gsm8k`` (:func:`gsm8k_record`) and ``math`` (:func:`math_record`): prompt "Question: {q}\\n\\nAnswer:".
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import io
from .accuracy import boxed_answer, gsm8k_answer

ROLES = ("system", "user", "assistant", "tool")
LINE_FORMATS = '{"prompt","answer"}, {"prompt","completion"} or {"messages": [...]}'
RAW_KEYS = {"question": "gsm8k", "problem": "math"}        # a key of a raw dataset line -> its data.name
QA_PROMPT = "Question: {}\n\nAnswer:"                      # the paper's fine-tuning and evaluation prompt


class DataError(ValueError):
    """Bad data; one line naming the file/line and what was expected."""


def read_jsonl(path: str | Path) -> list[tuple[str, dict]]:
    """[("FILE:LINE", object)] of the non-blank lines; DataError for a missing file, a non-object or no lines."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data.path={io.shown_path(path)}: no such file")
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
    if bad := [k for k in keys if not isinstance(rec.get(k), str)]:
        raise DataError(f"{where}: expected string fields {list(keys)}; missing or not a string: {bad}")


def _gold(rec: dict, where: str) -> dict:
    if (gold := rec.get("gold")) is None:
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
    answer = "completion" if "completion" in rec else "answer"
    if answer == "completion" or {"prompt", "answer"} <= rec.keys():
        _strings(rec, ("prompt", answer), where)
        return {"prompt": rec["prompt"], "answer": rec[answer], **_gold(rec, where)}
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
    """MATH / OpenMathInstruct-2 line -> {"prompt", "answer", "gold"}; gold: ``expected_answer`` /
    ``answer``, else the solution's last boxed answer."""
    solution_key = "generated_solution" if "generated_solution" in rec else "solution"
    _strings(rec, ("problem", solution_key), where)
    given = [rec[k] for k in ("expected_answer", "answer") if isinstance(rec.get(k), str) and rec[k].strip()]
    if (gold := given[0] if given else boxed_answer(rec[solution_key])) is None:
        raise DataError(f"{where}: the MATH solution has no \\boxed{{...}} answer and no 'answer' field")
    return {"prompt": QA_PROMPT.format(rec["problem"].strip()), "answer": " " + rec[solution_key].strip(),
            "gold": gold}


OPENMATH_SOURCES = {"math": ("math", "augmented_math"), "gsm": ("gsm8k", "augmented_gsm8k")}


def openmath_records(src: str | Path, split: str) -> list[dict]:
    """OpenMathInstruct-2 lines whose ``problem_source`` is in ``OPENMATH_SOURCES[split]``, via :func:`math_record`."""
    keep = OPENMATH_SOURCES[split]
    if not (located := [(w, r) for w, r in read_jsonl(src) if r.get("problem_source") in keep]):
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


def write_jsonl(records: list[dict], path: str | Path) -> None:
    """One JSON line per record, written atomically (a failed write leaves no partial file)."""
    io.write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
