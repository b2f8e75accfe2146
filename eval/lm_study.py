"""CPU-scale language study: next-token vs MuToR-1D (vs the multi-head baseline) on a synthetic task.

    python eval/lm_study.py --out runs/lm_study [--seeds 0 1 2] [--plot docs/lm_study.png]
    python eval/lm_study.py --task stargraph --out runs/lm_stargraph [--plot docs/lm_stargraph.png]
    python eval/lm_study.py [--task stargraph] --quick --out /tmp/lm_study_quick   # seconds (CI)

Tasks (a task is data + tokenizer + scorer + methods; the study is the same for every task):

* ``arith`` (default): multi-step arithmetic word problems in GSM8K's format (mutor2d.lm.arith),
  character tokenizer, GSM8K exact match of the final number; next-token, MuToR-1D d_max 2 and 4,
  multi-head d_max 4 (a = 0.3).
* ``stargraph``: path-star graphs (mutor2d.stargraph via mutor2d.lm.data.stargraph_records), one
  word per node id / delimiter (word tokenizer), exact match of the whole answer path (kind
  ``path``); next-token and MuToR-1D with the authors' star-graph setting d = 2..4, a = 0.5.
  Degree 2, path length 5, 20 node labels, Llama init std 0.08 (at 50 labels and 5,000 graphs
  next-token memorised the training graphs; at init 0.02 the image path's runs stayed on the plateau).

A training split and a held-out test split (no test item equal to a training one: the same question,
or the same graph and query). Model: a small Llama built from a LlamaConfig (random init, one per
seed), trained from scratch (full fine-tuning) through train.py, once per method and seed. Accuracy:
greedy answers to the test split, by the online evaluation hook (eval.path; train.eval_every gives
the accuracy-vs-step curve). Resumable: a finished run (its final record and saved model) is
skipped, an unfinished one continues from its last checkpoint (--resume auto). Writes OUT/table.md
(also printed: final accuracy per method and the mean accuracy at every evaluated step) and the plot.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from mutor2d.cli import HelpFormatter

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


def arith_records(size: Size, count: int, seed: int) -> list[dict]:
    from mutor2d.lm.arith import arith_records as records
    return records(count, list(size.shape), seed=seed)


def arith_tokenizer(size: Size):
    from mutor2d.lm.arith import arith_alphabet
    from mutor2d.lm.data import char_tokenizer
    return char_tokenizer(arith_alphabet())


def stargraph_records(size: Size, count: int, seed: int) -> list[dict]:
    from mutor2d.lm.data import stargraph_records as records
    return records(*size.shape, count=count, seed=seed)


def graph_key(line: dict) -> tuple:
    """A star-graph line -> (its set of edges, its query): the graph, whatever the edge order."""
    edges, query = line["prompt"].split("/")
    return frozenset(e.strip() for e in edges.split("|") if e.strip()), query.strip()


def stargraph_tokenizer(size: Size):
    """One word per node id (0..num_nodes-1) and per delimiter (edge end |, query /, answer =)."""
    from mutor2d.lm.data import word_tokenizer
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


A = 0.3                                     # the paper's loss weight of the auxiliary term (LM setting)
A_STAR = 0.5                                # the authors' star-graph setting: d = 2..4, a = 0.5
TASKS = {
    "arith": Task(
        arith_records, lambda line: line["question"], arith_tokenizer, {"name": "gsm8k"},
        {"next-token": {"name": "ntp"},
         "mutor-1d d_max=2": {"name": "mutor-1d", "d_max": 2, "reg_weight": A},
         "mutor-1d d_max=4": {"name": "mutor-1d", "d_max": 4, "reg_weight": A},
         "multihead d_max=4": {"name": "multihead", "d_max": 4, "reg_weight": A}},
        Size(),
        Size(train=64, test=8, shape=(1,), hidden=16, layers=1, heads=2, max_steps=4, batch=8, eval_every=2,
             max_new_tokens=12),
        "lm_study", "synthetic arithmetic, char-level Llama"),
    "stargraph": Task(
        stargraph_records, graph_key, stargraph_tokenizer, {"name": "jsonl", "kind": "path"},
        {"next-token": {"name": "ntp"},
         "mutor-1d d=2..4": {"name": "mutor-1d", "d_min": 2, "d_max": 4, "reg_weight": A_STAR}},
        Size(train=5000, test=500, shape=(2, 5, 20), max_steps=3000, eval_every=250, max_new_tokens=8,
             init_std=0.08),
        Size(train=64, test=8, shape=(2, 3, 20), hidden=16, layers=1, heads=2, max_steps=4, batch=8,
             eval_every=2, max_new_tokens=6),
        "lm_stargraph", "path-star graph, word-level Llama"),
}


def write_data(out: Path, task: Task, size: Size) -> tuple[Path, Path]:
    """Training and held-out test splits (jsonl lines); no test line shares its key with a training line."""
    from mutor2d.lm.data import write_jsonl
    out.mkdir(parents=True, exist_ok=True)
    train = task.records(size, size.train, 0)
    seen = {task.key(r) for r in train}
    test = [r for r in task.records(size, 2 * size.test, 1) if task.key(r) not in seen]
    write_jsonl(train, out / "train.jsonl")
    write_jsonl(test[:size.test], out / "test.jsonl")
    return out / "train.jsonl", out / "test.jsonl"


def write_base(folder: Path, task: Task, size: Size, seed: int) -> Path:
    """A randomly initialised small Llama (seeded) and the task's tokenizer, as a model folder."""
    from mutor2d.lm.tiny import write_tiny_llama
    return write_tiny_llama(folder, task.tokenizer(size), size.hidden, size.layers, size.heads, seed,
                            init_std=size.init_std)


