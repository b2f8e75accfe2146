"""Final-answer extraction and exact-match accuracy for GSM8K- and MATH-style outputs and word paths (pure Python).

gsm8k: the number on the last ``#### N`` line, else the text's last number, canonical (``$1,200.00`` -> ``1200``).
math: the last ``\\boxed{...}`` / ``\\fbox{...}``, normalised (:func:`normalize_math`); equal when the
normalised strings are, or both are equal exact rationals. path: the whole output as nodes, same order.
Prediction files: JSON lines ``index, prompt, output, extracted, gold, correct``; part files per rank."""
from __future__ import annotations

import datetime
import json
import re
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

from .. import io

KINDS = ("gsm8k", "math", "path")

# ----------------------------------------------------------------------------- GSM8K

_NUMBER = re.compile(r"(?<![\w.])([-+\u2212]?)(?:\$\s?)?([-\u2212]?)"   # a sign touches $ or the digits
                     r"(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)")
_FINAL_LINE = re.compile(r"####([^\n]*)")


def canonical_number(sign: str, digits: str) -> str:
    """'-', '1,200.00' -> '-1200'; trailing decimal zeros dropped, no exponent, '-0' -> '0'."""
    value = Decimal(digits.replace(",", "")) * (-1 if sign in ("-", "\u2212") else 1)
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def _numbers(text: str) -> list[str]:
    return [canonical_number(s1 or s2, d) for s1, s2, d in _NUMBER.findall(text)]


def gsm8k_answer(text: str) -> str | None:
    """The number of the last ``#### N`` line (its first number), else the text's last number."""
    finals = [n for line in _FINAL_LINE.findall(text) for n in _numbers(line)[:1]]
    return (finals or _numbers(text) or [None])[-1]


# ----------------------------------------------------------------------------- MATH

_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])( *)")       # group 1: the spaces after it


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """Content of the balanced ``{...}`` opening at text[start], and the index after it."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i], i + 1
    return None


def boxed_answer(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (or ``\\boxed 5``); None if none is closed."""
    for match in reversed(list(_BOX.finditer(text))):
        rest = match.end()
        if text.startswith("{", rest):
            if found := _braced(text, rest):
                return found[0]
        elif match.group(1) and (token := re.match(r"[^\s$]+", text[rest:])):
            return token.group(0)
    return None


def _fix_frac_args(text: str) -> str:
    """``\\frac12`` / ``\\frac1{2}`` / ``\\frac{1}2`` -> ``\\frac{1}{2}`` (also ``\\sqrt2`` -> ``\\sqrt{2}``)."""
    def arg(s: str, i: int) -> tuple[str, int]:
        if s.startswith("{", i) and (found := _braced(s, i)):
            return "{" + _fix_frac_args(found[0]) + "}", found[1]
        return ("{" + s[i] + "}", i + 1) if i < len(s) else ("", i)

    out, i = [], 0
    for match in re.finditer(r"\\(frac|sqrt)(?![a-zA-Z])", text):
        if match.start() < i:
            continue
        out.append(text[i:match.end()])
        i = match.end()
        for _ in range(2 if match.group(1) == "frac" else 1):
            if i < len(text) and text[i] == "[":            # \sqrt[3]{x}: keep the index
                break
            part, i = arg(text, i)
            out.append(part)
    return "".join(out) + text[i:]


_TEXT = r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}"


def _drop_units(text: str) -> str:
    """Drop a trailing ``\\text{...}`` unit after a value; unwrap the remaining ``\\text{}``."""
    while (stripped := re.sub(r"(?<=\S)\s*" + _TEXT + r"\s*$", "", text)) != text and stripped.strip():
        text = stripped
    return re.sub(_TEXT, r"\1", text)


_DROP = (r"\\\$", r"\\!", r"\\,", r"\\;", r"\\:", r"\\ ", r"\\displaystyle", r"\\left(?![a-zA-Z])",
         r"\\right(?![a-zA-Z])", r"\$", r"\^\{?\\circ\}?", r"\\%", r"%", r"\{,\}")


