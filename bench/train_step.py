"""Training-step benchmark: next-token (NTP) vs MuToR-2D sparse (K registers) vs dense registers.

One step = forward + backward + clipping + AdamW of the real objective on random tokens, as
mutor2d.engine runs it, at GPT-B width; round-robin, median of --reps. Per attention backend ("sdpa":
appended layout; "flex": CUDA only; "sdpa-mask": one SDPA over a dense boolean mask): time and step
peak memory against NTP and against the token-count ideal (T + R) / T (R: register slots processed).
MFU: an NTP step at full depth against the measured matmul rate (model FLOPs: mutor2d.engine.speed).
Peak memory: see bench/common.py. ``--self-distill`` adds sparse_distill / dense_distill
(reg_target self_distill) and their ratios against reg_target token. The last stdout line is JSON.

    python bench/train_step.py            # CPU: GPT-B width, 2 layers, batch 4, T = 256 inputs
    python bench/train_step.py --quick    # seconds, for CI
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

import common             # the command line parses and checks before torch is imported
from mutor2d.cli import HelpFormatter, grid_arg

if TYPE_CHECKING:
    import torch

    from mutor2d.model.gpt import GPT

CASES = ("ntp", "sparse", "dense")
DISTILL = "_distill"       # case suffix: the register case under objective.reg_target self_distill
TARGETS = {"sparse": 1.35, "dense": 2.05}   # time and memory ratio bounds vs NTP (issue 9)
MFU_TARGET = 0.70


def mask_objective() -> type:
    """TokenPrediction whose layouts' visibility has no fast path: SDPA gets the dense boolean mask."""
    import dataclasses

    from mutor2d.model.attention import Visibility
    from mutor2d.objectives.token_prediction import TokenPrediction
    from mutor2d.objectives.layout import Layout

    class MaskLayout(Layout):
        @property
        def visibility(self):
            vis = Layout.visibility.fget(self)
            return None if vis is None else Visibility(vis.key_rank, vis.query_limit)

    class MaskObjective(TokenPrediction):
        def layout(self, batch, prefix_len, generator):
            lay = super().layout(batch, prefix_len, generator)
            return MaskLayout(**{f.name: getattr(lay, f.name) for f in dataclasses.fields(lay)})
    return MaskObjective


def cases(args) -> tuple[str, ...]:
    """The cases to run: ntp, sparse, dense, and with --self-distill sparse_distill, dense_distill."""
    return CASES + ((f"sparse{DISTILL}", f"dense{DISTILL}") if args.self_distill else ())


def objective_config(case: str, args):
    from mutor2d import config as config_lib
    if case == "ntp":
        return config_lib.make("objective", name="ntp")
    return config_lib.make("objective", name="mutor-2d", d_max=args.dmax2d, reg_weight=0.5,
                           placement=case.removesuffix(DISTILL), num_registers=args.registers,
                           reg_target="self_distill" if case.endswith(DISTILL) else "token")


def build(args, n_layer: int, device: torch.device, compile_blocks: bool = False):
    """Model (with a register token), optimizer with materialised state, and one batch."""
    import torch

    from mutor2d.model.config import ModelConfig
    from mutor2d.model.gpt import GPT
    from mutor2d.objectives.base import Batch
    torch.manual_seed(0)
    cfg = ModelConfig(preset="custom", n_layer=n_layer, n_head=args.heads, dim=args.dim,
                      vocab_size=args.vocab, num_classes=1000)
    model = GPT(cfg, register_token=True).to(device).train()
    if compile_blocks:                     # as training does with train.compile: per block
        for block in model.layers:
            block.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.05,
                            fused=device.type in ("cuda", "cpu"))     # as mutor2d.engine builds it
    for p in model.parameters():          # optimizer state and gradients exist from the start
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=False)
    H, W = args.grid
    gen = torch.Generator().manual_seed(1)
    body = torch.randint(0, args.vocab, (args.batch, H * W), generator=gen).to(device)
    labels = torch.randint(0, 1000, (args.batch,), generator=gen).to(device)
    return model, opt, Batch(body, labels, (H, W))


