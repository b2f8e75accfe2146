"""The language study's tasks (experiments/lm_study.py): scales, data lines, tokenizers, methods."""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Callable

from mutor2d.lm import arith
from mutor2d.lm import data as lm_data
from mutor2d.lm.offline_tokenizers import char_tokenizer, word_tokenizer


@dataclass
class Size:
    """The study's scale; ``shape``: difficulty (arith: steps, cycled; stargraph: degree, path_len, num_nodes)."""
    train: int = 4000
    test: int = 200
    shape: tuple[int, ...] = (2,)
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    max_steps: int = 800
    batch: int = 32
    lr: float = 3e-3
    eval_every: int = 200
    max_new_tokens: int = 40
    init_std: float = 0.02                  # the Llama's initializer_range (its default 0.02)
    pretrain_count: int = 0                 # lines of the pretraining corpus (0: no shared base)
    pretrain_steps: int = 0                 # next-token steps of the shared base
    corpus_steps: tuple[int, ...] = (1, 2, 3, 4)   # steps per problem of the pretraining corpus (cycled)


def arith_records(size: Size, count: int, seed: int) -> list[dict]:
    return arith.arith_records(count, list(size.shape), seed=seed)


def arith_tokenizer(size: Size):
    return char_tokenizer(arith.arith_alphabet())