def run_config(base: Path, train: Path, test: Path, objective: dict, size: Size, seed: int,
               scoring: dict) -> dict:
    return {"task": "lm",
            "model": {"hf": str(base), "finetune": "full", "dtype": "float32"},
            "data": {"name": scoring["name"], "path": str(train), "max_prompt_len": 160, "max_answer_len": 64},
            "objective": objective,
            "optim": {"lr": size.lr, "betas": [0.9, 0.95], "weight_decay": 0.0, "schedule": "cosine",
                      "warmup_steps": size.max_steps // 10, "min_lr": size.lr / 10},
            "train": {"batch_size": size.batch, "max_steps": size.max_steps, "seed": seed, "log_every": 10,
                      "ckpt_every": max(size.max_steps // 2, 1), "eval_every": size.eval_every,
                      "mixed_precision": "no", "tracker": "none"},
            "eval": {"path": str(test), **scoring, "max_new_tokens": size.max_new_tokens,
                     "batch_size": 100, "stop": []}}


def records_of(run: Path) -> dict[int, dict]:
    """The run's online accuracy records by step."""
    out = {}
    for f in sorted((run / "eval").glob("*.json")):
        rec = json.loads(f.read_text())
        out[int(rec["step"])] = rec
    return out


def finished(run: Path, max_steps: int) -> bool:
    return (run / "config.json").is_file() and max_steps in records_of(run)


def train_py():
    spec = importlib.util.spec_from_file_location("train_entry", ROOT / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_all(out: Path, task: Task, size: Size, seeds: list[int]) -> dict[str, dict[int, Path]]:
    """Train every (method, seed) not yet finished through train.py; -> run folders by method, seed."""
    train, test = write_data(out / "data", task, size)
    entry, runs = train_py(), {}
    for seed in seeds:
        base = write_base(out / f"base_s{seed}", task, size, seed)
        for method, objective in task.methods.items():
            run = out / "runs" / f"{objective['name']}_d{objective.get('d_max', 1)}_s{seed}"
            runs.setdefault(method, {})[seed] = run
            if finished(run, size.max_steps):
                continue
            config = out / "configs" / f"{run.name}.yaml"
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(yaml.safe_dump(run_config(base, train, test, objective, size, seed, task.scoring),
                                            sort_keys=False))
            t0, c0 = time.time(), time.process_time()
            entry.main(["--config", str(config), "--out", str(run), "--resume", "auto"])
            print(f"{run.name}: {time.time() - t0:.0f} s wall, {time.process_time() - c0:.0f} s CPU",
                  file=sys.stderr, flush=True)
    return runs


def final_loss(run: Path) -> float | None:
    from mutor2d.engine.hooks import read_log
    rows = [r for r in read_log(run) if "loss_ntp" in r]
    return rows[-1]["loss_ntp"] if rows else None


def table(runs: dict[str, dict[int, Path]], max_steps: int) -> str:
    """Markdown: final test accuracy (mean ± std over seeds, each seed) and final next-token loss."""
    lines = ["| method | seeds | test accuracy (mean ± std) | per seed | final train CE_ntp |",
             "|---|---|---|---|---|"]
    for method, by_seed in runs.items():
        acc = [records_of(r)[max_steps]["metrics"]["accuracy"] for r in by_seed.values()]
        loss = [v for v in (final_loss(r) for r in by_seed.values()) if v is not None]
        sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
        ce = f"{statistics.mean(loss):.3f}" if loss else "-"
        lines.append(f"| {method} | {len(acc)} | {statistics.mean(acc):.3f} ± {sd:.3f} | "
                     f"{', '.join(f'{a:.3f}' for a in acc)} | {ce} |")
    return "\n".join(lines)


def curve_table(runs: dict[str, dict[int, Path]]) -> str:
    """Markdown: mean test accuracy over seeds at every evaluated step."""
    curves = {m: [{s: r["metrics"]["accuracy"] for s, r in records_of(run).items()} for run in by_seed.values()]
              for m, by_seed in runs.items()}
    steps = sorted(set.intersection(*(set(c) for cs in curves.values() for c in cs)))
    lines = ["| method | " + " | ".join(f"step {s}" for s in steps) + " |", "|---" * (len(steps) + 1) + "|"]
    for method, cs in curves.items():
        lines.append(f"| {method} | " + " | ".join(f"{statistics.mean(c[s] for c in cs):.3f}" for s in steps) + " |")
    return "\n".join(lines)


def plot(runs: dict[str, dict[int, Path]], path: Path, title: str) -> Path:
    """Test accuracy against training step: each seed faint, the mean over seeds bold."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, (method, by_seed) in enumerate(runs.items()):
        curves = [{s: r["metrics"]["accuracy"] for s, r in records_of(run).items()} for run in by_seed.values()]
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        for c in curves:
            ax.plot(sorted(c), [c[s] for s in sorted(c)], color=f"C{k}", alpha=0.25, lw=1)
        ax.plot(steps, [statistics.mean(c[s] for c in curves) for s in steps], color=f"C{k}", lw=2, label=method)
    ax.set(xlabel="training step", ylabel="test accuracy (exact match)", title=title)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    ap.add_argument("--task", choices=list(TASKS), default="arith", help="the task")
    ap.add_argument("--out", default=None, help="study folder (data, models, runs, table.md; default "
                                                "runs/lm_study for arith, runs/lm_stargraph for stargraph)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default 0 1 2)")
    ap.add_argument("--max-steps", type=int, default=None, help="training steps per run (default: the study's)")
    ap.add_argument("--plot", default=None, help="plot file (default OUT/lm_study.png, OUT/lm_stargraph.png)")
    ap.add_argument("--quick", action="store_true", help="a tiny version for CI (one seed, a few steps)")
    return ap


def main(argv=None) -> str:
    args = build_parser().parse_args(argv)
    task = TASKS[args.task]
    size = task.quick if args.quick else task.size
    if args.max_steps:
        size = dataclasses.replace(size, max_steps=args.max_steps)
    import torch
    torch.set_num_threads(1)                 # the study machine is shared; 2 threads ran slower here
    out = Path(args.out or f"runs/{task.stem}")
    runs = run_all(out, task, size, args.seeds[:1] if args.quick else args.seeds)
    text = table(runs, size.max_steps) + "\n\nMean test accuracy by step:\n\n" + curve_table(runs)
    (out / "table.md").write_text(text + "\n")
    print(text)
    print(f"plot: {plot(runs, Path(args.plot or out / f'{task.stem}.png'), task.title)}", file=sys.stderr)
    return text


if __name__ == "__main__":
    main()
