"""Sampling benchmark: KV-cache decoding vs full recompute, with and without CFG, torch.compile
on and off; and the GPT-B decode step against the machine's memory-bandwidth floor.

Rows: ``kv`` / ``kv_cfg`` (``generate`` with a KV cache, without / with CFG), ``recompute`` (no cache),
``*_compiled`` (``compile_decoder``), ``*_captured`` (CUDA graphs); ``speculative``: plain vs register
drafts (``--drafts``, ``--last``) and Jacobi (``--windows``) on the same model, seed and labels (random
weights: the cost of a round, not a trained acceptance); ``--ckpt`` adds that table for a checkpoint per
``--spec-images``, and ``--crossover JSON`` writes the fastest mode per batch size (what ``--decode auto``
reads). Decode step: GPT-B, batch 4, all H*W positions, against weight bytes / read bandwidth.
Round-robin, median of ``--reps``; the last stdout line is JSON.

    python bench/sample.py                 # CPU: GPT-B width, 2 layers, 256 tokens; GPT-B step
    python bench/sample.py --quick         # seconds, for CI (no compile)
    python bench/sample.py --step-layers 0 --compile off --ckpt runs/digits_mutor2d --spec-images 1,50
    python bench/sample.py --step-layers 0 --compile off --ckpt RUN --spec-images 1,2,4,8,16,50 \
        --crossover mutor2d/sampling/crossover.json     # the table --decode auto reads
"""
from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

import common             # the command line parses and checks before torch is imported
from mutor2d.cli import HelpFormatter, grid_arg

if TYPE_CHECKING:
    import torch

    from mutor2d.model.gpt import GPT

TARGETS = {"kv_speedup_ge": 10.0, "cfg_cost_le": 2.1, "step_vs_floor_le": 2.0}


def build(args, n_layer: int, device: torch.device, register: bool = False) -> GPT:
    import torch

    from mutor2d.model.gpt import GPT
    from mutor2d.model.config import ModelConfig
    torch.manual_seed(0)
    cfg = ModelConfig(preset="custom", n_layer=n_layer, n_head=args.heads, dim=args.dim,
                      vocab_size=args.vocab, num_classes=1000)
    model = GPT(cfg, register_token=register).to(device).eval()
    with torch.no_grad():              # LlamaGen zero-inits the head; give it real logits
        model.output.weight.normal_(0, 0.02)
    return model


def recompute(model: GPT, labels: torch.Tensor, grid: tuple[int, int], generator) -> torch.Tensor:
    """Sample without a cache: step t runs the whole sequence prefix + x_0..x_{t-1}."""
    import torch

    from mutor2d.objectives.layout import regular_position_ids
    from mutor2d.sampling.rules import sample_logits
    B, N = labels.shape[0], grid[0] * grid[1]
    pos = regular_position_ids(grid, 1, N).to(labels.device).expand(B, N, 2)
    out = torch.empty(B, N, dtype=torch.long, device=labels.device)
    with torch.no_grad():
        for t in range(N):
            h = model.hidden(model.embed(out[:, :t], labels), pos[:, : t + 1])
            out[:, t] = sample_logits(model.logits(h[:, -1]), 1.0, generator=generator)
    return out


def decode_steps(model: GPT, batch: int, grid: tuple[int, int], device, captured: bool = False) -> callable:
    """A closure running the model alone over all H*W decode positions (no sampling); ``captured``:
    through mutor2d.sampling.captured's CapturedStep (one CUDA graph, captured at the first call)."""
    import torch

    from mutor2d.objectives.layout import regular_position_ids
    N = grid[0] * grid[1]
    pos = regular_position_ids(grid, 1, N).to(device).expand(batch, N, 2)
    labels = torch.arange(batch, device=device)
    tok = torch.randint(0, model.cfg.vocab_size, (batch, 1), device=device)
    if captured:
        from mutor2d.sampling.captured import CapturedStep, CudaGraphs
        model.setup_cache(batch, N)
        graph = CapturedStep(model, batch, CudaGraphs())

    @torch.no_grad()
    def run():
        if not captured:
            model.setup_cache(batch, N)
        model.decode(None, pos[:, :1], 0, prefix=labels)
        for t in range(1, N):
            (graph if captured else model.decode)(tok, pos[:, t:t + 1], t)
    return run


def int_list(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3] (empty string -> [])."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers >= 1")
    return values


