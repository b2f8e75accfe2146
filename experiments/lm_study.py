"""CPU-scale language study: next-token vs MuToR-1D (vs the multi-head baseline) on a synthetic task.

    python experiments/lm_study.py --out runs/lm_study [--seeds 0 1 2] [--plot docs/lm_study.png]
    python experiments/lm_study.py --task stargraph --out runs/lm_stargraph [--plot docs/lm_stargraph.png]
    python experiments/lm_study.py [--task stargraph] --quick --out /tmp/lm_study_quick   # seconds (CI)
    python experiments/lm_study.py --task arith_pretrained --seeds 0 1 2 3 4 5 6 7 --out runs/lm_pretrained
    python experiments/lm_study.py --task stargraph_pretrained --seeds 0 1 2 3 4 5 6 7 --out runs/lm_stargraph_pretrained
    python experiments/lm_study.py --task arith_settings --seeds 0 1 2 3 4 5 6 7 --out runs/lm_settings
    python experiments/lm_study.py --task arith_budget --seeds 0 1 2 3 4 5 6 7 --out runs/lm_budget

Tasks (a task is data + tokenizer + scorer + methods; the study is the same for every task; the
protocols and results: docs/RESULTS.md):

* ``arith`` (default): multi-step arithmetic word problems in GSM8K's format (mutor2d.lm.arith),
  character tokenizer, exact match of the final number; next-token, MuToR-1D d_max 2 and 4,
  multi-head d_max 4 (a = 0.3).
* ``stargraph``: path-star graphs (degree 2, path length 5, 20 node labels; one word per node id /
  delimiter), exact match of the whole answer path; next-token and MuToR-1D with the authors' setting
  d = 2..4, a = 0.5. Llama init std 0.08 (at 50 labels and 5,000 graphs next-token memorised the
  training graphs; at init 0.02 the image path's runs stayed on the plateau).
* ``arith_pretrained``: ``arith`` fine-tuned from **one shared base**, pretrained once with next-token
  prediction on other problems (1 to 4 steps, none equal to a fine-tuning or test question) and bare
  sums; every arm under causal and bidirectional prompt attention, paired by seed with next-token.
  The table adds 95% confidence intervals, paired differences and the cost of each arm.
* ``arith_pretrained_4step``: the same, pretrained on 1-3-step problems, fine-tuned and tested on
  4-step ones (the 2-step version sits at the ceiling: every arm solves 98-100 %).
* ``stargraph_pretrained``: ``stargraph`` from one shared base pretrained on other tasks over fresh
  graphs (random walks "EDGES / v =", paths read from the leaf side "EDGES / g / s ="; never a
  fine-tuning or test graph's edges, never the "/ s g =" query); next-token, MuToR-1D and multi-head
  d = 2..4 (a = 0.5), both prompt attentions, paired by seed. A test graph shares no edge set with a
  training graph, whatever the query.
* ``arith_settings``: the open questions as settings (docs/METHOD.md) on ``arith_pretrained_4step``'s
  protocol, causal prompts: next-token, MuToR-1D's paper rule (d_max 4, a 0.3) and that rule with one
  setting changed per arm, each paired with the paper's rule; decoded with ``auto`` (register drafts
  where the rule gives them; the same tokens), so the table adds forwards per generated token.
* ``arith_budget``: does the gap close with budget? ``arith_pretrained_4step``'s base and data, causal
  prompts; next-token, the paper's rule and its linear 0.3 -> 0 fade; 1,200 steps, scored every 300
  on 1,000 held-out problems. Per step, each arm's accuracy and paired difference to next-token with
  95% intervals from a bootstrap over seeds *and* test items (the table, and the plot's bands).

A training split and a held-out test split (no test item equal to a training one: the same question,
or the same graph and query). Model: a small Llama (random init per seed, or the shared pretrained
base), fully fine-tuned through train.py once per arm and seed; accuracy: greedy answers to the test
split by the online evaluation hook, every train.eval_every steps. Resumable: finished runs are skipped,
unfinished ones continue (--resume auto). Writes OUT/table.md (also printed), the plot and
OUT/summary.json (the table's rows, the shared base, the provenance of the study and of every run).

Shared bases are cached by content in BASES/KEY12/ (``--bases``, default runs/bases; KEY:
:func:`base_key`): any study with that recipe (``arith_pretrained_4step`` and ``arith_settings`` share
one) reuses a finished base and says so in one line. Arms of one seed whose runs fine-tuned different
initial weights (RUN/provenance.json's ``init``) are refused in one line unless ``--allow-mixed-bases``.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

import numpy as np
import yaml

from mutor2d import provenance
from mutor2d.cli import HelpFormatter
from mutor2d.engine.runlog import read_log, skip_counts
from mutor2d.io import write_json_atomic
from mutor2d.lm import arith
from mutor2d.lm import data as lm_data
from mutor2d.lm.offline_tokenizers import char_tokenizer, word_tokenizer
from mutor2d.lm.records import write_jsonl
from mutor2d.lm.tiny import write_tiny_llama

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Size:
    """The study's scale: data, model, training and evaluation. ``shape``: the task's difficulty
    (arith: steps per problem, cycled; stargraph: degree, path_len, num_nodes)."""
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
    """The walk from ``start`` along the edges "u v | ..." to a node without out-edges, a random
    out-edge wherever there are several (at a star graph's source: a random arm)."""
    out = {}
    for u, v in (e.split() for e in edges.split("|") if e.strip()):
        out.setdefault(u, []).append(v)
    path = [start]
    while path[-1] in out:
        path.append(rng.choice(out[path[-1]]))
    return path


def stargraph_corpus(size: Size, count: int, seed: int) -> list[dict]:
    """The pretraining corpus over fresh star graphs (seed stream ``seed`` + 100), in the task's words
    but never its query: alternately a random walk from a random non-leaf node "EDGES / v =" -> " v ... leaf"
    and the path read from the leaf side "EDGES / g / s =" -> " g ... s" (each node's one predecessor)."""
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
    """What a study runs on: data lines, tokenizer, answer rules (the eval section's format keys),
    methods (name -> objective section) and scale."""
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
TASKS = {
    "arith": Task(
        arith_records, lambda line: line["question"], arith_tokenizer, {"name": "gsm8k"}, ARITH_METHODS,
        Size(),
        Size(train=64, test=8, shape=(1,), hidden=16, layers=1, heads=2, max_steps=4, batch=8, eval_every=2,
             max_new_tokens=12),
        "lm_study", "synthetic arithmetic, char-level Llama"),
    "stargraph": Task(
        stargraph_records, graph_key, stargraph_tokenizer, {"name": "jsonl", "kind": "path"},
        STAR_METHODS,
        Size(train=5000, test=500, shape=(2, 5, 20), max_steps=3000, eval_every=250, max_new_tokens=8,
             init_std=0.08),
        Size(train=64, test=8, shape=(2, 3, 20), hidden=16, layers=1, heads=2, max_steps=4, batch=8,
             eval_every=2, max_new_tokens=6),
        "lm_stargraph", "path-star graph, word-level Llama"),
    "arith_pretrained": Task(
        arith_records, lambda line: line["question"], arith_tokenizer, {"name": "gsm8k"}, ARITH_METHODS,
        Size(train=1000, test=200, shape=(2,), max_steps=300, batch=16, lr=1e-3, eval_every=300,
             pretrain_count=20000, pretrain_steps=3000),
        Size(train=32, test=8, shape=(1,), hidden=16, layers=1, heads=2, max_steps=2, batch=8, eval_every=2,
             max_new_tokens=12, pretrain_count=64, pretrain_steps=3),
        "lm_pretrained", "synthetic arithmetic, pretrained char-level Llama",
        corpus=arith_corpus, prompt_modes=("causal", "bidirectional")),
    "arith_pretrained_4step": Task(
        arith_records, lambda line: line["question"], arith_tokenizer, {"name": "gsm8k"}, ARITH_METHODS,
        Size(train=1000, test=200, shape=(4,), max_steps=300, batch=16, lr=1e-3, eval_every=300,
             max_new_tokens=60, pretrain_count=20000, pretrain_steps=3000, corpus_steps=(1, 2, 3)),
        Size(train=32, test=8, shape=(2,), hidden=16, layers=1, heads=2, max_steps=2, batch=8, eval_every=2,
             max_new_tokens=12, pretrain_count=64, pretrain_steps=3, corpus_steps=(1,)),
        "lm_pretrained_4step", "4-step arithmetic, base pretrained on 1-3 steps",
        corpus=arith_corpus, prompt_modes=("causal", "bidirectional")),
    "stargraph_pretrained": Task(
        stargraph_records, graph_edges, stargraph_tokenizer, {"name": "jsonl", "kind": "path"},
        {**STAR_METHODS, "multihead d=2..4": {"name": "multihead", "d_min": 2, "d_max": 4, "reg_weight": A_STAR}},
        Size(train=2000, test=500, shape=(2, 5, 20), max_steps=400, lr=1e-3, eval_every=100, max_new_tokens=8,
             init_std=0.08, pretrain_count=20000, pretrain_steps=4000),
        Size(train=32, test=8, shape=(2, 3, 20), hidden=16, layers=1, heads=2, max_steps=4, batch=8,
             eval_every=2, max_new_tokens=6, init_std=0.08, pretrain_count=64, pretrain_steps=3),
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


def write_data(out: Path, task: Task, size: Size) -> tuple[Path, Path]:
    """Training and held-out test splits (jsonl lines); no test line shares its key with a training line."""
    out.mkdir(parents=True, exist_ok=True)
    train = task.records(size, size.train, 0)
    seen = {task.key(r) for r in train}
    test = [r for r in task.records(size, 2 * size.test, 1) if task.key(r) not in seen]
    write_jsonl(train, out / "train.jsonl")
    write_jsonl(test[:size.test], out / "test.jsonl")
    return out / "train.jsonl", out / "test.jsonl"


def write_base(folder: Path, task: Task, size: Size, seed: int) -> Path:
    """A randomly initialised small Llama (seeded) and the task's tokenizer, as a model folder."""
    return write_tiny_llama(folder, task.tokenizer(size), size.hidden, size.layers, size.heads, seed,
                            init_std=size.init_std)


def base_recipe(out: Path, task: Task, size: Size, exclude: set) -> tuple[dict, str]:
    """The shared base's pretraining (its config; writes OUT/data/pretrain.jsonl, the task's corpus
    with the lines whose key is in ``exclude`` dropped, and OUT/pretrain_init, a random Llama of seed
    1000) and its cache key (:func:`base_key`)."""
    corpus = [r for r in task.corpus(size, size.pretrain_count, 7) if task.key(r) not in exclude]
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(corpus, out / "data" / "pretrain.jsonl")
    init = write_base(out / "pretrain_init", task, size, 1000)
    cfg = run_config(init, out / "data" / "pretrain.jsonl", None, {"name": "ntp"},
                     dataclasses.replace(size, max_steps=size.pretrain_steps, lr=3e-3), 1000, task.scoring)
    return cfg, base_key(cfg, out / "data" / "pretrain.jsonl", init)


def base_key(cfg: dict, corpus: Path, init: Path) -> str:
    """sha256 of what makes a base: its pretraining config (without the paths of its corpus and initial
    weights, which name this study's folder), their content (fingerprints) and the code identity
    (commit and diff hash, or the package version): equal recipes share one base, whatever the study."""
    recipe = {k: v for k, v in cfg.items() if k not in ("model", "data")}
    recipe["model"] = {k: v for k, v in cfg["model"].items() if k != "hf"}
    recipe["data"] = {k: v for k, v in cfg["data"].items() if k != "path"}
    code = provenance.code_identity()
    ident = {"config": recipe, "corpus": provenance.fingerprint(corpus)["sha256"],
             "init": provenance.fingerprint(init)["sha256"], "code": provenance.code_key(code)}
    return provenance.text_sha256(json.dumps(ident, sort_keys=True))


def pretrained_base(out: Path, task: Task, size: Size, exclude: set, entry, bases: Path) -> Path:
    """The shared base: a random Llama (seed 1000) trained once with next-token prediction on the
    task's corpus, through train.py, into BASES/KEY12 (KEY: :func:`base_key`); a finished one there is
    reused (said in one line), an unfinished one resumed."""
    cfg, key = base_recipe(out, task, size, exclude)
    run = bases / key[:12]
    if finished(run, size.pretrain_steps, records=False):
        print(f"reusing the shared base {key[:12]} ({run})", flush=True)
        return run
    timed(entry, out / "configs" / "pretrain.yaml", cfg, run, out)
    return run


def run_config(base: Path, train: Path, test: Path | None, objective: dict, size: Size, seed: int,
               scoring: dict, prompt_attention: str = "causal", decode: str = "plain") -> dict:
    evaluation = {"eval": {"path": str(test), **scoring, "max_new_tokens": size.max_new_tokens,
                           "batch_size": 100, "stop": [], "decode": decode}} if test else {}
    return {"task": "lm",
            "model": {"hf": str(base), "finetune": "full", "dtype": "float32", "prompt_attention": prompt_attention},
            "data": {"name": scoring["name"], "path": str(train), "max_prompt_len": 160, "max_answer_len": 64},
            "objective": objective,
            "optim": {"lr": size.lr, "betas": [0.9, 0.95], "weight_decay": 0.0, "schedule": "cosine",
                      "warmup_steps": size.max_steps // 10, "min_lr": size.lr / 10},
            "train": {"batch_size": size.batch, "max_steps": size.max_steps, "seed": seed, "log_every": 10,
                      "ckpt_every": max(size.max_steps // 2, 1), "eval_every": size.eval_every if test else 0,
                      "mixed_precision": "no", "tracker": "none"},
            **evaluation}


def records_of(run: Path) -> dict[int, dict]:
    """The run's online accuracy records by step."""
    recs = (json.loads(f.read_text()) for f in sorted((run / "eval").glob("*.json")))
    return {int(rec["step"]): rec for rec in recs}


def finished(run: Path, max_steps: int, records: bool = True) -> bool:
    """The run's model is saved (and, with ``records``, its accuracy at ``max_steps`` recorded)."""
    from mutor2d.lm.hf import INFERENCE_FILE
    saved = (run / "config.json").is_file() and (run / INFERENCE_FILE).is_file()
    return saved and (not records or max_steps in records_of(run))


def train_py():
    spec = importlib.util.spec_from_file_location("train_entry", ROOT / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def arms(task: Task) -> dict[str, tuple[dict, str]]:
    """arm name -> (objective section, prompt attention): every method under every prompt mode."""
    if len(task.prompt_modes) == 1:
        return {m: (o, task.prompt_modes[0]) for m, o in task.methods.items()}
    return {f"{m}, {mode}": (o, mode) for mode in task.prompt_modes for m, o in task.methods.items()}


def run_name(objective: dict, mode: str, seed: int, task: Task) -> str:
    """NAME_dD[_SETTING-VALUE ...][_MODE]_sSEED: the objective's fields beyond the method's own."""
    settings = "".join(f"_{k}-{v}" for k, v in objective.items() if k not in ("name", "d_min", "d_max", "reg_weight"))
    suffix = f"_{mode}" if len(task.prompt_modes) > 1 else ""
    return f"{objective['name']}_d{objective.get('d_max', 1)}{settings}{suffix}_s{seed}"


def run_all(out: Path, task: Task, size: Size, seeds: list[int], bases: Path) -> tuple[dict[str, dict[int, Path]], Path | None]:
    """Train every (arm, seed) not yet finished through train.py (a shared base: in ``bases``); -> (run
    folders by arm, seed; the shared base's folder or None)."""
    train, test = write_data(out / "data", task, size)
    entry, runs = train_py(), {}
    shared = None
    if size.pretrain_steps:
        seen = {task.key(r) for r in load_jsonl(train) + load_jsonl(test)}
        shared = pretrained_base(out, task, size, seen, entry, bases)
    for seed in seeds:
        base = shared or write_base(out / f"base_s{seed}", task, size, seed)
        for arm, (objective, mode) in arms(task).items():
            run = out / "runs" / run_name(objective, mode, seed, task)
            runs.setdefault(arm, {})[seed] = run
            if finished(run, size.max_steps):
                continue
            cfg = run_config(base, train, test, objective, size, seed, task.scoring, mode, task.decode)
            timed(entry, out / "configs" / f"{run.name}.yaml", cfg, run, out)
    return runs, shared


def load_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def timed(entry, config: Path, cfg: dict, run: Path, out: Path) -> None:
    """train.py on ``cfg`` (written to ``config``) into ``run``, resumed if begun; its wall and CPU
    seconds appended to OUT/costs.jsonl."""
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    t0, c0 = time.time(), time.process_time()
    entry.main(["--config", str(config), "--out", str(run), "--resume", "auto"])
    cost = {"run": run.name, "wall_s": round(time.time() - t0, 1), "cpu_s": round(time.process_time() - c0, 1)}
    with open(out / "costs.jsonl", "a") as f:
        f.write(json.dumps(cost) + "\n")
    print(f"{run.name}: {cost['wall_s']:.0f} s wall, {cost['cpu_s']:.0f} s CPU", file=sys.stderr, flush=True)


def final_loss(run: Path) -> float | None:
    rows = [r for r in read_log(run) if "loss_ntp" in r]
    return rows[-1]["loss_ntp"] if rows else None


def table_rows(runs: dict[str, dict[int, Path]], max_steps: int) -> list[dict]:
    """Per arm: seeds, final test accuracy per seed, its mean and std, final next-token loss (mean, or None)."""
    rows = []
    for method, by_seed in runs.items():
        acc = [records_of(r)[max_steps]["metrics"]["accuracy"] for r in by_seed.values()]
        loss = [v for v in (final_loss(r) for r in by_seed.values()) if v is not None]
        rows.append({"arm": method, "seeds": len(acc), "accuracy_mean": statistics.mean(acc),
                     "accuracy_sd": statistics.stdev(acc) if len(acc) > 1 else 0.0, "accuracy_per_seed": acc,
                     "final_ce_ntp": statistics.mean(loss) if loss else None})
    return rows


def table(runs: dict[str, dict[int, Path]], max_steps: int) -> str:
    """Markdown: final test accuracy (mean ± std over seeds, each seed) and final next-token loss."""
    lines = ["| method | seeds | test accuracy (mean ± std) | per seed | final train CE_ntp |",
             "|---|---|---|---|---|"]
    for row in table_rows(runs, max_steps):
        ce = f"{row['final_ce_ntp']:.3f}" if row["final_ce_ntp"] is not None else "-"
        lines.append(f"| {row['arm']} | {row['seeds']} | {row['accuracy_mean']:.3f} ± {row['accuracy_sd']:.3f} | "
                     f"{', '.join(f'{a:.3f}' for a in row['accuracy_per_seed'])} | {ce} |")
    return "\n".join(lines)


def init_of(run: Path) -> str | None:
    """The sha256 of the initial weights a run's first session started from (RUN/provenance.json)."""
    sessions = provenance.read_sessions(run)
    return ((sessions[0].get("init") or {}).get("sha256")) if sessions else None


def check_bases(runs: dict[str, dict[int, Path]], allow_mixed: bool) -> dict[int, str | None]:
    """Seed -> the initial weights' sha256 all its arms started from (arms are paired by seed); a
    seed whose arms' runs differ is a StudyError unless ``allow_mixed`` (then its value is None)."""
    by_seed: dict[int, set] = {}
    for by in runs.values():
        for seed, run in by.items():
            by_seed.setdefault(seed, set()).add(init_of(run))
    mixed = {s: found for s, found in by_seed.items() if len(found - {None}) > 1}
    if mixed and not allow_mixed:
        seed, found = next(iter(sorted(mixed.items())))
        raise StudyError(f"the arms of seed {seed} fine-tuned different initial weights "
                         f"({', '.join(sorted(provenance.short(h) for h in found - {None}))}): their pairing would "
                         f"compare bases, not methods; pass --allow-mixed-bases to pair them anyway")
    return {s: None if s in mixed else next(iter(found - {None}), None) for s, found in sorted(by_seed.items())}


class StudyError(ValueError):
    """A study that cannot be reported as asked; one line."""


def write_summary(out: Path, task_name: str, runs: dict, size: Size, bases: dict, shared: Path | None,
                  boot: dict | None = None) -> Path:
    """OUT/summary.json: the table's rows, the initial weights of each seed's arms (the shared base's
    folder and key when there is one) and the provenance of the study process and of each run."""
    from mutor2d.lm.hf import base_fingerprint
    summary = {"task": task_name, "rows": table_rows(runs, size.max_steps),
               "base": {"folder": str(shared), "key12": shared.name,
                        "sha256": base_fingerprint(str(shared))["sha256"]} if shared else None,
               "init_sha256_by_seed": {str(s): h for s, h in bases.items()},
               "bootstrap": {str(k): v for k, v in boot.items()} if boot else None,
               "provenance": {"study": provenance.provenance(),
                              "runs": {r.name: (provenance.read_sessions(r) or [None])[0]
                                       for by in runs.values() for r in by.values()}}}
    return write_json_atomic(out / "summary.json", summary)


def reference_arm(arm: str, reference: str = "next-token") -> str:
    """The arm an arm is paired with: ``reference`` under the same prompt attention ("METHOD, MODE")."""
    return ", ".join([reference, *arm.split(", ")[1:]])


def forwards_per_token(record: dict) -> float | None:
    """Forwards per generated token of an evaluation record's decoding (1.0 plain; < 1 with drafts)."""
    return record.get("sampling", {}).get("decode_stats", {}).get("forwards_per_token")


def cpu_seconds(out: Path) -> dict[str, float]:
    """Run folder name -> CPU seconds over all its sessions (OUT/costs.jsonl)."""
    total = {}
    path = out / "costs.jsonl"
    for row in (load_jsonl(path) if path.is_file() else []):
        total[row["run"]] = total.get(row["run"], 0.0) + row["cpu_s"]
    return total


SKIP_TOLERANCE = 0.01       # paired arms may differ by this share of their updates in skipped ones


def skipped(run: Path) -> int:
    """Updates the run's blow-up guard skipped (mutor2d/engine/health.py)."""
    return sum(skip_counts(run).values())


def check_skips(runs: dict[str, dict[int, Path]], max_steps: int, reference: str, tolerance: float) -> None:
    """Refuse (one line) to pair an arm with its reference when, for some seed, their runs' skipped
    updates differ by more than ``tolerance`` x ``max_steps``: the guard filtered their data unevenly."""
    for arm, by_seed in runs.items():
        ref = runs.get(reference_arm(arm, reference), {})
        for seed, run in by_seed.items():
            if seed in ref and ref[seed] != run and abs(skipped(run) - skipped(ref[seed])) > tolerance * max_steps:
                raise StudyError(f"{arm} and {reference_arm(arm, reference)} (seed {seed}) skipped "
                                 f"{skipped(run)} and {skipped(ref[seed])} of {max_steps} updates, more apart than "
                                 f"--skip-tolerance {tolerance:g}: their paired difference is not reported "
                                 f"(--allow-skip-mismatch reports it anyway)")


def interval_table(runs: dict[str, dict[int, Path]], max_steps: int, out: Path, reference: str = "next-token") -> str:
    """Markdown: per arm, final test accuracy with its 95% CI over seeds; the paired difference to
    the ``reference`` arm (same seed, hence the same data order, and the same prompt attention) with
    its 95% CI and wins / ties / losses; CPU seconds per run; forwards per generated token of the
    final evaluation (mean over seeds: below 1 where register drafts were accepted); the updates the
    blow-up guard skipped, per seed."""
    from mutor2d.evaluation.study_tables import t95     # imports torch
    final = {arm: {s: records_of(r)[max_steps] for s, r in by.items()} for arm, by in runs.items()}
    acc = {arm: {s: rec["metrics"]["accuracy"] for s, rec in by.items()} for arm, by in final.items()}
    cpu = cpu_seconds(out)
    lines = [f"| arm | seeds | accuracy [95% CI] | minus {reference} [95% CI] | wins / ties / losses | CPU s per run "
             "| forwards per token | skipped updates per seed |", "|---|---|---|---|---|---|---|---|"]
    for arm, by_seed in acc.items():
        mean, half = t95(list(by_seed.values()))
        ref = acc.get(reference_arm(arm, reference), {})
        paired = [by_seed[s] - ref[s] for s in by_seed if s in ref]
        if arm == reference_arm(arm, reference) or not paired:
            diff, record = "—", "—"
        else:
            d, h = t95(paired)
            diff = f"{d:+.3f} [{d - h:+.3f}, {d + h:+.3f}]"
            record = f"{sum(x > 0 for x in paired)} / {sum(x == 0 for x in paired)} / {sum(x < 0 for x in paired)}"
        costs = [cpu[r.name] for r in runs[arm].values() if r.name in cpu]
        cost = f"{statistics.mean(costs):.0f}" if costs else "-"
        fpt = [f for f in map(forwards_per_token, final[arm].values()) if f is not None]
        fpt_text = f"{statistics.mean(fpt):.3f}" if fpt else "-"
        skips = ", ".join(str(skipped(runs[arm][s])) for s in sorted(by_seed))
        lines.append(f"| {arm} | {len(by_seed)} | {mean:.3f} [{mean - half:.3f}, {mean + half:.3f}] | {diff} | "
                     f"{record} | {cost} | {fpt_text} | {skips} |")
    return "\n".join(lines)


def accuracy_curves(by_seed: dict[int, Path]) -> list[dict[int, float]]:
    """Per seed's run: its online test accuracy by step."""
    return [{s: r["metrics"]["accuracy"] for s, r in records_of(run).items()} for run in by_seed.values()]


def curve_table(runs: dict[str, dict[int, Path]]) -> str:
    """Markdown: mean test accuracy over seeds at every evaluated step."""
    curves = {m: accuracy_curves(by_seed) for m, by_seed in runs.items()}
    steps = sorted(set.intersection(*(set(c) for cs in curves.values() for c in cs)))
    lines = ["| method | " + " | ".join(f"step {s}" for s in steps) + " |", "|---" * (len(steps) + 1) + "|"]
    for method, cs in curves.items():
        lines.append(f"| {method} | " + " | ".join(f"{statistics.mean(c[s] for c in cs):.3f}" for s in steps) + " |")
    return "\n".join(lines)


def figure(path: Path, title: str, draw) -> Path:
    """``draw(ax)`` on a new figure of test accuracy against training step, saved to ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    draw(ax)
    ax.set(xlabel="training step", ylabel="test accuracy (exact match)", title=title)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def plot(runs: dict[str, dict[int, Path]], path: Path, title: str) -> Path:
    """Test accuracy against training step: each seed faint, the mean over seeds bold."""
    def draw(ax):
        for k, (method, by_seed) in enumerate(runs.items()):
            curves = accuracy_curves(by_seed)
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            for c in curves:
                ax.plot(sorted(c), [c[s] for s in sorted(c)], color=f"C{k}", alpha=0.25, lw=1)
            ax.plot(steps, [statistics.mean(c[s] for c in curves) for s in steps], color=f"C{k}", lw=2, label=method)
    return figure(path, title, draw)


BOOTSTRAP_DRAWS = 2000


def correctness(run: Path, step: int) -> np.ndarray:
    """0/1 per test item (in item order) of the run's online evaluation at ``step``."""
    path = next((run / "eval").glob(f"predictions_*_step{step}.jsonl"))
    items = sorted(load_jsonl(path), key=lambda it: it["index"])
    return np.array([bool(it["correct"]) for it in items], dtype=float)


def bootstrap(runs: dict[str, dict[int, Path]], reference: str, seed: int = 0) -> dict:
    """{step: {arm: {"acc": (mean, lo, hi), "diff": (mean, lo, hi) or None}}}: 95% percentile
    intervals from one bootstrap over seeds and test items together. Each draw resamples the seeds
    (with replacement) and the items (with replacement) once, shared by every arm, so an arm's
    difference to ``reference`` is paired by seed and by item."""
    steps = sorted(set.intersection(*(set(records_of(r)) for by in runs.values() for r in by.values())))
    seeds = sorted(set.intersection(*(set(by) for by in runs.values())))
    rng = np.random.default_rng(seed)
    out = {}
    for step in steps:
        c = {arm: np.stack([correctness(by[s], step) for s in seeds]) for arm, by in runs.items()}  # (S, N)
        n_seeds, n_items = next(iter(c.values())).shape
        s_idx = rng.integers(0, n_seeds, (BOOTSTRAP_DRAWS, n_seeds))
        i_idx = rng.integers(0, n_items, (BOOTSTRAP_DRAWS, n_items))
        draws = {arm: np.array([m[si][:, ii].mean() for si, ii in zip(s_idx, i_idx)]) for arm, m in c.items()}
        row = {}
        for arm, d in draws.items():
            acc = (float(c[arm].mean()), *map(float, np.percentile(d, [2.5, 97.5])))
            diff = None
            if arm != reference and reference in draws:
                dd = d - draws[reference]
                diff = (float(c[arm].mean() - c[reference].mean()), *map(float, np.percentile(dd, [2.5, 97.5])))
            row[arm] = {"acc": acc, "diff": diff}
        out[step] = row
    return out


def bootstrap_table(boot: dict, reference: str) -> str:
    """Markdown: per step and arm, accuracy and the paired difference to ``reference`` [95% CI]."""
    lines = [f"| step | arm | accuracy [95% CI] | minus {reference} [95% CI] |", "|---|---|---|---|"]
    for step, row in boot.items():
        for arm, v in row.items():
            m, lo, hi = v["acc"]
            diff = "—" if v["diff"] is None else "{:+.3f} [{:+.3f}, {:+.3f}]".format(*v["diff"])
            lines.append(f"| {step} | {arm} | {m:.3f} [{lo:.3f}, {hi:.3f}] | {diff} |")
    return "\n".join(lines)


def plot_bands(boot: dict, path: Path, title: str) -> Path:
    """Accuracy against training step per arm: the mean line and its 95% bootstrap band."""
    def draw(ax):
        steps = sorted(boot)
        for k, arm in enumerate(boot[steps[0]]):
            m, lo, hi = zip(*(boot[s][arm]["acc"] for s in steps))
            ax.plot(steps, m, color=f"C{k}", lw=2, marker="o", label=arm)
            ax.fill_between(steps, lo, hi, color=f"C{k}", alpha=0.2)
    return figure(path, title, draw)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    ap.add_argument("--task", choices=list(TASKS), default="arith", help="the task")
    ap.add_argument("--out", default=None, help="study folder (data, models, runs, table.md; default "
                                                "runs/lm_study for arith, runs/lm_stargraph for stargraph)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default 0 1 2)")
    ap.add_argument("--max-steps", type=int, default=None, help="training steps per run (default: the study's)")
    ap.add_argument("--plot", default=None, help="plot file (default OUT/lm_study.png, OUT/lm_stargraph.png)")
    ap.add_argument("--quick", action="store_true", help="a tiny version for CI (one seed, a few steps)")
    ap.add_argument("--skip-tolerance", type=float, default=SKIP_TOLERANCE,
                    help="paired arms may differ in skipped updates by this share of the steps (default 0.01)")
    ap.add_argument("--allow-skip-mismatch", action="store_true",
                    help="report paired differences even when the arms' skipped updates differ by more")
    ap.add_argument("--bases", default="runs/bases", help="shared pretrained bases, one folder per recipe's key "
                                                          "(BASES/KEY12; reused by every study of that recipe)")
    ap.add_argument("--allow-mixed-bases", action="store_true",
                    help="pair arms whose runs fine-tuned different initial weights (refused by default)")
    return ap


STEPS_LIMIT = 10 ** 7     # --max-steps (10**12 trained for ever)


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """argparse's one-line error for a flag that would be taken as not given ('', 0) or run for ever,
    or a folder flag naming a file; before anything is written."""
    if not 0 <= args.skip_tolerance < 1:
        ap.error(f"--skip-tolerance {args.skip_tolerance}: expected a share of the steps in [0, 1)")
    if args.max_steps is not None and not 1 <= args.max_steps <= STEPS_LIMIT:
        ap.error(f"--max-steps {args.max_steps}: expected 1..{STEPS_LIMIT}")
    for flag, value, what, folder in (("--out", args.out, "a study folder", True),
                                      ("--bases", args.bases, "a folder of bases", True),
                                      ("--plot", args.plot, "a .png path", False)):
        if value is not None and (not value.strip() or (folder and Path(value).is_file())):
            ap.error(f"{flag} {value!r}: expected {what}")


def main(argv=None) -> str:
    ap = build_parser()
    args = ap.parse_args(argv)
    check_args(ap, args)
    task = TASKS[args.task]
    size = task.quick if args.quick else task.size
    if args.max_steps is not None:
        size = dataclasses.replace(size, max_steps=args.max_steps)
    import torch
    torch.set_num_threads(1)                 # the study machine is shared; 2 threads ran slower here
    out = Path(args.out or f"runs/{task.stem}")
    runs, shared = run_all(out, task, size, args.seeds[:1] if args.quick else args.seeds, Path(args.bases))
    bases = check_bases(runs, args.allow_mixed_bases)
    if not args.allow_skip_mismatch:
        check_skips(runs, size.max_steps, task.reference, args.skip_tolerance)
    text = (table(runs, size.max_steps) + "\n\nIntervals and paired differences:\n\n"
            + interval_table(runs, size.max_steps, out, task.reference) + "\n\nMean test accuracy by step:\n\n" + curve_table(runs))
    boot = bootstrap(runs, task.reference) if task.bootstrap else None
    if boot:
        text += ("\n\nPer step, intervals over seeds and test items (paired bootstrap, "
                 f"{BOOTSTRAP_DRAWS} draws):\n\n" + bootstrap_table(boot, task.reference))
    (out / "table.md").write_text(text + "\n")
    write_summary(out, args.task, runs, size, bases, shared, boot)
    print(text)
    path = Path(args.plot or out / f"{task.stem}.png")
    print(f"plot: {plot_bands(boot, path, task.title) if boot else plot(runs, path, task.title)}", file=sys.stderr)
    return text


if __name__ == "__main__":
    try:
        main()
    except StudyError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
