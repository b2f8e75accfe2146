"""Rehearse the path users run at scale, end to end, with the commands they type (subprocesses).

    python experiments/rehearse.py --quick [--workdir DIR]     # CI size (tests/test_rehearsal.py), ~2 min
    python experiments/rehearse.py --full  [--workdir DIR]     # by hand: the real VQ-16 and GPT-B shapes

Stages (one timing line each, then a JSON summary on the last line of stdout):
  images    an ImageFolder of 256 px JPEGs: random square crops of scikit-learn's sample photos
            (china.jpg, flower.jpg), one class folder per photo
  vq        a VQ-16-architecture tokenizer with random weights saved like LlamaGen's vq_ds16_c2i.pt
            ({"model": state dict}); --quick narrows its channels (ch), the layout stays VQ-16 (/16)
  extract   tokenizers/extract_codes.py over 2 processes -> codes with 16x16 grids
  train+stop  train.py --config llamagen_b_mutor2d.yaml over 2 processes, with --set only for batch
            size, steps, data paths, cadences, and what the 2-class data forces (model.num_classes,
            sample.classes); --quick also shrinks widths (model.preset=custom), the global batch and the
            sample grid (sample.per_class=1); ``--sharding fsdp``
            shards it with FSDP2 (sharded .dcp checkpoints). SIGTERM to the training processes
            mid-run: each writes/joins the checkpoint and exits 75
  resume    the same command with --resume auto, to max_steps
  sample    sample.py --num N --npz over 2 processes
  fid       eval/fid.py against an ADM-style reference npz made from the ImageFolder, with stand-in
            Inception weights (random, torch-fidelity's network) written here: nothing is downloaded
  board     eval/leaderboard.py over the run's records

Processes are started as the README says for several CPU processes: ``accelerate launch --multi_gpu
--num_processes 2`` (gloo on CPU); ``--launcher torchrun`` uses torchrun --nproc_per_node 2. Each process runs on one thread (OMP_NUM_THREADS=1). The driver exits 1 naming the first
stage whose command or output is wrong. Experiments: --signal group|nonmain, --set ITEM (one more
train.py --set), --reuse DIR (data of an earlier workdir), --until STAGE, --max-steps, --stop-at.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

import numpy as np

from mutor2d import checkpoint as ckpt_lib
from mutor2d.cli import HelpFormatter
from mutor2d.config_files import parse_override

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CONFIG = "llamagen_b_mutor2d.yaml"
STAGES = ("images", "vq", "extract", "train+stop", "resume", "sample", "fid", "board")


@dataclass
class RehearsalSize:
    """Sizes of one rehearsal. ``sets``: extra train.py --set items (empty: the config's GPT-B and
    sample grid)."""
    per_class: int            # images per class folder
    vq_ch: int                # VQ base channels (LlamaGen VQ-16: 128)
    crops: int                # extract_codes.py --crops (x2 with the default --flip)
    batch_size: int           # global train.batch_size
    max_steps: int
    stop_at: int              # SIGTERM once log.jsonl reaches this step
    ckpt_every: int
    num_samples: int          # sample.py --num
    sample_batch: int         # sample.py --batch-size (one npz shard each)
    sets: list[str] = field(default_factory=list)


SIZES = {
    "quick": RehearsalSize(per_class=4, vq_ch=32, crops=1, batch_size=2, max_steps=4, stop_at=1, ckpt_every=2,
                     num_samples=4, sample_batch=2,
                     sets=["model.preset=custom", "model.n_layer=2", "model.n_head=2", "model.dim=64",
                           "sample.per_class=1"]),
    "full": RehearsalSize(per_class=4, vq_ch=128, crops=5, batch_size=8, max_steps=4, stop_at=1, ckpt_every=2,
                    num_samples=4, sample_batch=2),
}


class StageError(RuntimeError):
    """A stage's command failed or its output is wrong; the message names the stage."""


# ----------------------------------------------------------------------------- running commands

