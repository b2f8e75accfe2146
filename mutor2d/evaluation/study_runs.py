"""One run of the image study: train, select a step on validation NLL, sample and score; the floor; a pool."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

from .. import checkpoint as ckpt_lib
from .. import config as config_lib
from ..checkpoint import inference
from ..engine.lock import LOCK_NAME, Owner, RunLocked, acquire, read_owner, release
from ..plugins import load_plugins
from ..preempt import PREEMPTED_EXIT, Preempted
from ..sampling import images as generation
from ..sampling import npz as npz_files
from . import records
from .extrapolation import grid_token_nll
from .metrics import compute_metrics, embedded_weights
from .options import EMBEDDED
from .plan import COMPUTE_MATCHED, StudyError, run_config
from .sources import DIGITS_DATA_SEED, ArrayImages, ImageSource, open_images

VAL_CURVE_FILE = "val_nll.json"


def train_seconds(run_dir: Path) -> tuple[float, int]:
    """(seconds, steps) of pure training from RUN/log.jsonl's images_per_s."""
    from ..engine.runlog import read_log
    secs, prev = 0.0, 0
    B = config_lib.load(run_dir / "config.yaml").train.batch_size
    for rec in read_log(run_dir):
        if "images_per_s" in rec:
            secs += (rec["step"] - prev) * B / rec["images_per_s"]
            prev = rec["step"]
    return secs, prev


def heldout_nll(model, data_cfg, split: str = "test") -> float:
    """Teacher-forced NTP cross-entropy (nats per token, registers absent) of a held-out split."""
    from ..data.tokens import build_dataset, collate
    ds = build_dataset(data_cfg, split)
    total = 0.0
    for start in range(0, len(ds), 256):
        b = collate([ds[j] for j in range(start, min(start + 256, len(ds)))])
        device = next(model.parameters()).device
        codes = b["body"].view(len(b["body"]), *ds.grid).to(device)
        total += grid_token_nll(model, codes, b["prefix"].to(device)).double().mean().item() * len(codes)
    return total / len(ds)


def data_reference(data_name: str, data_seed: int, cache: Path, split: str = "train"):
    """(the data's ``split`` as a source, its features name, the classifier file for that data seed)."""
    if data_name not in EMBEDDED:
        raise StudyError(f"data.name={data_name!r}: the study scores {list(EMBEDDED)} (a classifier trained here)")
    return open_images(f"{data_name}:{split}", data_seed), data_name, embedded_weights(data_name, data_seed, cache)


def score(samples, ref, features: str, weights, cache: Path, device: str = "cpu"):
    return compute_metrics(samples, ref, features=features, weights_path=weights,
                           cache_root=cache / "fidelity_cache", device=device)


def evaluate(run_dir: Path, step: int, cfg_scales: list[float], num: int, label: str, study: dict,
             cache: Path, batch_size: int = 250, seed: int = 0, tag: str = "", ema: bool = True,
             folder: str = "eval", device: str = "cpu") -> list[Path]:
    """Sample, score and record checkpoint ``step`` at each CFG scale into RUN/``folder``; ``tag`` goes
    into the file names, keeping records of another label, seed or weights apart."""
    names = [f"eval_{tag}step{step:08d}_cfg{s:g}" for s in cfg_scales]
    found = [sorted((run_dir / folder).glob(f"{n}__*.json")) for n in names]
    if all(found):                                       # scored before: keep those records
        return [f[0] for f in found]
    path = ckpt_lib.checkpoint_path(run_dir, step)
    src = generation.open_checkpoint(path, use_ema=ema, device=device)
    nll = {"nll_test": heldout_nll(src.model, src.cfg.data, "test")}
    if getattr(src.cfg.data, "val_fraction", 0) > 0:
        nll["nll_val"] = heldout_nll(src.model, src.cfg.data, "val")
    classes = list(range(src.cfg.model.num_classes))
    labels = generation.balanced_labels(num, classes)
    ref, features, weights = data_reference(src.cfg.data.name, src.cfg.data.data_seed, cache)
    out = []
    for s, name in zip(cfg_scales, names):
        npz = run_dir / "samples" / f"{name}.npz"
        sample_cfg = config_lib.make("sample", cfg_scale=s)                   # plain decoding, temperature 1, no top-k/p
        meta = npz_files.sample_meta(checkpoint=str(path), step=src.step, config=src.cfg.to_dict(), seed=seed,
                                     settings=generation.sampling_settings(sample_cfg), classes=classes,
                                     num=num, batch_size=batch_size, ema=src.ema, grid=src.grid)
        npz_files.NpzJob(npz, labels, batch_size, seed, meta).complete(
            generation.make_sampler(src.model, src.tokenizer, src.grid, sample_cfg))
        samples = open_images(npz)
        res = score(samples, ref, features, weights, cache, device)
        res.metrics.update(nll)
        rec = records.make_record(res, samples=samples, reference=ref, method=label, samples_path=str(npz))
        rec["study"] = {**study, "cfg_scale": s}
        out.append(records.write_record(rec, run_dir / folder))
    return out


