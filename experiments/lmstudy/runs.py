"""The language study's runs (experiments/lm_study.py): data splits, the shared base, train.py per arm and seed."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import time
from pathlib import Path

import yaml

from mutor2d import provenance
from mutor2d.lm.records import write_jsonl
from mutor2d.lm.tiny import write_tiny_llama

from .tasks import Size, Task

ROOT = Path(__file__).resolve().parents[2]


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
    """The shared base's pretraining config (writes OUT/data/pretrain.jsonl and OUT/pretrain_init) and its key."""
    corpus = [r for r in task.corpus(size, size.pretrain_count, 7) if task.key(r) not in exclude]
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(corpus, out / "data" / "pretrain.jsonl")
    init = write_base(out / "pretrain_init", task, size, 1000)
    cfg = run_config(init, out / "data" / "pretrain.jsonl", None, {"name": "ntp"},
                     dataclasses.replace(size, max_steps=size.pretrain_steps, lr=3e-3), 1000, task.scoring)
    return cfg, base_key(cfg, out / "data" / "pretrain.jsonl", init)


def base_key(cfg: dict, corpus: Path, init: Path) -> str:
    """sha256 of the base's pretraining config (paths dropped), its inputs' fingerprints and the code identity."""
    recipe = {**cfg, "model": {k: v for k, v in cfg["model"].items() if k != "hf"},
              "data": {k: v for k, v in cfg["data"].items() if k != "path"}}
    ident = {"config": recipe, "corpus": provenance.fingerprint(corpus)["sha256"],
             "init": provenance.fingerprint(init)["sha256"],
             "code": provenance.code_key(provenance.code_identity())}
    return provenance.text_sha256(json.dumps(ident, sort_keys=True))


def pretrained_base(out: Path, task: Task, size: Size, exclude: set, entry, bases: Path) -> Path:
    """The shared base, trained once with next-token prediction into BASES/KEY12; reused or resumed."""
    cfg, key = base_recipe(out, task, size, exclude)
    run = bases / key[:12]
    if finished(run, size.pretrain_steps, records=False):
        print(f"reusing the shared base {key[:12]} ({run})", flush=True)
    else:
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
    """Train every unfinished (arm, seed) through train.py -> (run folders by arm, seed; the base's folder or None)."""
    train, test = write_data(out / "data", task, size)
    entry, runs, shared = train_py(), {}, None
    if size.pretrain_steps:
        seen = {task.key(r) for r in load_jsonl(train) + load_jsonl(test)}
        shared = pretrained_base(out, task, size, seen, entry, bases)
    for seed in seeds:
        base = shared or write_base(out / f"base_s{seed}", task, size, seed)
        for arm, (objective, mode) in arms(task).items():
            run = out / "runs" / run_name(objective, mode, seed, task)
            runs.setdefault(arm, {})[seed] = run
            if not finished(run, size.max_steps):
                cfg = run_config(base, train, test, objective, size, seed, task.scoring, mode, task.decode)
                timed(entry, out / "configs" / f"{run.name}.yaml", cfg, run, out)
    return runs, shared


def load_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def timed(entry, config: Path, cfg: dict, run: Path, out: Path) -> None:
    """train.py on ``cfg`` (written to ``config``) into ``run``, resumed; seconds into OUT/costs.jsonl."""
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    t0, c0 = time.time(), time.process_time()
    entry.main(["--config", str(config), "--out", str(run), "--resume", "auto"])
    cost = {"run": run.name, "wall_s": round(time.time() - t0, 1), "cpu_s": round(time.process_time() - c0, 1)}
    with open(out / "costs.jsonl", "a") as f:
        f.write(json.dumps(cost) + "\n")
    print(f"{run.name}: {cost['wall_s']:.0f} s wall, {cost['cpu_s']:.0f} s CPU", file=sys.stderr, flush=True)