def launcher(kind: str, script_is_python: bool = True) -> list[str]:
    """The 2-process launch prefix a user types on CPUs (README: accelerate launch --multi_gpu
    --num_processes 2 ...; torchrun --nproc_per_node 2 works the same), on a free port (port 0 /
    --standalone), so that two rehearsals or test files run side by side."""
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
    found = [e.split(b"=", 1)[1] for e in env if e.startswith(b"RANK=")]
    return int(found[0]) if found else None


# ----------------------------------------------------------------------------- stages

def make_images(root: Path, per_class: int, seed: int = 0) -> dict:
    """root/CLASS/NNN.jpg: ``per_class`` random square crops (side >= 128 px) of each scikit-learn
    sample photo, resized to 256x256 (bicubic). Classes: the photos' names."""
    from PIL import Image
    from sklearn.datasets import load_sample_images
    photos = load_sample_images()
    rng = np.random.default_rng(seed)
    for file, photo in zip(photos.filenames, photos.images):
        folder = root / Path(file).stem
        folder.mkdir(parents=True, exist_ok=True)
        h, w, _ = photo.shape
        for i in range(per_class):
            side = int(rng.integers(128, min(h, w) + 1))
            y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
            crop = Image.fromarray(photo[y:y + side, x:x + side]).resize((256, 256), Image.BICUBIC)
            crop.save(folder / f"{i:03d}.jpg", quality=90)
    return {"classes": [Path(f).stem for f in photos.filenames], "per_class": per_class}


def make_vq(path: Path, ch: int) -> dict:
    """A VQ-16-layout tokenizer (LlamaGen's module names) with random weights, saved as LlamaGen
    ships vq_ds16_c2i.pt: {"model": state dict}. The loader infers the architecture from the weights."""
    import torch
    from mutor2d.tokenizer.config import vq_config
    from mutor2d.tokenizer.vq_model import VQModel
    torch.manual_seed(0)
    model = VQModel(vq_config("vq16", ch=ch))
    torch.save({"model": model.state_dict()}, path)
    return {"ch": ch, "params": sum(p.numel() for p in model.parameters()), "bytes": path.stat().st_size}


def check_codes(codes: Path, num_images: int, augs: int) -> dict:
    """The store is complete (open_store checks shapes and value ranges), 16x16 grids, every image read."""
    from mutor2d.tokenizer.codes import open_store
    store = open_store(codes)                       # complete, shapes and value ranges checked
    h = store.header
    if h["grid"] != [16, 16] or store.codes.shape != (num_images, augs, 16, 16):
        raise StageError(f"extract: codes {store.codes.shape} grid {h['grid']}, "
                         f"expected ({num_images}, {augs}, 16, 16)")
    if (store.labels < 0).any():
        raise StageError(f"extract: {int((store.labels < 0).sum())} images unreadable or not extracted")
    return {"grid": h["grid"], "shape": list(store.codes.shape), "shards": h["num_shards"]}


def write_reference(images: Path, out: Path) -> dict:
    """ADM-style reference batch from the ImageFolder: arr_0 uint8 (n, 256, 256, 3), ADM centre crops."""
    from PIL import Image
    from mutor2d.tokenizer.image_folder import center_crop_arr, scan_image_folder
    files, _, _ = scan_image_folder(images)
    arr = []
    for f in files:
        with Image.open(images / f) as im:
            arr.append(np.asarray(center_crop_arr(im.convert("RGB"), 256)))
    np.savez(out, arr_0=np.stack(arr))
    return {"n": len(arr)}


