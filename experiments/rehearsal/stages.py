"""The rehearsal's stages (experiments/rehearse.py): its sizes, what each stage makes and how its output is checked."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mutor2d import checkpoint as ckpt_lib

from .procs import StageError, log_steps, worker_exit_codes


@dataclass
class RehearsalSize:
    """Sizes of one rehearsal; ``sets``: extra train.py --set items."""
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


def make_images(root: Path, per_class: int, seed: int = 0) -> dict:
    """root/CLASS/NNN.jpg: ``per_class`` random square crops of each scikit-learn sample photo, at 256x256."""
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
    """A random-weight VQ-16 tokenizer (LlamaGen's module names), saved as LlamaGen ships vq_ds16_c2i.pt."""
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
    """torch-fidelity's Inception with random weights, saved as a plain state dict for --inception-weights."""
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


# WORKAROUND (notes F3): once one rank exits 75, torchrun SIGTERMs the ranks still running; a rank past
# the checkpoint then dies of it (-15) or of the engine's second-signal rule (143). Accepted here only
# when the stop checkpoint is complete; tighten to "every rank 75" once the engine waits for all ranks.
LAUNCHER_KILLED = (-15, 143)


def checkpoint_of(run_dir: Path, step: int, sharding: str) -> Path:
    """The checkpoint a step leaves: a .pt file, or a .dcp folder when sharded."""
    path = ckpt_lib.checkpoint_path(run_dir, step)
    return path.with_suffix(".dcp") if sharding == "fsdp" else path


def check_stop(res: dict, run_dir: Path, size: RehearsalSize, target: str, sharding: str = "ddp") -> dict:
    """The training processes took the stop path (exit 75) after a complete checkpoint of their stop step;
    torchrun exits 1 and lists the ranks' codes (none when the launcher was signalled)."""
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
    """One resume marker at the stop step, then steps stopped+1 .. max_steps once each, last checkpoint max_steps."""
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
    """Median seconds per step from log.jsonl rates, leaving out the first step after each start."""
    times, first = [], True
    for r in recs:
        if r.get("event") == "resume":
            first = True
        elif r.get("images_per_s"):
            if not first:
                times.append(batch_size / r["images_per_s"])
            first = False
    return float(np.median(times)) if times else None


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
