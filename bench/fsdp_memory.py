"""Peak memory per process of sharded (FSDP2) against replicated (DDP) training, on CPU processes over
gloo, at a width where weights and optimizer states dominate (a batch of a few short sequences).

Each case is a fresh ``torchrun`` launch of this file (EXACT_RSS_ENV, bench/common.py); each process
reports its peak RSS over ``--steps`` steps above its RSS before the run is built; the table gives the
largest. Theory (P parameters, N processes, fp32): DDP 16P + 4P of gradient buckets; FSDP 16P/N plus
about 12 bytes per parameter of the largest block.

    python bench/fsdp_memory.py [--dim 1024] [--layers 4] [--heads 8] [--steps 3] [--processes 2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

import common  # noqa: E402  (the command line parses and checks before torch is imported)
from mutor2d.cli import HelpFormatter  # noqa: E402

MiB = 1024 ** 2


def worker(args) -> None:
    """One process of a launch: peak RSS above the pre-build baseline -> JSON line (rank 0, all ranks)."""
    import tempfile
    import torch
    import torch.distributed as dist
    from mutor2d import config as C
    from mutor2d.engine.loop import train_step
    from mutor2d.run_configs import run_kind
    torch.set_num_threads(1)
    from mutor2d.data.tokens import build_dataset
    from mutor2d.engine.setup import build_run, build_scheduler, make_accelerator  # noqa: F401 (imports timm)
    import timm.utils  # noqa: F401
    cfg = C.from_dict(C.apply_overrides({}, [
        "model.preset=custom", f"model.n_layer={args.layers}", f"model.n_head={args.heads}",
        f"model.dim={args.dim}", "objective.name=ntp", "data.name=digits", "data.levels=5",
        f"train.batch_size={2 * args.processes}", f"train.max_steps={args.steps}", "train.tracker=none",
        "train.mixed_precision=no", f"train.sharding={args.sharding}", "train.ckpt_every=0"]))
    tmp = tempfile.mkdtemp()
    make_accelerator(cfg, Path(tmp)), build_dataset(cfg.data, "train")   # libraries and data: the baseline
    base = common.rss_bytes()
    run = build_run(cfg, tmp, None, run_kind(cfg.task)())
    built = common.rss_bytes()
    common.reset_peak_rss()                      # the peak of the steps, above what the build left
    batches = iter(run.loader)
    for step in range(args.steps):
        train_step(run, batches, step)
    mine = {"built_MiB": (built - base) / MiB, "peak_MiB": (max(common.peak_rss_bytes(), built) - base) / MiB,
            "params_M": sum(p.numel() for p in run.model.parameters()) / 1e6}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if dist.get_rank() == 0:
        print(json.dumps(every), flush=True)
    dist.destroy_process_group()


def measure(args, sharding: str) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.processes), __file__,
           "--worker", "--sharding", sharding, *sum([[f"--{k}", str(getattr(args, k))] for k in
                                                    ("dim", "layers", "heads", "steps", "processes")], [])]
    env = {**os.environ, **common.EXACT_RSS_ENV, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
                       preexec_fn=common.die_with_parent)      # its workers hung on once this process was killed
    lines = [line for line in r.stdout.splitlines() if line.startswith("[{")]
    if r.returncode != 0 or not lines:
        raise SystemExit(f"error: {sharding} launch failed: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(lines[-1])


def theory(args, params: float) -> dict:
    """Bytes per process from the parameter count (see module doc)."""
    from mutor2d.model.config import Shape
    s = Shape(args.layers, args.heads, args.dim)
    block = 4 * s.dim * s.dim + 3 * s.dim * s.ffn_dim + 2 * s.dim
    ddp, fsdp = 20 * params, 16 * params / args.processes + 12 * block
    return {"ddp_MiB": ddp / MiB, "fsdp_MiB": fsdp / MiB, "ratio": fsdp / ddp, "states_ratio": 1 / args.processes}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    ap.add_argument("--dim", type=int, default=1024, help="model width")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks")
    ap.add_argument("--heads", type=int, default=8, help="attention heads")
    ap.add_argument("--steps", type=int, default=3, help="training steps per measured run")
    ap.add_argument("--processes", type=int, default=2, help="CPU processes (gloo) of each run")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sharding", default="fsdp", help=argparse.SUPPRESS)
    return ap


def parse(argv=None) -> argparse.Namespace:
    """The options, checked before torch is imported."""
    ap = build_parser()
    args = ap.parse_args(argv)
    common.check_at_least(ap, args, 1, "dim", "layers", "heads", "steps", "processes")
    if args.dim % args.heads:
        ap.error(f"--dim {args.dim} is not divisible by --heads {args.heads}")
    return args


def main() -> None:
    args = parse()
    if args.worker:
        return worker(args)
    import torch
    rows = {sharding: measure(args, sharding) for sharding in ("ddp", "fsdp")}
    params = rows["ddp"][0]["params_M"] * 1e6
    peak = {k: max(r["peak_MiB"] for r in v) for k, v in rows.items()}
    built = {k: max(r["built_MiB"] for r in v) for k, v in rows.items()}
    common.emit({"bench": "fsdp_memory", "machine": common.machine(torch.device("cpu")),
                 "config": {k: v for k, v in vars(args).items() if k not in ("worker", "sharding")}
                 | {"params_M": params / 1e6}, "peak_MiB": peak, "built_MiB": built,
                 "measured_ratio": peak["fsdp"] / peak["ddp"], "theory": theory(args, params)})


if __name__ == "__main__":
    main()