def make_standin_inception(path: Path) -> None:
    """torch-fidelity's Inception network with random (He-initialised) weights, saved as a plain state
    dict that eval/fid.py --inception-weights loads like the real pt_inception-2015-12-05 file."""
    from unittest import mock
    import torch
    import torch.nn as nn
    import torch_fidelity.feature_extractor_inceptionv3 as fi
    with torch.random.fork_rng(), \
            mock.patch.object(fi, "load_state_dict_from_url", lambda *a, **k: {}), \
            mock.patch.object(fi.FeatureExtractorInceptionV3, "load_state_dict", lambda self, *a, **k: None):
        torch.manual_seed(0)
        net = fi.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
        for m in net.modules():
            if isinstance(m, nn.Conv2d):      # keeps activations alive through the 40+ layers
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    torch.save(net.state_dict(), path)


# ----------------------------------------------------------------------------- training

def train_command(args, size: RehearsalSize, w: Path) -> list[str]:
    """train.py with the shipped GPT-B MuToR-2D config; --set only what the rehearsal must change."""
    data = data_dir(args, w)
    sets = [f"train.batch_size={size.batch_size}", f"train.max_steps={size.max_steps}",
            f"data.path={data / 'codes'}", f"data.tokenizer={data / 'vq_ds16_c2i.pt'}",
            f"train.ckpt_every={size.ckpt_every}", f"train.sample_every={size.max_steps}", "train.log_every=1",
            "model.num_classes=2", "sample.classes=[0,1]",     # the data has 2 classes, the config 1000
            f"train.sharding={args.sharding}", *size.sets, *args.overrides]
    cmd = launcher(args.launcher) + [str(ROOT / "train.py"), "--config", CONFIG, "--out", str(w / "run")]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def log_steps(run_dir: Path) -> list[dict]:
    """Raw log.jsonl records (resume markers included); a line being written is skipped."""
    out = []
    path = run_dir / "log.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def stop_mid_run(cmd: list[str], env: dict, run_dir: Path, stop_at: int, log: Path, target: str) -> dict:
    """Start training, and once log.jsonl reaches ``stop_at`` send SIGTERM to the training processes
    (``target`` "workers": the launcher's children, as a preemption notice; "group": the launcher's
    whole process group, as a scheduler that signals every process). Returns what happened."""
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
    """rank -> exit code, from torchrun's failure report ("rank : 0 (local_rank: 0)" then
    "exitcode  : 75 (pid: ...)"); ranks that exited 0 are not listed there."""
    found = re.findall(r"rank\s*:\s*(\d+) \(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", output)
    return {int(rank): int(code) for rank, code in found}


# WORKAROUND (notes F3): once one rank exits 75, torchrun SIGTERMs the ranks still running; a rank past
# the checkpoint then dies of it (-15) or of the engine's second-signal rule (143). Accepted here only
# when the stop checkpoint is complete; tighten to "every rank 75" once the engine waits for all ranks.
LAUNCHER_KILLED = (-15, 143)


def checkpoint_of(run_dir: Path, step: int, sharding: str) -> Path:
    """The checkpoint a step leaves: a .pt file, or a .dcp folder when sharded."""
    path = ckpt_lib.checkpoint_path(run_dir, step)
    return path.with_suffix(".dcp") if sharding == "fsdp" else path


def check_stop(res: dict, run_dir: Path, size: RehearsalSize, target: str, sharding: str = "ddp") -> dict:
    """The training processes took the stop path (exit 75, see LAUNCHER_KILLED) after writing a complete
    checkpoint of the step they stopped at. torchrun itself exits 1 and lists the ranks' codes; when
    the launcher was signalled it lists none (it died of the signal)."""
    out, step = res["output"], res["signal_after_step"]
    codes = worker_exit_codes(out)
    killed = "closing signal SIGTERM" in out
    fine = 75 in codes.values() and all(c == 75 or killed and c in LAUNCHER_KILLED for c in codes.values())
    expected = target == "group" and not codes or sorted(codes) == [0, 1] and fine
    if res["launcher_rc"] == 0 or "; continue with --resume auto" not in out or not expected:
        raise StageError(f"stop: launcher exit {res['launcher_rc']}, process exit codes {codes}, expected 75; "
                         f"last output:\n{out[-3000:]}")
    path = checkpoint_of(run_dir, step, sharding)
    try:
        ckpt_lib.load(path, mmap=True)
    except (ValueError, OSError, RuntimeError) as e:
        raise StageError(f"stop: no complete checkpoint of step {step} after the signal ({e}); "
                         f"last output:\n{out[-3000:]}") from None
    if step >= size.max_steps:
        raise StageError(f"stop: the run ended (step {step}) before the signal arrived; rehearse with more steps")
    return {"step": step, "launcher_rc": res["launcher_rc"], "process_rc": codes}


