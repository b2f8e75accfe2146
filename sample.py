"""Make images from a training checkpoint.

PNG grid (rows = classes):
    python sample.py --ckpt runs/digits [--classes 1,7,9] [--per-class 8] [--cfg 2.0] [--out grid.png]
Class-balanced npz for evaluation (N / classes per class), sharded over processes, resumable:
    accelerate launch sample.py --ckpt RUN --num 50000 --npz samples.npz --cfg 2.0 --batch-size 125
(on CPUs only: torchrun --nproc_per_node 2 --no-python -- python sample.py ...). The npz is the
same for any number of processes; rerunning an interrupted command finishes it.

--ckpt takes a checkpoint file or a run folder (its newest valid checkpoint). Sampling defaults
come from the checkpoint's ``sample`` config section. --temperature 0 is greedy decoding.
The token grid is the one the checkpoint records, else its dataset's (--grid HxW overrides).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from mutor2d import checkpoint, data
from mutor2d.sample_files import (NpzJob, balanced_labels, make_sampler, parse_classes, sample_batches,
                                  save_grid, spread_classes)
from mutor2d.sampling import check_settings, compile_decoder


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint file or run folder")
    p.add_argument("--out", help="PNG grid path (default RUN/samples/sample_stepXXXXXXXX.png)")
    p.add_argument("--classes", help="comma-separated class indices (default: config, else a spread)")
    p.add_argument("--per-class", type=int, help="grid columns: samples per class")
    p.add_argument("--num", type=int, help="with --npz: number of samples, a multiple of the class count")
    p.add_argument("--npz", help="write a class-balanced sample file instead of a grid")
    p.add_argument("--cfg", type=float, help="classifier-free guidance scale (1 = off)")
    p.add_argument("--temperature", type=float, help="0 = greedy")
    p.add_argument("--top-k", type=int, help="0 = off")
    p.add_argument("--top-p", type=float, help="1 = off")
    p.add_argument("--seed", type=int)
    p.add_argument("--batch-size", type=int, default=64,
                   help="samples per forward; npz: per shard (the file depends on it, not on the process count)")
    p.add_argument("--grid", help="token grid HxW (default: from the checkpoint's dataset)")
    p.add_argument("--ema", action=argparse.BooleanOptionalAction, default=True,
                   help="use the EMA weights when the checkpoint has them")
    p.add_argument("--compile", action="store_true", help="torch.compile the decoding step")
    p.add_argument("--device", help="default: the accelerate process's device (cuda if present)")
    return p.parse_args(argv)


def peek(path: Path) -> dict:
    """The checkpoint dict, memory-mapped (tensors are not read), for its small entries."""
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except RuntimeError:    # not a zip-format file: nothing to peek at
        return {}


def token_grid(text: str | None, path: Path, cfg) -> tuple[int, int]:
    """--grid, else the grid the checkpoint records (training writes "grid"), else the dataset's."""
    if text is not None:
        try:
            H, W = (int(v) for v in text.lower().split("x"))
        except ValueError:
            raise ValueError(f"--grid {text!r}: expected HxW, e.g. 16x16") from None
        return H, W
    recorded = peek(path).get("grid")
    if recorded is not None:
        return tuple(int(v) for v in recorded)
    try:
        return tuple(data.build_dataset(cfg.data, "train").grid)
    except (ValueError, OSError) as e:
        raise ValueError(f"cannot find the token grid from the checkpoint's data ({e}); pass --grid HxW") from None


def tokenizer_to(tokenizer, device: torch.device):
    """Move a tokenizer with weights (a module, or an object holding one as ``.model``) to ``device``."""
    if isinstance(tokenizer, torch.nn.Module):
        return tokenizer.to(device).eval()
    if isinstance(getattr(tokenizer, "model", None), torch.nn.Module):
        tokenizer.model.to(device)
    return tokenizer


def pick(value, default):
    """A command-line value, or the config's default when the flag was not given."""
    return default if value is None else value


def run(argv=None) -> None:
    args = parse_args(argv)
    from accelerate import PartialState
    on_cpu = not torch.cuda.is_available() or (args.device or "").startswith("cpu")
    state = PartialState(cpu=on_cpu)      # cpu=True: several processes talk over gloo
    if args.device and state.num_processes > 1 and not on_cpu:
        raise ValueError(f"--device {args.device}: not with several processes (each process gets its own GPU)")
    device = torch.device(args.device) if args.device else state.device

    path = checkpoint.resolve(args.ckpt).resolve()
    model, cfg, step = checkpoint.load_model(path, use_ema=args.ema, device=device)
    if cfg.model.prefix != "class":
        raise ValueError(f"{path}: sample.py makes images from class-conditional models, this one has "
                         f"model.prefix={cfg.model.prefix!r}")
    try:
        tokenizer = data.build_tokenizer(cfg.data)
    except (ValueError, OSError) as e:
        raise ValueError(f"tokenizer of {path}: {e}") from None
    tokenizer = tokenizer_to(tokenizer, device)
    grid = token_grid(args.grid, path, cfg)

    s = cfg.sample
    settings = dict(cfg_scale=pick(args.cfg, s.cfg_scale), temperature=pick(args.temperature, s.temperature),
                    top_k=pick(args.top_k, s.top_k), top_p=pick(args.top_p, s.top_p))
    check_settings(**settings)
    seed = pick(args.seed, s.seed)
    n_cls = cfg.model.num_classes
    if args.batch_size < 1:
        raise ValueError(f"--batch-size {args.batch_size}: expected >= 1")
    if args.compile:
        compile_decoder(model)
    sampler = make_sampler(model, tokenizer, grid, device=device, **settings)

    if args.npz is None:
        if args.num is not None:
            raise ValueError("--num goes with --npz (a grid takes --per-class)")
        classes = (parse_classes(args.classes, n_cls) if args.classes
                   else parse_classes(",".join(map(str, s.classes)), n_cls) if s.classes
                   else spread_classes(n_cls))
        per_class = pick(args.per_class, s.per_class)
        if per_class < 1:
            raise ValueError(f"--per-class {per_class}: expected >= 1")
        if not state.is_main_process:
            return
        images = sample_batches(sampler, balanced_labels(per_class * len(classes), classes), args.batch_size, seed)
        run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
        out = save_grid(images, per_class, args.out or run_dir / "samples" / f"sample_step{step:08d}.png")
        print(f"wrote {out} ({len(classes)} classes x {per_class}, step {step})")
        return

    if args.num is None or args.per_class is not None or args.out is not None:
        raise ValueError("--npz takes --num N (N / classes per class), not --per-class or --out")
    classes = parse_classes(args.classes, n_cls) if args.classes else list(range(n_cls))
    labels = balanced_labels(args.num, classes)
    meta = dict(checkpoint=str(path), step=step, config=cfg.to_dict(), **settings, seed=seed,
                per_class=args.num // len(classes), num=args.num, classes=classes,
                batch_size=args.batch_size, ema=args.ema and peek(path).get("ema") is not None, grid=list(grid))
    job = NpzJob(args.npz, labels, args.batch_size, seed, meta)
    if job.is_complete():
        if state.is_main_process:
            print(f"{job.out} is already complete")
        return
    todo = job.missing()              # every process lists the same shards before any is written
    state.wait_for_everyone()
    job.run(sampler, todo[state.process_index::state.num_processes], progress=state.is_main_process)
    state.wait_for_everyone()
    if state.is_main_process:
        job.assemble()
        print(f"wrote {job.out} ({args.num} samples, {len(classes)} classes, step {step})")


def main(argv=None) -> None:
    """The command line: library errors become one-line messages."""
    try:
        run(argv)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
