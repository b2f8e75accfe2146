"""The rehearsal's processes (experiments/rehearse.py): launch prefixes, commands run and shown, the stop signal."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


class StageError(RuntimeError):
    """A stage's command failed or its output is wrong; the message names the stage."""


def launcher(kind: str, script_is_python: bool = True) -> list[str]:
    """The 2-process CPU launch prefix a user types (accelerate launch / torchrun), on a free port."""
    if kind == "accelerate":
        return [PY, "-m", "accelerate.commands.launch", "--main_process_port", "0", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    prefix = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return prefix if script_is_python else prefix + ["--no-python", "--", PY]


def child_env(workdir: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MUTOR2D_CACHE=str(workdir / "cache"),
               TORCH_HOME=str(workdir / "torch_home"), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.pop("LOCAL_RANK", None)
    return env


def shown(cmd: list[str]) -> str:
    """The command as a user would type it (python for this interpreter, paths relative to the repo)."""
    words = ["python" if w == PY else w for w in cmd]
    if words[:3] == ["python", "-m", "torch.distributed.run"]:
        words = ["torchrun"] + words[3:]
    elif words[:3] == ["python", "-m", "accelerate.commands.launch"]:
        words = ["accelerate", "launch"] + words[3:]
    return shlex.join(w.replace(str(ROOT) + "/", "") for w in words)


def run(stage: str, cmd: list[str], env: dict, log: Path, expect: int = 0) -> str:
    """Run ``cmd`` in the repo root; its output goes to ``log``; a wrong exit code raises StageError."""
    print(f"[rehearse] $ {shown(cmd)}", flush=True)
    with open(log, "w") as out:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    text = log.read_text()
    if rc != expect:
        raise StageError(f"{stage}: exit code {rc}, expected {expect}; last output:\n{text[-3000:]}")
    return text


def children_of(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (Linux /proc)."""
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return [int(c) for t in tasks for c in (t / "children").read_text().split()]
    except OSError:
        return []


def rank_of(pid: int) -> int | None:
    """The RANK a launcher gave process ``pid`` (from its environment), None if unknown."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((int(e[len(b"RANK="):]) for e in env if e.startswith(b"RANK=")), None)


def log_steps(run_dir: Path) -> list[dict]:
    """Raw log.jsonl records (resume markers included); a line being written is skipped."""
    out = []
    path = run_dir / "log.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        with suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def stop_mid_run(cmd: list[str], env: dict, run_dir: Path, stop_at: int, log: Path, target: str) -> dict:
    """Start training and SIGTERM it once log.jsonl reaches ``stop_at`` (``target`` "workers": the launcher's
    children; "group": its whole process group). Returns what happened."""
    print(f"[rehearse] $ {shown(cmd)}   (SIGTERM at step {stop_at})", flush=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        while proc.poll() is None and max([r.get("step", 0) for r in log_steps(run_dir)] or [0]) < stop_at:
            time.sleep(0.2)
        workers = children_of(proc.pid)
        if proc.poll() is None:
            if target == "group":
                os.killpg(proc.pid, signal.SIGTERM)
            else:
                for pid in workers if target == "workers" else [p for p in workers if rank_of(p) != 0]:
                    os.kill(pid, signal.SIGTERM)
        rc = proc.wait(timeout=1800)
    seen = max([r.get("step", 0) for r in log_steps(run_dir) if "event" not in r] or [0])
    return {"launcher_rc": rc, "workers": len(workers), "signal_after_step": seen, "output": log.read_text()}


def worker_exit_codes(output: str) -> dict[int, int]:
    """rank -> exit code, from torchrun's failure report (ranks that exited 0 are not listed)."""
    found = re.findall(r"rank\s*:\s*(\d+) \(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", output)
    return {int(rank): int(code) for rank, code in found}