def normalize_math(answer: str) -> str:
    """The comparison form of a MATH answer (see the module docstring)."""
    text = answer.strip().replace("\n", " ")
    text = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", text)
    for pattern in _DROP:
        text = re.sub(pattern, "", text)
    text = _drop_units(text)
    text = re.sub(r"\s+", "", text).rstrip(".")
    text = _fix_frac_args(text)
    text = re.sub(r"\^\{(\w)\}", r"^\1", text)
    if re.fullmatch(r"[a-zA-Z]\w?=.+", text):             # "x=5" -> "5"
        text = text.split("=", 1)[1]
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")
    return re.sub(r"(?<![\d.])\.(\d)", r"0.\1", text)


def as_rational(text: str) -> Fraction | None:
    """Exact value of a normalised answer that is a plain number or a simple fraction, else None."""
    m = re.fullmatch(r"([-+]?)\\frac\{([-+]?\d+(?:\.\d+)?)\}\{([-+]?\d+(?:\.\d+)?)\}", text) \
        or re.fullmatch(r"([-+]?)(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)", text)
    try:
        if m:
            value = Fraction(m.group(2)) / Fraction(m.group(3))
            return -value if m.group(1) == "-" else value
        return Fraction(text) if re.fullmatch(r"[-+]?\d+(?:\.\d+)?", text) else None
    except (ZeroDivisionError, ValueError):
        return None


def math_equal(a: str, b: str) -> bool:
    na, nb = normalize_math(a), normalize_math(b)
    if na == nb:
        return True
    ra = as_rational(na)
    return ra is not None and ra == as_rational(nb)


# ----------------------------------------------------------------------------- path

def path_answer(text: str) -> str | None:
    """The nodes of the whole text, split at whitespace and commas, joined by single spaces; None if none."""
    return " ".join(w for w in re.split(r"[\s,]+", text) if w) or None


# ----------------------------------------------------------------------------- every kind

def extract(text: str, kind: str) -> str | None:
    """The final answer of a model output (None if it has none)."""
    if kind not in KINDS:
        raise ValueError(f"--kind {kind!r}: expected one of {', '.join(KINDS)}")
    return {"gsm8k": gsm8k_answer, "math": boxed_answer, "path": path_answer}[kind](text)


def gold_answer(gold: str, kind: str) -> str:
    """A gold answer as given, or the final answer of a gold solution text."""
    found = extract(gold, kind)
    return ("" if kind == "path" else gold.strip()) if found is None else found


def is_correct(output: str, gold: str, kind: str) -> bool:
    """Exact match of the output's final answer with the gold answer, under ``kind``'s rules."""
    pred, ref = extract(output, kind), gold_answer(gold, kind)
    return pred is not None and (math_equal(pred, ref) if kind == "math" else pred == ref)


def guess_kind(golds: list[str]) -> str:
    """'math' when any gold answer holds a ``\\boxed`` or a LaTeX command, else 'gsm8k'."""
    return "math" if any("\\" in g for g in golds) else "gsm8k"


def score(items: list[dict], kind: str) -> dict:
    """items: dicts with ``output`` and ``gold`` -> {"accuracy", "n", "correct", "no_answer", "kind"}."""
    correct = sum(is_correct(it["output"], it["gold"], kind) for it in items)
    no_answer = sum(extract(it["output"], kind) is None for it in items)
    return {"accuracy": correct / len(items) if items else 0.0, "n": len(items), "correct": correct,
            "no_answer": no_answer, "kind": kind}


# ----------------------------------------------------------------------------- prediction files

def read_predictions(path: str | Path, required: tuple[str, ...] = ("output", "gold")) -> list[dict]:
    """Lines of a prediction file (a cut-short last line skipped); a bad line is a one-line ValueError."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{io.shown_path(path)}: no such prediction file")
    text = path.read_text(errors="replace")
    lines = text.splitlines()
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines) and not text.endswith("\n"):
                break
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
        missing = [k for k in required if not isinstance(item.get(k) if isinstance(item, dict) else None, str)]
        if missing:
            raise ValueError(f"{path}:{n}: expected an object with string fields {list(required)}, "
                             f"missing or not a string: {missing}")
        items.append(item)
    return items


def score_file(path: str | Path, kind: str) -> dict:
    """``score`` of a prediction file's lines; a file without a single prediction is a one-line ValueError."""
    if not (items := read_predictions(path)):
        raise ValueError(f"{path}: no prediction lines (expected JSON objects with string fields output and gold)")
    return score(items, kind)


def part_path(out: str | Path, rank: int, world: int) -> Path:
    out = Path(out)
    return out.with_name(f"{out.name}.part{rank}of{world}")