def make_step(model, opt, batch, backend: str, case: str, args, device, keep_grads: bool = False):
    """A closure running one training step of ``case`` on ``backend`` as the training loop does:
    forward, backward, gradient clipping at 1.0, AdamW. ``keep_grads``: gradients stay allocated
    between steps (zeroed, not freed), so a memory measurement sees only the step's own memory."""
    import torch

    from mutor2d.objectives.token_prediction import TokenPrediction
    from mutor2d.objectives.base import TargetRule, target_rule
    cfg = objective_config(case, args)
    target = target_rule(cfg) if case != "ntp" else TargetRule()
    objective = mask_objective() if backend == "sdpa-mask" else TokenPrediction
    loss_fn = objective(cfg.register_spec(), 0.5, None, target)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    def step():
        for layer in model.layers:
            layer.attention.backend = "sdpa" if backend == "sdpa-mask" else backend
        with amp:
            out = loss_fn(model, batch, torch.Generator(device=device).manual_seed(2))
        opt.zero_grad(set_to_none=not keep_grads)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return step


def register_slots(case: str, args, device) -> tuple[int, float]:
    """(R register slots processed, mean valid registers per sample) for the benchmark's draw."""
    import torch

    from mutor2d.objectives.base import Batch
    from mutor2d.objectives.token_prediction import TokenPrediction
    lay = TokenPrediction(objective_config(case, args).register_spec(), 0.5).layout(
        Batch(torch.zeros(args.batch, args.grid[0] * args.grid[1], dtype=torch.long, device=device),
              torch.zeros(args.batch, dtype=torch.long, device=device), args.grid),
        1, torch.Generator(device=device).manual_seed(2))
    return lay.num_registers, lay.reg_valid.float().sum(1).mean().item()


def step_flops(model: GPT, batch: int, T: int) -> float:
    """Model FLOPs of one training step: the training log's formula (mutor2d.engine.speed)."""
    from mutor2d.engine.speed import train_flops      # the engine's imports: not in the memory children
    return train_flops(model.shape, model.cfg.vocab_size, batch, T)


def profile_steps(steps: dict, device: torch.device, top: int) -> dict:
    """One profiled step per case: its total self time (device time on a GPU, else CPU), kernel
    launches, and the ``top`` operators by self time, to see where a register step's extra time goes."""
    from torch.profiler import ProfilerActivity, profile
    gpu = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    kind = "CUDA" if gpu else "CPU"           # GPU: the kernels themselves, not the ops launching them
    self_us = (lambda e: e.self_device_time_total) if gpu else (lambda e: e.self_cpu_time_total)
    out = {}
    for name, step in steps.items():
        with profile(activities=acts) as prof:
            step()
            common.sync(device)
        events = [e for e in prof.key_averages() if e.device_type.name == kind]
        out[name] = {"self_ms": sum(map(self_us, events)) / 1e3,
                     "kernels": sum(e.count for e in events) if gpu else None,
                     "top": [{"op": e.key[:80], "self_ms": self_us(e) / 1e3, "count": e.count}
                             for e in sorted(events, key=self_us, reverse=True)[:top]]}
    return out


# ----------------------------------------------------------------------------- memory

def step_peak(args, backend: str, case: str, device) -> dict:
    """Peak memory of a second step above the state before it (one-off allocations happen in the
    first): on CUDA ``max_memory_allocated``; on the CPU, in a fresh process, its peak RSS."""
    import torch
    model, opt, batch = build(args, args.layers, device, args.compile == "all")
    step = make_step(model, opt, batch, backend, case, args, device, keep_grads=True)
    step()
    if device.type != "cuda":
        if not common.reset_peak_rss():
            raise RuntimeError("cannot reset the peak RSS (/proc/self/clear_refs); use --no-memory")
        before = common.rss_bytes()
        step()
        peak = common.peak_rss_bytes()
        return {"step_peak_bytes": peak - before, "rss_before": before, "peak_rss": peak}
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del model, opt, batch, step
    torch.cuda.empty_cache()
    return {"step_peak_bytes": peak}


def child_args(args) -> list[str]:
    import torch
    flags = ("dim", "heads", "vocab", "layers", "batch", "registers", "dmax2d", "dtype", "compile")
    return [*(x for k in flags for x in (f"--{k}", str(getattr(args, k)))),
            "--grid", f"{args.grid[0]}x{args.grid[1]}", "--threads", str(torch.get_num_threads())]


