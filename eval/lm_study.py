"""CPU-scale language study: next-token vs MuToR-1D vs the multi-head baseline on synthetic arithmetic.

    python eval/lm_study.py --out runs/lm_study [--seeds 0 1 2] [--plot docs/lm_study.png]
    python eval/lm_study.py --quick --out /tmp/lm_study_quick          # a few seconds (CI)

Data: multi-step arithmetic word problems in GSM8K's format (mutor2d.lm.arith), a training split and
a held-out test split with no question of the training split. Model: a small Llama built from a
LlamaConfig (random init, one per seed) with a character-level tokenizer, trained from scratch (full
fine-tuning) through train.py, once per method and seed. Accuracy: greedy answers to the test split
scored by GSM8K exact match, by the online evaluation hook (eval.path; train.eval_every gives the
accuracy-vs-step curve). Resumable: a finished run (its final record and saved model) is skipped, an
unfinished one continues from its last checkpoint (--resume auto). Writes OUT/table.md (also printed:
final accuracy per method and the mean accuracy at every evaluated step) and the plot.
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

import yaml

from mutor2d.cli import HelpFormatter

ROOT = Path(__file__).resolve().parent.parent
A = 0.3                                     # the paper's loss weight of the auxiliary term
METHODS = {                                 # method -> objective section
    "next-token": {"name": "ntp"},
    "mutor-1d d_max=2": {"name": "mutor-1d", "d_max": 2, "reg_weight": A},
    "mutor-1d d_max=4": {"name": "mutor-1d", "d_max": 4, "reg_weight": A},
    "multihead d_max=4": {"name": "multihead", "d_max": 4, "reg_weight": A},
}


@dataclass
class Size:
    """The study's scale: data, model, training and evaluation."""
    train: int = 4000
    test: int = 200
    steps: tuple[int, ...] = (2,)
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    max_steps: int = 800
    batch: int = 32
    lr: float = 3e-3
    eval_every: int = 200
    max_new_tokens: int = 40


QUICK = Size(train=64, test=8, steps=(1,), hidden=16, layers=1, heads=2, max_steps=4, batch=8,
             eval_every=2, max_new_tokens=12)


def write_data(out: Path, size: Size) -> tuple[Path, Path]:
    """Training and held-out test splits (GSM8K lines); test questions never occur in training."""
    from mutor2d.lm.arith import arith_records
    from mutor2d.lm.data import write_jsonl
    out.mkdir(parents=True, exist_ok=True)
    train = arith_records(size.train, list(size.steps), seed=0)
    seen = {r["question"] for r in train}
    test = [r for r in arith_records(2 * size.test, list(size.steps), seed=1) if r["question"] not in seen]
    write_jsonl(train, out / "train.jsonl")
    write_jsonl(test[:size.test], out / "test.jsonl")
    return out / "train.jsonl", out / "test.jsonl"


def write_base(folder: Path, size: Size, seed: int) -> Path:
    """A randomly initialised small Llama (seeded) and its character tokenizer, as a model folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from mutor2d.lm.arith import arith_alphabet
    from mutor2d.lm.data import char_tokenizer
    if (folder / "config.json").is_file():
        return folder
    tok = char_tokenizer(arith_alphabet())
    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=size.hidden, intermediate_size=4 * size.hidden,
                                 num_hidden_layers=size.layers, num_attention_heads=size.heads,
                                 num_key_value_heads=size.heads, max_position_embeddings=256, pad_token_id=0,
                                 bos_token_id=1, eos_token_id=2)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def run_config(base: Path, train: Path, test: Path, objective: dict, size: Size, seed: int) -> dict:
    return {"task": "lm",
            "model": {"hf": str(base), "finetune": "full", "dtype": "float32"},
            "data": {"name": "gsm8k", "path": str(train), "max_prompt_len": 160, "max_answer_len": 64},
            "objective": objective,
            "optim": {"lr": size.lr, "betas": [0.9, 0.95], "weight_decay": 0.0, "schedule": "cosine",
                      "warmup_steps": size.max_steps // 10, "min_lr": size.lr / 10},
            "train": {"batch_size": size.batch, "max_steps": size.max_steps, "seed": seed, "log_every": 10,
                      "ckpt_every": max(size.max_steps // 2, 1), "eval_every": size.eval_every,
                      "mixed_precision": "no", "tracker": "none"},
            "eval": {"path": str(test), "name": "gsm8k", "max_new_tokens": size.max_new_tokens,
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


def run_all(out: Path, size: Size, seeds: list[int]) -> dict[str, dict[int, Path]]:
    """Train every (method, seed) not yet finished through train.py; -> run folders by method, seed."""
    train, test = write_data(out / "data", size)
    entry, runs = train_py(), {}
    for seed in seeds:
        base = write_base(out / f"base_s{seed}", size, seed)
        for method, objective in METHODS.items():
            run = out / "runs" / f"{objective['name']}_d{objective.get('d_max', 1)}_s{seed}"
            runs.setdefault(method, {})[seed] = run
            if finished(run, size.max_steps):
                continue
            config = out / "configs" / f"{run.name}.yaml"
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(yaml.safe_dump(run_config(base, train, test, objective, size, seed), sort_keys=False))
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


def plot(runs: dict[str, dict[int, Path]], path: Path) -> Path:
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
    ax.set(xlabel="training step", ylabel="test accuracy (exact match)", title="synthetic arithmetic, char-level Llama")
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    ap.add_argument("--out", default="runs/lm_study", help="study folder (data, models, runs, table.md)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default 0 1 2)")
    ap.add_argument("--max-steps", type=int, default=None, help="training steps per run (default: the study's)")
    ap.add_argument("--plot", default=None, help="plot file (default OUT/lm_study.png)")
    ap.add_argument("--quick", action="store_true", help="a tiny version for CI (one seed, a few steps)")
    return ap


def main(argv=None) -> str:
    args = build_parser().parse_args(argv)
    size = QUICK if args.quick else Size()
    if args.max_steps:
        size = dataclasses.replace(size, max_steps=args.max_steps)
    import torch
    torch.set_num_threads(1)                 # the study machine is shared; 2 threads ran slower here
    out = Path(args.out)
    runs = run_all(out, size, args.seeds[:1] if args.quick else args.seeds)
    text = table(runs, size.max_steps) + "\n\nMean test accuracy by step:\n\n" + curve_table(runs)
    (out / "table.md").write_text(text + "\n")
    print(text)
    print(f"plot: {plot(runs, Path(args.plot) if args.plot else out / 'lm_study.png')}", file=sys.stderr)
    return text


if __name__ == "__main__":
    main()
