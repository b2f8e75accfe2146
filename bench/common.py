"""Shared helpers of the benchmarks: timing, the machine's own limits, peak memory, JSON output.

Timing: cases run round-robin (one repetition of each per round), a case's time is the median.
Clock "wall" (perf_counter) or "cpu" (process_time: with --threads 1 only, on a shared machine).
Machine limits: FLOP/s of a large ``torch.mm``; bytes/s of ``x.sum()`` over a tensor beyond the caches.
Step peak memory on CPU: in a fresh subprocess (EXACT_RSS_ENV), peak RSS (VmHWM) of a second step
minus the RSS before it, the peak counter reset in between; on CUDA ``max_memory_allocated``.
Torch is imported by the helpers that use it, so a script's command line parses without it.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch


def sync(device: torch.device | None) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU (``None``)."""
    if device is not None and device.type == "cuda":
        import torch
        torch.cuda.synchronize(device)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = time.perf_counter


def setup(threads: int | None, clock: str, device: torch.device) -> None:
    """Set the intra-op thread count and the clock of every later measurement."""
    global _clock
    if threads:
        import torch
        torch.set_num_threads(threads)
    if clock == "cpu" and device.type == "cuda":
        raise ValueError("--clock cpu measures CPU work; use --clock wall on a GPU")
    _clock = CLOCKS[clock]


def time_round_robin(fns: dict[str, Callable[[], object]], reps: int, warmup: int = 1,
                     device: torch.device | None = None) -> dict[str, float]:
    """Median time (s, on the chosen clock) of each callable; cases interleaved per repetition
    (``device`` None: the CPU)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    sync(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            sync(device)
            t0 = _clock()
            fn()
            sync(device)
            times[name].append(_clock() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def matmul_rate(device: torch.device, dtype: torch.dtype | None = None, n: int = 2048,
                reps: int = 5) -> float:
    """FLOP/s of an (n x n) @ (n x n) matmul in ``dtype`` (default fp32), median of ``reps`` (output
    buffer reused)."""
    import torch
    dtype = dtype or torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    t = time_round_robin({"mm": lambda: torch.mm(a, b, out=out)}, reps, warmup=1, device=device)
    return 2 * n ** 3 / t["mm"]


def read_bandwidth(device: torch.device, nbytes: int = 512 << 20, reps: int = 5) -> float:
    """Bytes/s read by ``x.sum()`` over an fp32 tensor of ``nbytes``."""
    import torch
    x = torch.ones(nbytes // 4, device=device)
    t = time_round_robin({"sum": lambda: x.sum()}, reps, warmup=1, device=device)
    return x.numel() * 4 / t["sum"]


def machine(device: torch.device) -> dict:
    """What the numbers were measured on."""
    import torch
    info = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "nproc": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cpu": _cpu_model(), "torch": torch.__version__, "python": platform.python_version(),
            "device": str(device)}
    with contextlib.suppress(OSError):
        info["loadavg_1m"] = round(os.getloadavg()[0], 2)
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


# ----------------------------------------------------------------------------- memory

def rss_bytes() -> int:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Peak resident set size of this process since start or the last reset_peak_rss()."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


# glibc malloc: every block >= 64 KiB is its own mapping, unmapped on free, and the heap top is
# trimmed at once; so RSS follows live tensor memory instead of what the allocator keeps cached.
EXACT_RSS_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def run_children(script: str, arg_lists: list[list[str]], parallel: int = 1, timeout: float = 900) -> list[dict]:
    """Run ``python script args`` for each args in fresh processes (with EXACT_RSS_ENV),
    ``parallel`` at a time; return the JSON object on each one's last stdout line. (A process's
    peak RSS is its own: running them side by side changes their times, not their memory.)"""
    env = {**os.environ, **EXACT_RSS_ENV}
    results: list[dict] = []
    for i in range(0, len(arg_lists), parallel):
        group = arg_lists[i:i + parallel]
        procs = [subprocess.Popen([sys.executable, script, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env) for args in group]
        for args, proc in zip(group, procs):
            out, err = proc.communicate(timeout=timeout)
            lines = out.strip().splitlines()
            if proc.returncode != 0 or not lines:
                tail = (err or out).strip().splitlines()[-1:] or ["no output"]
                raise RuntimeError(f"{os.path.basename(script)} {' '.join(args)} failed: {tail[0]}")
            results.append(json.loads(lines[-1]))
    return results


# ----------------------------------------------------------------------------- command line

def add_timing_options(ap: argparse.ArgumentParser, reps: int, threads: int | None = None, clock: str = "wall") -> None:
    """--reps, --threads and --clock of a timed benchmark."""
    ap.add_argument("--threads", type=int, default=threads, help="torch intra-op threads (default: torch's; 1 with --quick)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default=clock,
                    help="cpu = process CPU time, for a shared machine (with --threads 1)")
    ap.add_argument("--reps", type=int, default=reps, help="timed repetitions per case; the median is reported")


def check_at_least(ap: argparse.ArgumentParser, args: argparse.Namespace, low: int, *dests: str) -> None:
    """argparse's one-line error (usage, exit 2) for an option among ``dests`` given below ``low``."""
    for dest in dests:
        value = getattr(args, dest)
        if value is not None and value < low:
            ap.error(f"--{dest.replace('_', '-')} {value}: expected >= {low}")