def spec_modes(args) -> dict[str, tuple[str, dict]]:
    """Row name -> (decode mode, its options); with --crossover the three modes at their defaults."""
    if args.crossover:
        return {mode: (mode, {}) for mode in ("plain", "registers", "jacobi")}
    return {"plain": ("plain", {}), **{f"registers_k{k}": ("registers", dict(draft=k)) for k in args.drafts},
            **{f"registers_last_k{k}": ("registers", dict(draft=k, anchors="last")) for k in args.last},
            **{f"jacobi_k{k}": ("jacobi", dict(window=k)) for k in args.windows}}


def spec_table(model: GPT, labels: torch.Tensor, grid: tuple[int, int], args, device, *,
               cfg_scale: float, temperature: float, objective) -> dict:
    """Plain vs speculative decoding on one model (trained with ``objective``, whose registers give the
    draft offsets), round-robin: one row per mode."""
    import torch

    from mutor2d.sampling.decoding import generate
    from mutor2d.sampling.stats import DecodeStats
    modes = spec_modes(args)
    stats = {name: DecodeStats() for name in modes}

    def case(name: str, mode: str, options: dict):
        return lambda: generate(model, labels, grid, cfg_scale=cfg_scale, temperature=temperature,
                                generator=torch.Generator(device=device).manual_seed(0), decode=mode,
                                objective=objective, stats=stats[name], **options)
    times = common.time_round_robin({n: case(n, *m) for n, m in modes.items()}, args.reps, 1, device)
    n, N, plain = labels.shape[0], grid[0] * grid[1], times["plain"]
    rows = {}
    for name, counts in stats.items():
        t, st = times[name], counts.summary()
        rows[name] = {"time_s": t, "tokens_per_s": n * N / t, "wall_speedup": plain / t,
                      "forwards_per_image": st["forwards_per_sequence"],
                      "forward_reduction": N / st["forwards_per_sequence"],
                      "tokens_per_forward": st["tokens_per_forward"],
                      "acceptance_by_distance": st.get("acceptance_by_distance", []),
                      "register_acceptance_by_distance": st.get("register_acceptance_by_distance", [])}
    return {"images": n, "cfg_scale": cfg_scale, "temperature": temperature, "rows": rows}


def checkpoint_tables(args, device) -> dict:
    """``spec_table`` of the --ckpt model at each --spec-images batch size."""
    import torch

    from mutor2d.checkpoint import locate
    from mutor2d.sampling import images as generation
    src = generation.open_checkpoint(locate.resolve(args.ckpt).resolve(), device=device)
    model, n_cls = src.model.eval(), src.cfg.model.num_classes
    out = {"checkpoint": str(args.ckpt), "step": src.step, "grid": list(src.grid), "tables": {}}
    for n in args.spec_images:
        common.log(f"speculative rows: {args.ckpt}, {n} images")
        labels = torch.arange(n, device=device) % n_cls
        out["tables"][str(n)] = spec_table(model, labels, src.grid, args, device,
                                           cfg_scale=args.spec_cfg, temperature=args.spec_temperature,
                                           objective=src.cfg.objective)
    return out


def write_crossover(path: str, tables: dict, device: torch.device, machine: dict) -> None:
    """The fastest mode at each batch size of ``checkpoint_tables`` (all three; plain and jacobi only)
    into ``path`` (mutor2d/sampling/crossover.json, read by ``auto_decode``) for this device type;
    other device types' rows are kept."""
    import datetime
    import json
    import sys
    from pathlib import Path
    out = Path(path)
    data = json.loads(out.read_text()) if out.is_file() else {"devices": {}, "measured": {}}
    rows = []
    for n, table in sorted(tables["tables"].items(), key=lambda kv: int(kv[0])):
        times = {name: row["time_s"] for name, row in table["rows"].items()}
        rows.append({"images": int(n), "fastest": min(times, key=times.get),
                     "fastest_without_registers": min(("plain", "jacobi"), key=times.get),
                     "time_s": {k: round(v, 4) for k, v in times.items()}})
    data["devices"][device.type] = rows
    data["measured"][device.type] = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                                     "command": "python bench/sample.py " + " ".join(sys.argv[1:]),
                                     "checkpoint": tables["checkpoint"], "step": tables["step"],
                                     "machine": machine}
    out.write_text(json.dumps(data, indent=1) + "\n")