def candidates(every: int, upto: int) -> list[int]:
    """The checkpoints a run's step is selected among: every ``every``-th step up to ``upto``, and ``upto``."""
    return sorted(set(range(every, upto + 1, every)) | {upto})


def select_step(curve: dict[int, float], upto: int) -> int:
    """The step with the lowest validation NLL among the curve's steps <= ``upto`` (the earliest on a tie)."""
    if not (steps := [s for s in curve if s <= upto]):
        raise StudyError(f"no validation NLL at or before step {upto}")
    return min(steps, key=lambda s: (curve[s], s))


def read_curve(run_dir: Path) -> dict:
    """RUN/val_nll.json: {"nll": {step: validation NLL}, "selected": {label: step}, "weights": "ema"|"raw"}."""
    path = run_dir / VAL_CURVE_FILE
    if not path.is_file():
        return {"nll": {}, "selected": {}}
    raw = json.loads(path.read_text())
    return {**raw, "nll": {int(k): v for k, v in raw["nll"].items()}}


def val_curve(run_dir: Path, steps: list[int]) -> dict:
    """The validation NLL of the run's checkpoints at ``steps``, computed once each into RUN/val_nll.json."""
    curve = read_curve(run_dir)
    for step in steps:
        if step not in curve["nll"]:
            model, cfg, meta = inference.open_model(ckpt_lib.checkpoint_path(run_dir, step))
            curve["nll"][step] = heldout_nll(model, cfg.data, "val")
            curve["weights"] = "ema" if meta["has_ema"] else "raw"
            write_curve(run_dir, curve)
    return curve


def write_curve(run_dir: Path, curve: dict) -> None:
    """RUN/val_nll.json, written whole (atomically): a rerun finds every value computed before."""
    from ..io import write_text_atomic
    nll = {str(k): v for k, v in sorted(curve["nll"].items())}
    write_text_atomic(run_dir / VAL_CURVE_FILE, json.dumps({**curve, "nll": nll}, indent=1) + "\n")


def run_unit(unit: dict) -> dict:
    """Train one (label, seed) run, add its lowest-validation-NLL step (val_every) and evaluate the steps."""
    torch.set_num_threads(1)
    run_dir = Path(unit["run_dir"])
    cfg = run_config(unit["method"], unit["seed"], unit["steps"], unit["ckpt_every"], unit["overrides"], unit["base"])
    if not ckpt_lib.checkpoint_path(run_dir, unit["steps"]).is_file():   # else finished earlier
        from ..engine.loop import train
        train(cfg, run_dir, resume="auto")
    secs, steps = train_seconds(run_dir)
    study = {"method": unit["label"], "seed": unit["seed"], "train_seconds": secs, "train_steps": steps,
             "max_steps": unit["steps"], "data_fraction": getattr(cfg.data, "train_fraction", 1.0)}
    eval_steps = list(unit["eval_steps"])
    if unit["val_every"]:
        curve = val_curve(run_dir, candidates(unit["val_every"], unit["horizon"]))
        study["selected_step"] = select_step(curve["nll"], unit["horizon"])
        curve["selected"][unit["label"]] = study["selected_step"]
        write_curve(run_dir, curve)
        eval_steps = sorted(set(eval_steps) | {study["selected_step"]})
    me = hold_samples(run_dir / "samples")
    try:
        for step in eval_steps:
            evaluate(run_dir, step, unit["cfg"], unit["num"], unit["label"], study, Path(unit["cache"]),
                     tag="cm_" if unit["label"] == COMPUTE_MATCHED else "", device=unit["device"])
    finally:
        release(run_dir / "samples", me)
    return {**study, "run_dir": str(run_dir)}