def check_resume(out: str, run_dir: Path, stopped: int, max_steps: int, sharding: str = "ddp") -> dict:
    """The resumed run continued from the stop checkpoint: one resume marker at that step, then the
    steps stopped+1 .. max_steps once each, and the last checkpoint is step max_steps."""
    recs = log_steps(run_dir)
    marks = [i for i, r in enumerate(recs) if r.get("event") == "resume"]
    after = [r["step"] for r in recs[marks[-1] + 1:]] if marks else []
    if f"resuming from step {stopped}" not in out or not marks or recs[marks[-1]]["step"] != stopped:
        raise StageError(f"resume: did not resume from step {stopped}; last output:\n{out[-3000:]}")
    if after != list(range(stopped + 1, max_steps + 1)):
        raise StageError(f"resume: logged steps {after}, expected {stopped + 1}..{max_steps}")
    if not checkpoint_of(run_dir, max_steps, sharding).exists():
        raise StageError(f"resume: no final checkpoint of step {max_steps}")
    return {"from": stopped, "steps_logged": after}


def seconds_per_step(recs: list[dict], batch_size: int) -> float | None:
    """Median seconds per training step from log.jsonl rates (step time = batch / images_per_s),
    leaving out the first step after each start (process start-up, allocator warm-up)."""
    times, first = [], True
    for r in recs:
        if r.get("event") == "resume":
            first = True
        elif r.get("images_per_s"):
            if not first:
                times.append(batch_size / r["images_per_s"])
            first = False
    return float(np.median(times)) if times else None


# ----------------------------------------------------------------------------- sampling, evaluation