def weight_bytes(model: GPT) -> int:
    """Bytes of the parameters every decode step reads (embedding tables are only indexed)."""
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters()
               if not n.startswith(("tok_embeddings", "cls_embedding")))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, no compile, one thread (CI)")
    ap.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    ap.add_argument("--dim", type=int, default=768, help="model width (GPT-B: 768)")
    ap.add_argument("--heads", type=int, default=12, help="attention heads")
    ap.add_argument("--vocab", type=int, default=16384, help="image-token vocabulary (VQ-16: 16384)")
    ap.add_argument("--layers", type=int, default=None, help="depth of the throughput runs (default: 2 on CPU, 12 on GPU)")
    ap.add_argument("--step-layers", type=int, default=12, help="depth of the decode-step run (0 = skip)")
    ap.add_argument("--images", type=int, default=2, help="images per throughput run")
    ap.add_argument("--grid", type=grid_arg, default=(16, 16), help="token grid HxW")
    ap.add_argument("--cfg-scale", type=float, default=2.0, help="CFG scale of the throughput runs")
    ap.add_argument("--drafts", type=int_list, default=[1, 2, 3], help="register drafts K (after every input)")
    ap.add_argument("--last", type=int_list, default=[4], help="register drafts K after the last input only")
    ap.add_argument("--windows", type=int_list, default=[2, 4], help="Jacobi windows K")
    ap.add_argument("--ckpt", default=None, help="also time the speculative rows on this checkpoint (default: none)")
    ap.add_argument("--spec-images", type=int_list, default=[1, 50], help="--ckpt batch sizes")
    ap.add_argument("--spec-cfg", type=float, default=2.0, help="--ckpt CFG scale")
    ap.add_argument("--spec-temperature", type=float, default=1.0, help="--ckpt temperature")
    ap.add_argument("--crossover", metavar="JSON", help="with --ckpt: time plain / registers / jacobi at their "
                    "defaults per --spec-images and write the fastest into JSON (mutor2d/sampling/crossover.json; "
                    "default: no crossover)")
    ap.add_argument("--compile", choices=["on", "off"], default=None, help="default: on, off with --quick")
    ap.add_argument("--capture", choices=["on", "off"], default=None,
                    help="also time the plain rounds replayed as a CUDA graph (default: on on CUDA, else off)")
    common.add_timing_options(ap, 3)
    return ap