def die_with_parent() -> None:
    """``preexec_fn`` of a child launch (Linux): the kernel sends it SIGTERM when this process dies, even
    by SIGKILL, so a launch (torchrun and its workers) never outlives the benchmark that started it."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)     # PR_SET_PDEATHSIG


REPS_LIMIT = 10 ** 4     # timed repetitions of a case: more only wait longer for the same median


def check_at_most(ap: argparse.ArgumentParser, args: argparse.Namespace, high: int, why: str, *dests: str) -> None:
    """argparse's one-line error for an option among ``dests`` above ``high`` (``why``: what the limit is)."""
    for dest in dests:
        value = getattr(args, dest)
        if value is not None and value > high:
            ap.error(f"--{dest.replace('_', '-')} {value}: expected at most {high} ({why})")


def check_reps(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--reps above REPS_LIMIT, --threads beyond this machine's cores: argparse's one-line error."""
    check_at_most(ap, args, REPS_LIMIT, "more only wait longer for the same median", "reps")
    check_threads(ap, args)


def check_threads(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    cores = os.cpu_count() or 1
    if args.threads is not None and args.threads > cores:
        ap.error(f"--threads {args.threads}: expected at most {cores}, this machine's cores")


def device_name(text: str | None) -> str:
    """--device after parsing (torch imported): the default (cuda when available, else cpu), or a torch
    device string; anything else is one line, exit 2 (was: torch's RuntimeError traceback)."""
    import torch
    text = text or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        torch.device(text)
    except RuntimeError:
        raise SystemExit(f"error: --device {text!r}: not a torch device; expected e.g. cpu, cuda or cuda:1") from None
    return text


def open_device(args: argparse.Namespace) -> torch.device:
    """The device of --device (``device_name``); also a --layers not given (12 on CUDA, 2 on the CPU),
    and --threads and --clock (``setup``)."""
    import torch
    args.device = device_name(args.device)
    device = torch.device(args.device)
    if "layers" in vars(args) and args.layers is None:
        args.layers = 12 if device.type == "cuda" else 2
    setup(args.threads, args.clock, device)
    return device


def check_gpt_size(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--dim, --heads, --layers, --vocab of a GPT benchmark (--dim a multiple of --heads, then the config's
    own check: a model over model.PARAMS_LIMIT, a head size RoPE cannot rotate): argparse's one-line error,
    before torch is imported."""
    if args.dim % args.heads:
        ap.error(f"--dim {args.dim} is not divisible by --heads {args.heads}")
    from mutor2d.checks import ConfigError
    from mutor2d.model.config import ModelConfig
    try:
        ModelConfig(preset="custom", n_layer=args.layers or 1, n_head=args.heads, dim=args.dim,
                    vocab_size=args.vocab, num_classes=1000).check()
    except ConfigError as e:
        ap.error(str(e))


def check_llama_size(ap: argparse.ArgumentParser, hidden: int, layers: int, vocab: int) -> None:
    """A benchmark Llama (MLP 4x the width) over model.PARAMS_LIMIT parameters: argparse's one-line error."""
    from mutor2d.model.config import PARAMS_LIMIT
    params = layers * 16 * hidden ** 2 + 2 * vocab * hidden
    if params > PARAMS_LIMIT:
        sizes = f"--hidden {hidden} --layers {layers}" + (f" --vocab {vocab}" if vocab else "")
        ap.error(f"{sizes}: about {params:.3g} parameters; expected at most {PARAMS_LIMIT:.0e}")


# ----------------------------------------------------------------------------- output

def rounded(obj, digits: int = 4):
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [rounded(v, digits) for v in obj]
    return obj


def emit(result: dict) -> None:
    """Print the result as one JSON object on the last line of stdout."""
    print(json.dumps(rounded(result), sort_keys=False), flush=True)


def log(msg: str) -> None:
    """Progress to stderr (stdout's last line is reserved for the JSON result)."""
    print(msg, file=sys.stderr, flush=True)