def arith_corpus(size: Size, count: int, seed: int) -> list[dict]:
    """The pretraining corpus: worked problems of ``size.corpus_steps`` steps and bare sums, GSM8K lines."""
    problems = arith.arith_records(count - count // 4, list(size.corpus_steps), seed=seed + 100)
    rng, sums = random.Random(seed), []
    for _ in range(count // 4):
        a, b = rng.randint(0, 20), rng.randint(1, 9)
        op, value = ("+", a + b) if rng.random() < 0.5 or a < b else ("-", a - b)
        sums.append({"question": f"What is {a}{op}{b}?", "answer": f"{a}{op}{b}={value}\n#### {value}"})
    return problems + sums


def stargraph_records(size: Size, count: int, seed: int) -> list[dict]:
    return lm_data.stargraph_records(*size.shape, count=count, seed=seed)


def graph_edges(line: dict) -> frozenset:
    """A star-graph line -> its set of edges (the text before the first "/"), whatever their order."""
    return frozenset(e.strip() for e in line["prompt"].split("/")[0].split("|") if e.strip())


def graph_key(line: dict) -> tuple:
    """A star-graph line -> (its set of edges, its query): the graph, whatever the edge order."""
    return graph_edges(line), line["prompt"].split("/", 1)[1].strip()


def walk(edges: str, start: str, rng) -> list[str]:
    """The walk from ``start`` along "u v | ..." edges to a node without out-edges (a random out-edge where several)."""
    out = {}
    for u, v in (e.split() for e in edges.split("|") if e.strip()):
        out.setdefault(u, []).append(v)
    path = [start]
    while path[-1] in out:
        path.append(rng.choice(out[path[-1]]))
    return path


def stargraph_corpus(size: Size, count: int, seed: int) -> list[dict]:
    """The pretraining corpus over fresh star graphs (seed + 100), never the task's query: alternately a random
    walk "EDGES / v =" -> " v ... leaf" and the path from the leaf side "EDGES / g / s =" -> " g ... s"."""
    rng, lines = random.Random(seed), []
    for k, line in enumerate(stargraph_records(size, count, seed + 100)):
        edges, path = line["prompt"].split("/")[0], line["answer"].split()
        if k % 2:
            lines.append({"prompt": f"{edges}/ {path[-1]} / {path[0]} =", "answer": " " + " ".join(path[::-1])})
        else:
            start = rng.choice(sorted({e.split()[0] for e in edges.split("|") if e.strip()}))
            lines.append({"prompt": f"{edges}/ {start} =", "answer": " " + " ".join(walk(edges, start, rng))})
    return lines


def stargraph_tokenizer(size: Size):
    """One word per node id (0..num_nodes-1) and per delimiter (edge end |, query /, answer =)."""
    return word_tokenizer([str(v) for v in range(size.shape[2])] + ["|", "/", "="])


@dataclass(frozen=True)
class Task:
    """What a study runs on: data lines, tokenizer, answer rules, methods (name -> objective section) and scale."""
    records: Callable[[Size, int, int], list[dict]]     # (size, count, seed) -> jsonl lines
    key: Callable[[dict], object]                       # a line -> what a held-out test line must not share
    tokenizer: Callable[[Size], object]
    scoring: dict                                       # eval.name (also data.name) [+ eval.kind]
    methods: dict
    size: Size
    quick: Size
    stem: str                                           # default OUT runs/STEM and plot OUT/STEM.png
    title: str
    corpus: Callable[[Size, int, int], list[dict]] | None = None   # the shared base's pretraining lines
    prompt_modes: tuple[str, ...] = ("causal",)         # model.prompt_attention of every arm, crossed
    reference: str = "next-token"                       # the method every other arm is paired with
    decode: str = "plain"                               # eval.decode of the online evaluation (auto: drafts)
    bootstrap: bool = False                             # add intervals over seeds *and* test items per step


A = 0.3                                     # the paper's loss weight of the auxiliary term (LM setting)
A_STAR = 0.5                                # the authors' star-graph setting: d = 2..4, a = 0.5
ARITH_METHODS = {"next-token": {"name": "ntp"},
                 "mutor-1d d_max=2": {"name": "mutor-1d", "d_max": 2, "reg_weight": A},
                 "mutor-1d d_max=4": {"name": "mutor-1d", "d_max": 4, "reg_weight": A},
                 "multihead d_max=4": {"name": "multihead", "d_max": 4, "reg_weight": A}}
MUTOR_PAPER = {"name": "mutor-1d", "d_max": 4, "reg_weight": A}   # the settings study's reference rule
SETTINGS_METHODS = {"next-token": {"name": "ntp"},
                    "mutor-1d (paper rule)": MUTOR_PAPER,
                    "earlier registers": {**MUTOR_PAPER, "register_visibility": "earlier_registers"},
                    "valid-anchors offsets": {**MUTOR_PAPER, "offset_distribution": "valid-anchors"},
                    "a linear 0.3 -> 0": {**MUTOR_PAPER, "reg_weight_schedule": "linear", "reg_weight_final": 0.0},
                    "self-distilled targets": {**MUTOR_PAPER, "reg_target": "self_distill"}}
STAR_METHODS = {"next-token": {"name": "ntp"},
                "mutor-1d d=2..4": {"name": "mutor-1d", "d_min": 2, "d_max": 4, "reg_weight": A_STAR}}
TINY = dict(test=8, hidden=16, layers=1, heads=2, batch=8, eval_every=2)   # shared by the --quick sizes
ARITH_PRETRAINED = Task(
    arith_records, lambda line: line["question"], arith_tokenizer, {"name": "gsm8k"}, ARITH_METHODS,
    Size(train=1000, test=200, shape=(2,), max_steps=300, batch=16, lr=1e-3, eval_every=300,
         pretrain_count=20000, pretrain_steps=3000),
    Size(train=32, shape=(1,), max_steps=2, max_new_tokens=12, pretrain_count=64, pretrain_steps=3, **TINY),
    "lm_pretrained", "synthetic arithmetic, pretrained char-level Llama",
    corpus=arith_corpus, prompt_modes=("causal", "bidirectional"))
TASKS = {
    "arith": Task(
        arith_records, lambda line: line["question"], arith_tokenizer, {"name": "gsm8k"}, ARITH_METHODS,
        Size(),
        Size(train=64, shape=(1,), max_steps=4, max_new_tokens=12, **TINY),
        "lm_study", "synthetic arithmetic, char-level Llama"),
    "stargraph": Task(
        stargraph_records, graph_key, stargraph_tokenizer, {"name": "jsonl", "kind": "path"},
        STAR_METHODS,
        Size(train=5000, test=500, shape=(2, 5, 20), max_steps=3000, eval_every=250, max_new_tokens=8,
             init_std=0.08),
        Size(train=64, shape=(2, 3, 20), max_steps=4, max_new_tokens=6, **TINY),
        "lm_stargraph", "path-star graph, word-level Llama"),
    "arith_pretrained": ARITH_PRETRAINED,
    "arith_pretrained_4step": dataclasses.replace(
        ARITH_PRETRAINED, stem="lm_pretrained_4step", title="4-step arithmetic, base pretrained on 1-3 steps",
        size=dataclasses.replace(ARITH_PRETRAINED.size, shape=(4,), max_new_tokens=60,
                                 corpus_steps=(1, 2, 3)),
        quick=dataclasses.replace(ARITH_PRETRAINED.quick, shape=(2,), corpus_steps=(1,))),
    "stargraph_pretrained": Task(
        stargraph_records, graph_edges, stargraph_tokenizer, {"name": "jsonl", "kind": "path"},
        {**STAR_METHODS, "multihead d=2..4": {"name": "multihead", "d_min": 2, "d_max": 4, "reg_weight": A_STAR}},
        Size(train=2000, test=500, shape=(2, 5, 20), max_steps=400, lr=1e-3, eval_every=100, max_new_tokens=8,
             init_std=0.08, pretrain_count=20000, pretrain_steps=4000),
        Size(train=32, shape=(2, 3, 20), max_steps=4, max_new_tokens=6, init_std=0.08, pretrain_count=64,
             pretrain_steps=3, **TINY),
        "lm_stargraph_pretrained", "path-star graph, base pretrained on walks and leaf-side paths",
        corpus=stargraph_corpus, prompt_modes=("causal", "bidirectional")),
}
# the open questions as settings, on the 4-step protocol: causal prompts, paired with the paper's rule,
# decoded with register drafts where the rule gives them
TASKS["arith_settings"] = dataclasses.replace(
    TASKS["arith_pretrained_4step"], methods=SETTINGS_METHODS, stem="lm_settings",
    title="the open questions as settings: 4-step arithmetic, base pretrained on 1-3 steps",
    prompt_modes=("causal",), reference="mutor-1d (paper rule)", decode="auto")
# the budget question: does next-token's lead close with more steps? The 4-step protocol's base and
# data, 1,200 steps scored every 300 on 1,000 held-out problems; intervals over seeds and items
BUDGET_METHODS = {"next-token": {"name": "ntp"}, "mutor-1d (paper rule)": MUTOR_PAPER,
                  "a linear 0.3 -> 0": SETTINGS_METHODS["a linear 0.3 -> 0"]}
TASKS["arith_budget"] = dataclasses.replace(
    TASKS["arith_pretrained_4step"], methods=BUDGET_METHODS, stem="lm_budget",
    title="budget: 4-step arithmetic, accuracy at 300-1,200 steps",
    size=dataclasses.replace(TASKS["arith_pretrained_4step"].size, test=1000, max_steps=1200, eval_every=300),
    quick=dataclasses.replace(TASKS["arith_pretrained_4step"].quick, max_steps=4), prompt_modes=("causal",),
    bootstrap=True)