def parse(argv=None):
    """The options, checked before torch is imported (main resolves --device and the default --layers)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    common.check_at_least(ap, args, 1, "dim", "heads", "vocab", "layers", "images", "threads", "reps")
    common.check_reps(ap, args)
    common.check_at_least(ap, args, 0, "step_layers")
    if args.quick:
        args.dim, args.heads, args.vocab, args.grid, args.reps = 64, 2, 512, (8, 8), 2
        args.layers, args.step_layers = 1, min(args.step_layers, 2)
        args.drafts, args.last, args.windows, args.spec_images = [2], [2], [2], [2]
        args.threads = args.threads or 1     # tiny sizes gain nothing from more; a busy CPU costs a lot
    args.compile = args.compile or ("off" if args.quick else "on")
    if args.crossover and not args.ckpt:
        ap.error("--crossover needs --ckpt (a trained checkpoint: acceptance decides the crossover)")
    common.check_gpt_size(ap, args)
    return args


def main(argv=None) -> None:
    args = parse(argv)
    import torch

    from mutor2d.config import make
    from mutor2d.sampling.decoding import compile_decoder, generate
    device = common.open_device(args)
    args.capture = args.capture or ("on" if device.type == "cuda" else "off")
    if args.capture == "on" and device.type != "cuda":
        raise SystemExit(f"error: --capture on: CUDA graphs need a CUDA device, got --device {args.device}")
    grid, n = args.grid, args.images
    N = grid[0] * grid[1]
    labels = torch.arange(n, device=device)

    def gen():
        return torch.Generator(device=device).manual_seed(0)

    model = build(args, args.layers, device, register=True)
    cases = {
        "kv": lambda: generate(model, labels, grid, generator=gen()),
        "kv_cfg": lambda: generate(model, labels, grid, cfg_scale=args.cfg_scale, generator=gen()),
        "recompute": lambda: recompute(model, labels, grid, gen()),
    }
    common.log(f"timing {list(cases)} x {args.reps} reps")
    times = common.time_round_robin(cases, args.reps, 1, device)
    ratios = {"kv_speedup": times["recompute"] / times["kv"], "cfg_cost": times["kv_cfg"] / times["kv"]}

    common.log("speculative rows, random weights")
    offsets = make("objective", name="mutor-2d", d_max=max(args.drafts + args.last) + 2)   # K <= D - 2
    speculative = spec_table(model, labels, grid, args, device, cfg_scale=1.0, temperature=1.0, objective=offsets)
    compile_s = None
    if args.compile == "on":
        compile_decoder(model)
        common.log("compiling the decode step")
        t0 = time.perf_counter()
        cases["kv"]()
        cases["kv_cfg"]()
        compile_s = time.perf_counter() - t0
        compiled = {f"{k}_compiled": cases[k] for k in ("kv", "kv_cfg")}
        times.update(common.time_round_robin(compiled, args.reps, 0, device))
        ratios["compile_speedup"] = times["kv"] / times["kv_compiled"]
        ratios["cfg_cost_compiled"] = times["kv_cfg_compiled"] / times["kv_compiled"]
    capture_s = None
    if args.capture == "on":                # what `sample.py` runs on CUDA by default
        from mutor2d.sampling.captured import capture_decoder
        model.decode_step = None
        capture_decoder(model)
        cases["kv"]()
        capture_s = model.decode_graphs.seconds
        captured = {f"{k}_captured": cases[k] for k in ("kv", "kv_cfg")}
        times.update(common.time_round_robin(captured, args.reps, 1, device))
        ratios["capture_speedup"] = times["kv"] / times["kv_captured"]
        ratios["capture_speedup_cfg"] = times["kv_cfg"] / times["kv_cfg_captured"]
    del model

    throughput = {k: {"images_per_s": n / t, "tokens_per_s": n * N / t, "time_s": t} for k, t in times.items()}

    step = None
    if args.step_layers:
        common.log(f"decode step at {args.step_layers} layers, batch 4")
        big = build(args, args.step_layers, device)
        bw = common.read_bandwidth(device, nbytes=(64 << 20) if args.quick else (1 << 30))
        steps, wb, s = decode_steps(big, 4, grid, device), weight_bytes(big), big.shape
        kv_bytes = 2 * s.n_layer * 4 * s.n_head * s.head_dim * (N / 2) * 4   # mean cache read
        step = {"layers": args.step_layers, "batch": 4, "step_s": None, "weight_bytes": wb,  # None: time_step
                "mean_kv_cache_bytes": kv_bytes, "read_bandwidth_bytes_per_s": bw,
                "floor_s": wb / bw, "step_vs_floor": None}

        def time_step(suffix: str = "") -> None:
            per_step = common.time_round_robin({"steps": steps}, args.reps, 1, device)["steps"] / N
            step.update({f"step_s{suffix}": per_step, f"step_vs_floor{suffix}": per_step / (wb / bw)})
        time_step()
        if args.compile == "on":            # what `sample.py --compile` runs
            compile_decoder(big)
            common.log("compiling the GPT-B decode step")
            steps()
            time_step("_compiled")
        if args.capture == "on":
            big.decode_step = None
            steps = decode_steps(big, 4, grid, device, captured=True)
            steps()
            time_step("_captured")
        del big

    targets = {f"kv_speedup_ge_{TARGETS['kv_speedup_ge']:g}": ratios["kv_speedup"] >= TARGETS["kv_speedup_ge"],
               f"cfg_cost_le_{TARGETS['cfg_cost_le']:g}": ratios["cfg_cost"] <= TARGETS["cfg_cost_le"]}
    if step:
        best = min(step[k] for k in ("step_vs_floor", "step_vs_floor_compiled", "step_vs_floor_captured") if k in step)
        targets[f"step_vs_floor_le_{TARGETS['step_vs_floor_le']:g}"] = best <= TARGETS["step_vs_floor_le"]
    tables = checkpoint_tables(args, device) if args.ckpt else None
    if args.crossover:
        write_crossover(args.crossover, tables, device, common.machine(device))
    common.emit({
        "bench": "sample", "machine": common.machine(device),
        "settings": {"dim": args.dim, "heads": args.heads, "layers": args.layers, "vocab": args.vocab,
                     "images": n, "grid": list(grid), "tokens": N, "cfg_scale": args.cfg_scale,
                     "compile": args.compile, "capture": args.capture, "reps": args.reps, "quick": args.quick,
                     "threads": torch.get_num_threads(), "clock": args.clock},
        "throughput": throughput, "compile_s": compile_s, "capture_s": capture_s, "ratios": ratios, "decode_step": step,
        "speculative": speculative,
        "speculative_checkpoint": tables,
        "targets": targets,
    })


if __name__ == "__main__":
    try:
        main()
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"error: {e}")