def shard(indices: list[int], rank: int, world: int) -> list[int]:
    """The share of process ``rank`` of ``world``: indices i with i % world == rank."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} of world {world}: expected 0 <= rank < world")
    return [i for i in indices if i % world == rank]


def done_items(out: str | Path) -> dict[int, dict]:
    """Items already written, by index: the output file and every part file next to it."""
    out = Path(out)
    files = ([out] if out.is_file() else []) + sorted(out.parent.glob(f"{out.name}.part*of*"))
    return {it["index"]: it for f in files for it in read_predictions(f, ()) if isinstance(it.get("index"), int)}


def merge_parts(out: str | Path) -> list[dict]:
    """Join the output file and its part files into the output file (sorted by index); remove the parts."""
    out = Path(out)
    items = [it for _, it in sorted(done_items(out).items())]
    io.write_text_atomic(out, "".join(json.dumps(it) + "\n" for it in items))    # on error the part files stay
    for part in out.parent.glob(f"{out.name}.part*of*"):
        part.unlink()
    return items


def predict(items: list[dict], generate, out: str | Path, kind: str, rank: int = 0, world: int = 1,
            batch_size: int = 8, agree=None) -> int:
    """Generate and score this process's share of ``items`` not yet in ``out`` or its part files,
    appending each finished batch to its part file (resumable). items: [{"prompt", "prompt_ids", "gold"}];
    ``agree``: batch count -> the count every process runs (padded with dropped batches of item 0)."""
    done = done_items(out)
    for i, item in done.items():
        if i < len(items) and item.get("prompt") != items[i]["prompt"]:
            raise ValueError(f"{out}: item {i} was written for another prompt (another data file?); "
                             "use another --out or delete it")
    todo = sorted((i for i in shard(list(range(len(items))), rank, world) if i not in done),
                  key=lambda i: (-len(items[i]["prompt_ids"]), i))
    part = part_path(out, rank, world)        # rewritten without a last line a killed writer cut short
    if part.is_file() and part.stat().st_size and not part.read_text().endswith("\n"):
        part.write_text("".join(json.dumps(it) + "\n" for it in read_predictions(part, ())))
    batches = [todo[start:start + batch_size] for start in range(0, len(todo), batch_size)]
    padding = agree(len(batches)) - len(batches) if agree else 0
    with open(part, "a") as f:
        for batch in batches:
            for i, text in zip(batch, generate([items[i] for i in batch])):
                line = {"index": i, "prompt": items[i]["prompt"], "output": text,
                        "extracted": extract(text, kind), "gold": items[i]["gold"],
                        "correct": is_correct(text, items[i]["gold"], kind)}
                f.write(json.dumps(line) + "\n")
            f.flush()
    for _ in range(padding):
        generate(items[:1])
    return len(todo)


def collect(out: str | Path, n: int) -> list[dict]:
    """The merged items 0..n-1 of a finished prediction file (merge_parts first); ValueError if any is missing."""
    by_index = {it["index"]: it for it in read_predictions(out, ("output", "gold"))}
    if missing := [i for i in range(n) if i not in by_index]:
        raise ValueError(f"{out}: {len(missing)} of {n} items missing (first: {missing[0]}); rerun to finish")
    return [by_index[i] for i in range(n)]


def write_scores(out: str | Path, n: int, kind: str, eval_dir: str | Path, *, run_config: dict,
                 step: int | None, data: str, checkpoint: str, generation: dict) -> tuple[dict, Path]:
    """Merge the part files of ``out``, score its ``n`` items, write the evaluation record
    (mutor2d.evaluation.records' keys) -> (result, record path)."""
    from ..evaluation.records import write_record
    merge_parts(out)
    result = score(collect(out, n), kind)
    objective = run_config.get("objective") or {}
    record = {
        "method": objective.get("name", "unknown"), "objective": objective, "step": step,
        "metrics": {"accuracy": result["accuracy"]},
        "detail": {k: result[k] for k in ("correct", "no_answer")},
        "evaluator": f"{result['kind']} exact match", "reference": data, "n": result["n"],
        "sampling": {"temperature": 0.0, **generation}, "seed": None, "samples": str(out),
        "checkpoint": checkpoint, "run_config": run_config,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return result, write_record(record, eval_dir)