def check_npz(path: Path, num: int) -> dict:
    """N uint8 256x256 RGB images, N/2 of each of the 2 classes, with the sampling settings in meta."""
    with np.load(path, allow_pickle=False) as z:
        images, labels = z["images"], z["labels"]
        meta = json.loads(str(z["meta"])) if "meta" in z.files else {}
    counts = np.bincount(labels, minlength=2).tolist()
    if images.shape != (num, 256, 256, 3) or images.dtype != np.uint8 or counts != [num // 2] * 2:
        raise StageError(f"sample: npz holds {images.dtype} {images.shape} with class counts {counts}, "
                         f"expected uint8 ({num}, 256, 256, 3) with {[num // 2] * 2}")
    return {"shape": list(images.shape), "class_counts": counts, "cfg_scale": meta.get("cfg_scale")}


def check_record(run_dir: Path) -> dict:
    """The FID record eval/fid.py wrote into RUN/eval/: metrics, evaluator and reference fields."""
    found = sorted((run_dir / "eval").glob("*.json"))
    if len(found) != 1:
        raise StageError(f"fid: expected one record in {run_dir / 'eval'}, found {[p.name for p in found]}")
    rec = json.loads(found[0].read_text())
    fid = rec.get("metrics", {}).get("fid")
    if fid is None or not np.isfinite(fid) or not rec.get("evaluator") or not rec.get("reference"):
        raise StageError(f"fid: record {found[0]} lacks a finite fid, evaluator or reference: {sorted(rec)}")
    return {"record": str(found[0]), "fid": fid, "evaluator": rec["evaluator"].get("feature_extractor"),
            "reference": rec["reference"] if isinstance(rec["reference"], str) else rec["reference"].get("name")}


def check_board(table: str, run_dir: Path) -> dict:
    rows = [line for line in table.splitlines() if line.startswith("|") and "mutor-2d" in line]
    if not rows:
        raise StageError(f"board: no row of the run (mutor-2d) in the table:\n{table[-2000:]}")
    return {"rows": len(rows), "row": rows[0]}


# ----------------------------------------------------------------------------- driver

def data_dir(args, w: Path) -> Path:
    """Where the ImageFolder, the VQ file and the codes are: --reuse DIR, else the workdir."""
    return Path(args.reuse).resolve() if args.reuse else w


def stage_jobs(args, size: RehearsalSize, w: Path, env: dict, state: dict) -> dict:
    """stage name -> a function returning that stage's details (each checks its own outputs)."""
    run_dir, logs = w / "run", w / "logs"
    n_images, augs = 2 * size.per_class, 2 * size.crops
    extract = launcher(args.launcher) + [
        str(ROOT / "tokenizers/extract_codes.py"), "--images", str(w / "images"), "--tokenizer",
        str(w / "vq_ds16_c2i.pt"), "--out", str(w / "codes"), "--crops", str(size.crops),
        "--shard-size", str(max(1, size.per_class)), "--no-progress"]     # 2 shards: one per process
    sample = launcher(args.launcher, script_is_python=False) + [
        str(ROOT / "sample.py"), "--ckpt", str(run_dir), "--num", str(size.num_samples),
        "--npz", str(run_dir / "samples.npz"), "--batch-size", str(size.sample_batch)]
    fid = [PY, str(ROOT / "eval/fid.py"), str(run_dir / "samples.npz"), "--ref", str(w / "ref_imagefolder256.npz"),
           "--inception-weights", str(w / "standin-inception.pth"), "--device", "cpu"]
    board = [PY, str(ROOT / "eval/leaderboard.py"), str(run_dir)]

    def stop():
        res = stop_mid_run(train_command(args, size, w), env, run_dir, size.stop_at, logs / "train.log", args.signal)
        state["stopped"] = check_stop(res, run_dir, size, args.signal, args.sharding)
        return state["stopped"]

    def resume():
        out = run("resume", train_command(args, size, w) + ["--resume", "auto"], env, logs / "resume.log")
        found = check_resume(out, run_dir, state["stopped"]["step"], size.max_steps, args.sharding)
        return {**found, "seconds_per_step": seconds_per_step(log_steps(run_dir), size.batch_size)}

    def evaluate():
        write_reference(data_dir(args, w) / "images", w / "ref_imagefolder256.npz")
        make_standin_inception(w / "standin-inception.pth")
        run("fid", fid, env, logs / "fid.log")
        return check_record(run_dir)

    jobs = {
        "images": lambda: make_images(w / "images", size.per_class),
        "vq": lambda: make_vq(w / "vq_ds16_c2i.pt", size.vq_ch),
        "extract": lambda: (run("extract", extract, env, logs / "extract.log"),
                            check_codes(w / "codes", n_images, augs))[1],
        "train+stop": stop,
        "resume": resume,
        "sample": lambda: (run("sample", sample, env, logs / "sample.log"),
                           check_npz(run_dir / "samples.npz", size.num_samples))[1],
        "fid": evaluate,
        "board": lambda: check_board(run("board", board, env, logs / "board.log"), run_dir),
    }
    if args.reuse:                  # an earlier workdir of the same size provides the data
        for name in ("images", "vq", "extract"):
            jobs[name] = lambda: {"reused": str(data_dir(args, w))}
    return jobs


def rehearse(args) -> dict:
    """Run the stages in order (up to --until); returns the summary. StageError on the first fault."""
    size = SIZES[args.size]
    size = replace(size, max_steps=args.max_steps or size.max_steps, stop_at=args.stop_at or size.stop_at)
    w = Path(args.workdir).resolve()
    if w.exists() and any(w.iterdir()):
        raise StageError(f"--workdir {w}: expected a new or empty folder")
    (w / "logs").mkdir(parents=True, exist_ok=True)
    env, state = child_env(w), {}
    summary = {"size": args.size, "launcher": args.launcher, "workdir": str(w), "stages": {}}
    for name, job in stage_jobs(args, size, w, env, state).items():
        t0 = time.perf_counter()
        details = job()
        dt = time.perf_counter() - t0
        summary["stages"][name] = {"seconds": round(dt, 2), **details}
        brief = {k: val for k, val in details.items() if k not in ("row", "record")}
        print(f"[rehearse] {name:<10} {dt:7.1f} s  {json.dumps(brief)[:160]}", flush=True)
        if name == args.until:
            break
    summary["total_seconds"] = round(sum(s["seconds"] for s in summary["stages"].values()), 2)
    return summary


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    size = ap.add_mutually_exclusive_group(required=True)
    size.add_argument("--quick", dest="size", action="store_const", const="quick", help="CI size")
    size.add_argument("--full", dest="size", action="store_const", const="full",
                      help="the real VQ-16 and GPT-B shapes (by hand: minutes per training step on 2 cores)")
    ap.add_argument("--workdir", default="runs/rehearsal", help="new or empty folder for everything made")
    ap.add_argument("--launcher", choices=("torchrun", "accelerate"), default="accelerate",
                    help="how the multi-process stages are started")
    ap.add_argument("--sharding", choices=("ddp", "fsdp"), default="ddp",
                    help="train.sharding of the training stages (fsdp: FSDP2, sharded checkpoints)")
    ap.add_argument("--signal", choices=("workers", "group", "nonmain"), default="workers",
                    help="SIGTERM the training processes (workers), the launcher's whole process group, or "
                         "only the ranks > 0 (WORKAROUND for large checkpoints, see the notes: torchrun then "
                         "sends rank 0 its first SIGTERM, so rank 0 finishes writing before it exits)")
    ap.add_argument("--until", choices=STAGES[:-1],
                    help="stop after this stage, e.g. to time the full size's first stages (default: run all)")
    ap.add_argument("--reuse", metavar="DIR", help="take images, VQ file and codes from an earlier --workdir "
                    "of the same size (skips those stages; default: make them)")
    ap.add_argument("--max-steps", type=int, help="override the size's train.max_steps (default: the size's)")
    ap.add_argument("--stop-at", type=int, help="override the step the SIGTERM follows (default: the size's)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="one more train.py --set item (experiments, e.g. data.num_workers=0)")
    ap.add_argument("--json", help="also write the summary here (default: stdout only)")
    return ap


STEPS_LIMIT = 10 ** 7     # --max-steps (10**12 trained for ever)


def parse_args(argv=None) -> argparse.Namespace:
    """The flags; argparse's one-line error for a value that would be taken as not given ('', 0), run for
    ever, or name a file where a folder goes (and a folder where a file goes), before anything is made."""
    ap = build_parser()
    args = ap.parse_args(argv)
    size = SIZES[args.size]
    steps = size.max_steps if args.max_steps is None else args.max_steps
    if not 1 <= steps <= STEPS_LIMIT:
        ap.error(f"--max-steps {args.max_steps}: expected 1..{STEPS_LIMIT}")
    if args.stop_at is not None and not 1 <= args.stop_at < steps:
        ap.error(f"--stop-at {args.stop_at}: expected a step in 1..{steps - 1} (before --max-steps)")
    for flag, value in (("--workdir", args.workdir), ("--reuse", args.reuse)):
        if value is not None and (not value.strip() or Path(value).is_file()):
            ap.error(f"{flag} {value!r}: expected a folder")
    if args.json is not None and (not args.json.strip() or Path(args.json).is_dir()):
        ap.error(f"--json {args.json!r}: expected the path of a .json file")
    for item in args.overrides:
        try:
            parse_override(item)
        except ValueError as e:
            ap.error(str(e))
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    try:
        summary = rehearse(args)
    except StageError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