def measure_memory(args, backends: list[str], device) -> dict:
    """Step peak memory per backend and case (quick mode: the first backend only)."""
    out, names = {}, cases(args)
    for b in backends[:1] if args.quick else backends:
        if device.type == "cuda":
            out[b] = {c: step_peak(args, b, c, device) for c in names}
        else:
            common.log(f"memory: {b}, one fresh process per case")
            runs = [child_args(args) + ["--memory-child", f"{b}:{c}"] for c in names]
            out[b] = dict(zip(names, common.run_children(__file__, runs, len(names) if args.quick else 1)))
    return out


def distill_ratios(backend: str, case: str, times: dict, memory: dict) -> dict:
    """Time (and step peak memory) of ``case`` under reg_target self_distill over the same under token."""
    distill = f"{case}{DISTILL}"
    out = {f"{distill}_time": times[f"{backend}/{distill}"] / times[f"{backend}/{case}"]}
    if backend in memory:
        out[f"{distill}_mem"] = memory[backend][distill]["step_peak_bytes"] / memory[backend][case]["step_peak_bytes"]
    return out


# ----------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 2 repetitions, one thread (CI)")
    ap.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="bf16 = autocast")
    ap.add_argument("--dim", type=int, default=768, help="width (GPT-B: 768)")
    ap.add_argument("--heads", type=int, default=12, help="attention heads")
    ap.add_argument("--vocab", type=int, default=16384, help="image-token vocabulary (VQ-16: 16384)")
    ap.add_argument("--layers", type=int, default=None, help="depth of the ratio runs (default: 2 on CPU, 12 on GPU)")
    ap.add_argument("--mfu-layers", type=int, default=12, help="depth of the MFU run (0 = skip)")
    ap.add_argument("--batch", type=int, default=4, help="images per training step")
    ap.add_argument("--grid", type=grid_arg, default=(16, 16), help="token grid HxW")
    ap.add_argument("--registers", type=int, default=80, help="K of the sparse case")
    ap.add_argument("--dmax2d", type=int, default=4, help="D of the 2D offsets")
    ap.add_argument("--backends", default="sdpa,flex,sdpa-mask", help="comma-separated attention backends to time")
    ap.add_argument("--compile", choices=["off", "mfu", "all"], default="off",
                    help="torch.compile each transformer block (as train.compile) in the MFU run / all runs")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the device's nominal peak (e.g. 989 for H100/H200 bf16 dense): MFU against it too "
                         "(default: MFU against the measured matmul peak only)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    ap.add_argument("--self-distill", action="store_true",
                    help="also time the register cases under objective.reg_target=self_distill (ratios *_distill_*)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after timing, profile one step per case and report its N slowest operators (0 = off)")
    ap.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    common.add_timing_options(ap, 5)
    return ap


