"""Synthetic multi-step arithmetic word problems in GSM8K's raw {"question", "answer"} format.

    question: "Ann has 7 coins. She gets 5. She gives 3. How many coins?"
    answer:   "7+5=12\\n12-3=9\\n#### 9"

Counts stay in 0..``max_value``; each change is 1..``max_change``; a problem is a pure function of (seed, index).
"""
from __future__ import annotations

import random

NAMES = (("Ann", "She"), ("Bob", "He"), ("Cal", "He"), ("Dee", "She"))
THINGS = ("apples", "coins", "books", "cards")
STEPS_LIMIT = 100       # changes of one problem: about 2,300 characters of question and answer


def arith_problem(rng: random.Random, steps: int, max_value: int = 20, max_change: int = 9) -> dict:
    """One problem of ``steps`` changes -> {"question", "answer"} (answer ends with ``#### N``)."""
    (name, pronoun), thing = rng.choice(NAMES), rng.choice(THINGS)
    value = rng.randint(1, max_value)
    sentences, lines = [f"{name} has {value} {thing}."], []
    for _ in range(steps):
        up = rng.random() < 0.5 if 0 < value < max_value else value == 0
        change = rng.randint(1, min(max_change, max_value - value if up else value))
        new = value + change if up else value - change
        sentences.append(f"{pronoun} {'gets' if up else 'gives'} {change}.")
        lines.append(f"{value}{'+' if up else '-'}{change}={new}")
        value = new
    question = " ".join(sentences) + f" How many {thing}?"
    return {"question": question, "answer": "\n".join(lines) + f"\n#### {value}"}


def arith_records(count: int, steps: list[int], seed: int, max_value: int = 20, max_change: int = 9) -> list[dict]:
    """``count`` problems, problem i with steps[i % len(steps)] changes, drawn from ``seed``."""
    if count < 1 or not steps or min(steps) < 1:
        raise ValueError(f"count={count}, steps={steps}: expected count >= 1 and step counts >= 1")
    if max_value < 2 or not 1 <= max_change <= max_value:
        raise ValueError(f"max_value={max_value}, max_change={max_change}: expected 2 <= max_value, "
                         "1 <= max_change <= max_value")
    rng = random.Random(seed)
    return [arith_problem(rng, steps[i % len(steps)], max_value, max_change) for i in range(count)]


def arith_alphabet(max_value: int = 20) -> str:
    """Every character a problem, its GSM8K prompt/answer rendering and a model's output may use."""
    words = " ".join(n + " " + p for n, p in NAMES) + " " + " ".join(THINGS)
    fixed = "Question: Answer: has gets gives How many? .+-=#\n0123456789"
    return "".join(sorted(set(words + fixed)))