def hold_samples(folder: Path, poll_s: float = 10.0) -> Owner:
    """Take FOLDER/run.lock, waiting (one line said) while another live process holds it."""
    said = False
    while True:
        try:
            return acquire(folder)
        except RunLocked:
            if not said and (owner := read_owner(folder / LOCK_NAME)):
                print(f"{folder.parent}: scored by {owner.describe()} now; waiting for it", flush=True)
                said = True
            time.sleep(poll_s)


def follow_driver(driver_pid: int) -> None:
    """Pool-worker initializer: SIGTERM this worker once the driver process is gone."""
    def watch():
        while os.getppid() == driver_pid:
            time.sleep(1)
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=watch, daemon=True).start()


def pool_unit(unit: dict) -> dict:
    """run_unit in a pool worker; a stop signal exits PREEMPTED_EXIT after its checkpoint."""
    try:
        load_plugins()                    # a spawned worker: the objectives of MUTOR2D_PLUGINS again
        return run_unit(unit)
    except Preempted:
        os._exit(PREEMPTED_EXIT)


def run_all(units: list[dict], jobs: int) -> list[dict]:
    """Units in order, ``jobs`` processes at a time; a stop signal stops every worker after a checkpoint."""
    if jobs == 1:
        return [run_unit(u) for u in units]
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=follow_driver,
                             initargs=(os.getpid(),)) as pool:
        try:
            return list(pool.map(pool_unit, units))
        except BrokenProcessPool:
            raise Preempted("a study worker stopped (stop signal or killed); every run keeps its last "
                            "checkpoint: rerun the same command to resume") from None


# ----------------------------------------------------------------------------- floor

def floor_records(out: Path, num: int, draws: int, cache: Path, data_seed: int = DIGITS_DATA_SEED,
                  data_name: str = "digits") -> list[dict]:
    """DATA:test against DATA:train: as is, and ``draws`` resamples (with replacement) of ``num`` images."""
    old = sorted((out / "floor" / "eval").glob("*.json"))
    if len(old) == draws + 1:                            # made before with these settings
        recs = [json.loads(p.read_text()) for p in old]
        if all(r["n"] == num for r in recs if r["study"]["seed"] is not None):
            return sorted(recs, key=lambda r: r["study"]["seed"] is not None)
    test, _, _ = data_reference(data_name, data_seed, cache, "test")
    ref, features, weights = data_reference(data_name, data_seed, cache)
    sources = [("real held-out", test, None)]
    for d in range(draws):
        idx = np.random.default_rng(d).integers(0, test.n, num)
        src = ImageSource(f"{data_name}:test resampled {num} #{d}", ArrayImages(test.dataset.images[idx]),
                          test.labels[idx])
        sources.append((f"real held-out x{num} (resampled)", src, d))
    recs = []
    for label, src, d in sources:
        res = score(src, ref, features, weights, cache)
        rec = records.make_record(res, samples=src, reference=ref, method=label,
                                  samples_path=f"{data_name}-test{'' if d is None else f'-resampled{num}-{d}'}")
        rec["study"] = {"method": label, "seed": d, "cfg_scale": None}
        records.write_record(rec, out / "floor" / "eval")
        recs.append(rec)
    return recs