def parse(argv=None):
    """The options, checked before torch is imported (main resolves --device and the default --layers)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    common.check_at_least(ap, args, 1, "dim", "heads", "vocab", "layers", "batch", "registers", "dmax2d",
                          "threads", "reps")
    common.check_reps(ap, args)
    common.check_at_least(ap, args, 0, "mfu_layers", "profile")
    if args.quick:
        args.dim, args.heads, args.vocab, args.batch, args.reps = 64, 2, 512, 2, 2
        args.layers, args.mfu_layers = 1, min(args.mfu_layers, 2)
        args.threads = args.threads or 1     # tiny sizes gain nothing from more; a busy CPU costs a lot
    for b in args.backends.split(","):
        if b not in ("sdpa", "flex", "sdpa-mask"):
            ap.error(f"--backends: unknown backend {b!r}; expected sdpa, flex or sdpa-mask")
    common.check_gpt_size(ap, args)
    return args


def main(argv=None) -> None:
    args = parse(argv)
    import torch

    from mutor2d.model.config import ModelConfig, model_shape
    device = common.open_device(args)
    if args.memory_child:
        common.emit(step_peak(args, *args.memory_child.split(":"), torch.device("cpu")))   # a fresh process
        return
    skipped = {b: "FlexAttention has no backward pass on CPU (a torch limit)"
               for b in args.backends.split(",") if b == "flex" and device.type != "cuda"}
    backends = [b for b in args.backends.split(",") if b not in skipped]
    H, W = args.grid
    T = 1 + H * W - 1
    slots = {case: register_slots(case, args, device) for case in cases(args)}

    # ---- step time, side by side
    model, opt, batch = build(args, args.layers, device, args.compile == "all")
    steps = {f"{b}/{c}": make_step(model, opt, batch, b, c, args, device) for b in backends for c in cases(args)}
    common.log(f"timing {len(steps)} cases x {args.reps} reps")
    times = common.time_round_robin(steps, args.reps, warmup=1, device=device)
    profiles = profile_steps(steps, device, args.profile) if args.profile else None
    del model, opt, steps

    memory = {} if args.no_memory else measure_memory(args, backends, device)

    ratios = {b: {} for b in backends}
    for b, r in ratios.items():
        for c in ("sparse", "dense"):
            ideal = (T + slots[c][0]) / T
            r[f"{c}_time"] = times[f"{b}/{c}"] / times[f"{b}/ntp"]
            r[f"{c}_ideal"] = ideal
            r[f"{c}_time_vs_ideal"] = r[f"{c}_time"] / ideal
            if b in memory:
                r[f"{c}_mem"] = memory[b][c]["step_peak_bytes"] / memory[b]["ntp"]["step_peak_bytes"]
                r[f"{c}_mem_vs_ideal"] = r[f"{c}_mem"] / ideal
            if args.self_distill:
                r.update(distill_ratios(b, c, times, memory))

    # ---- MFU of the NTP step at full depth
    mfu = None
    if args.mfu_layers:
        common.log(f"MFU: NTP step at {args.mfu_layers} layers")
        model, opt, batch = build(args, args.mfu_layers, device, args.compile != "off")
        default = "flex" if device.type == "cuda" else "sdpa"
        t = common.time_round_robin({"ntp": make_step(model, opt, batch, default, "ntp", args, device)},
                                    max(2, args.reps - 2), warmup=1, device=device)["ntp"]
        flops = step_flops(model, args.batch, T)
        del model, opt, batch
        mm_dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
        rate = common.matmul_rate(device, mm_dtype, n=512 if args.quick else (8192 if device.type == "cuda" else 2048))
        mfu = {"layers": args.mfu_layers, "step_s": t, "model_flops": flops, "achieved_flops_per_s": flops / t,
               "matmul_flops_per_s": rate, "fraction_of_matmul": flops / t / rate}
        if args.peak_tflops:
            mfu["fraction_of_peak"] = flops / t / (args.peak_tflops * 1e12)

    main_backend = "flex" if device.type == "cuda" and "flex" in backends else backends[0]
    r = ratios[main_backend]            # time, and memory where measured, of each register case
    targets = {f"{c}_{k}_le_{bound}": r[f"{c}_{k}"] <= bound
               for c, bound in TARGETS.items() for k in ("time", "mem") if f"{c}_{k}" in r}
    if mfu:
        targets[f"mfu_ge_{MFU_TARGET}"] = mfu["fraction_of_matmul"] >= MFU_TARGET

    shape = model_shape(ModelConfig(preset="custom", n_layer=args.layers, n_head=args.heads, dim=args.dim))
    common.emit({
        "bench": "train_step", "machine": common.machine(device),
        "settings": {"dim": args.dim, "heads": args.heads, "ffn": shape.ffn_dim, "layers": args.layers,
                     "vocab": args.vocab, "batch": args.batch, "grid": [H, W], "T": T,
                     "registers_sparse": slots["sparse"][0], "registers_dense": slots["dense"][0],
                     "valid_registers_dense_mean": slots["dense"][1], "dmax2d": args.dmax2d,
                     "dtype": args.dtype, "compile": args.compile, "reps": args.reps, "quick": args.quick,
                     "threads": torch.get_num_threads(), "clock": args.clock},
        "backends": backends, "skipped": skipped, "main_backend": main_backend,
        "time_s": times,
        "step_peak_mb": {b: {c: m["step_peak_bytes"] / 2 ** 20 for c, m in d.items()} for b, d in memory.items()},
        "ratios": ratios, "mfu": mfu, "targets": targets, "profile": profiles,
    })


if __name__ == "__main__":
    try:
        main()
    except (ValueError, RuntimeError) as e:          # mutor2d.objectives.layout.LayoutError is a ValueError
        raise SystemExit(f"error: {e}")
