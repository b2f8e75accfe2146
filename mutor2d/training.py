"""Training loop on accelerate: data order, optimiser, schedule, EMA, logging, samples, checkpoints.

One call, :func:`train`, runs a config to ``train.max_steps`` in a run folder:

  RUN/config.yaml                   the resolved config (vocab, classes taken from the data)
  RUN/log.jsonl                     one JSON object per logged step (loss, loss_ntp, loss_reg, lr,
                                    grad_norm, tokens_per_s, images_per_s, mfu on GPU)
  RUN/checkpoints/step_XXXXXXXX.pt  mutor2d.checkpoint layout, written atomically, last
                                    ``train.keep_ckpts`` kept (0 = all)
  RUN/samples/step_XXXXXXXX.png     a grid of samples (fixed classes and seed), one row per class
  RUN/tb/                           tensorboard events (``train.tracker``)

Rules:
  * Data order: epoch e is a permutation of the dataset drawn from ``train.seed + e``; step s takes
    positions [s*B, (s+1)*B) of the concatenated epochs (B = global batch); micro-batch m of
    process r takes the slice (m*world + r)*b .. +b of it (b = B / (world*grad_accum)). The order
    depends on the step only, so resuming needs no loader state, and the global batch of a step is
    the same whatever the number of processes.
  * Randomness: the model is initialised from ``train.seed`` (same on every process); then each
    process seeds its own torch/numpy/python RNGs (dropout, label dropout, data augmentation) and
    its own register-layout generator from (seed, rank). All of them are saved in checkpoints, one
    entry per process, so a resumed run continues the uninterrupted one exactly on CPU (with
    ``data.num_workers=0``; worker processes draw their own seeds).
  * Weight decay follows LlamaGen: every tensor with 2 or more dims (linear weights and embedding
    tables) decays; 1-D tensors (norm weights, the register embedding) do not.
  * Loss of a step = mean over micro-batches and processes of each micro-batch's loss (gradients
    are averaged the same way by accelerate/DDP).
"""
from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from . import checkpoint as ckpt_lib
from . import config as config_lib
from .config import ConfigError, RunConfig
from .data import build_dataset, collate
from .model import GPT, load_llamagen
from .objectives import Batch, build_objective
from .registers import LayoutError, RegisterSpec


# ----------------------------------------------------------------------------- config against data

def resolve_config(cfg: RunConfig, dataset) -> RunConfig:
    """Fill model.vocab_size / model.num_classes from the dataset.

    A value left at its built-in default is replaced by the dataset's; any other value must equal
    the dataset's, else ConfigError. (num_classes only matters for class prefixes.) Also checks the
    register settings against the data's grid.
    """
    m = cfg.model
    defaults = config_lib.ModelConfig()
    fields = [("vocab_size", int(dataset.vocab_size))]
    if m.prefix == "class":
        fields.append(("num_classes", int(dataset.num_classes)))
    updates = {}
    for name, have in fields:
        value = getattr(m, name)
        if value != have:
            if value != getattr(defaults, name):
                raise ConfigError(f"model.{name}={value} does not match the data ({have}); "
                                  f"leave it out of the config, it is taken from the dataset")
            updates[name] = have
    cfg = replace(cfg, model=replace(m, **updates))
    prefix_len = 1 if m.prefix == "class" else int(dataset[0]["prefix"].numel())
    try:
        RegisterSpec.from_config(cfg.objective).check(tuple(dataset.grid), prefix_len)
    except LayoutError as e:
        raise ConfigError(str(e)) from None
    return cfg


def check_resume_config(cfg: RunConfig, saved: dict) -> None:
    """The model, objective and data sections of a resumed run must equal the checkpoint's."""
    old = config_lib.from_dict(saved)
    for section in ("model", "objective", "data"):
        a, b = getattr(old, section), getattr(cfg, section)
        for key in a.__dataclass_fields__:
            if getattr(a, key) != getattr(b, key):
                raise ConfigError(f"{section}.{key}={getattr(b, key)!r} differs from the checkpoint's "
                                  f"{getattr(a, key)!r}; a resumed run keeps its model, objective and data")


# ----------------------------------------------------------------------------- data order

class StepBatches:
    """Index lists of one process's micro-batches for steps [start, end) (see module doc)."""

    def __init__(self, n: int, batch_size: int, world: int, rank: int, accum: int, seed: int,
                 start: int, end: int):
        if batch_size % (world * accum):
            raise ConfigError(f"train.batch_size={batch_size} is not divisible by "
                              f"processes x train.grad_accum = {world} x {accum}")
        self.n, self.B, self.world, self.rank, self.accum = n, batch_size, world, rank, accum
        self.b = batch_size // (world * accum)
        self.seed, self.start, self.end = seed, start, end
        self._epoch, self._perm = -1, None

    def _perm_of(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed + epoch)
            self._epoch, self._perm = epoch, torch.randperm(self.n, generator=g)
        return self._perm

    def positions(self, first: int, count: int) -> torch.Tensor:
        """Dataset indices of stream positions first .. first+count-1."""
        out, pos = [], first
        while pos < first + count:
            epoch, off = divmod(pos, self.n)
            take = min(self.n - off, first + count - pos)
            out.append(self._perm_of(epoch)[off:off + take])
            pos += take
        return torch.cat(out)

    def __len__(self) -> int:
        return max(0, self.end - self.start) * self.accum

    def __iter__(self):
        for step in range(self.start, self.end):
            glob = self.positions(step * self.B, self.B)
            for m in range(self.accum):
                off = (m * self.world + self.rank) * self.b
                yield glob[off:off + self.b].tolist()


# ----------------------------------------------------------------------------- model + loss

class TrainModule(nn.Module):
    """The GPT and its objective as one module, so DDP/FSDP/autocast wrap the whole loss."""

    def __init__(self, model: GPT, objective: nn.Module):
        super().__init__()
        self.model, self.objective = model, objective

    def forward(self, body, prefix, grid, lengths=None, generator=None) -> dict:
        return self.objective(self.model, Batch(body, prefix, grid, lengths), generator)


def param_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    """LlamaGen's rule: decay tensors with dim >= 2, not 1-D ones (norms, register embedding)."""
    params = [p for p in module.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def build_scheduler(optimizer, optim_cfg, max_steps: int):
    """timm scheduler driven per update (``step_update(n)`` before update n-1): linear warmup
    lr*n/W for n <= W = ``warmup_steps``, then constant, or cosine down to ``min_lr`` at ``max_steps``."""
    from timm.scheduler import CosineLRScheduler, StepLRScheduler
    warm = optim_cfg.warmup_steps
    if optim_cfg.schedule == "cosine":
        return CosineLRScheduler(optimizer, t_initial=max(1, max_steps - warm), lr_min=optim_cfg.min_lr,
                                 warmup_t=warm, warmup_lr_init=0.0, warmup_prefix=True, t_in_epochs=False)
    return StepLRScheduler(optimizer, decay_t=float("inf"), decay_rate=1.0, warmup_t=warm,
                           warmup_lr_init=0.0, warmup_prefix=True, t_in_epochs=False)


# ----------------------------------------------------------------------------- RNG

def rank_seed(seed: int, rank: int, stream: int) -> int:
    """A distinct 63-bit seed per (seed, rank, stream): 0 = global RNGs, 1 = layout generator."""
    return (seed * 1_000_003 + rank * 7_919 + stream * 104_729 + 12_345) % (1 << 63)


def rng_state(layout_gen: torch.Generator, device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state(), "layout": layout_gen.get_state(),
             "numpy": np.random.get_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, layout_gen: torch.Generator, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    layout_gen.set_state(state["layout"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


@contextmanager
def preserved_rng(device: torch.device):
    """Run a side job (sampling, evaluation) without moving the training RNG streams."""
    np_state, py_state = np.random.get_state(), random.getstate()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        yield
    np.random.set_state(np_state)
    random.setstate(py_state)


def seed_process(seed: int, rank: int, device: torch.device) -> torch.Generator:
    """Seed this process's global RNGs; return its register-layout generator (on CPU)."""
    s = rank_seed(seed, rank, 0)
    torch.manual_seed(s)
    np.random.seed(s % (1 << 32))
    random.seed(s)
    return torch.Generator().manual_seed(rank_seed(seed, rank, 1))


# ----------------------------------------------------------------------------- speed

# Peak dense bf16 tensor-core FLOP/s per GPU (vendor datasheets, SXM parts, no sparsity).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def train_flops(n_params: int, n_layer: int, dim: int, tokens: float, seq_len: float) -> float:
    """Estimated training FLOPs (forward + backward) for ``tokens`` tokens in sequences of length
    ``seq_len``: 6 * params per token for the matmuls plus 12 * layers * dim * seq_len per token for
    attention scores and values (PaLM, appendix B). An estimate: masked-out attention is counted."""
    return tokens * (6 * n_params + 12 * n_layer * dim * seq_len)


# ----------------------------------------------------------------------------- log file

class JsonLog:
    """RUN/log.jsonl, written by the main process; on resume, records after the resume step go."""

    def __init__(self, path: Path, start_step: int, enabled: bool):
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        keep = []
        if start_step > 0 and path.exists():
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a crash
                if rec.get("step", 0) <= start_step:
                    keep.append(line)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        os.replace(tmp, path)

    def write(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def read_log(run_dir: str | os.PathLike) -> list[dict]:
    """The records of RUN/log.jsonl."""
    path = Path(run_dir) / "log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ----------------------------------------------------------------------------- samples

def sample_classes(cfg: RunConfig) -> list[int]:
    """``sample.classes``, or up to 10 classes spread over the label range."""
    C = cfg.model.num_classes
    if cfg.sample.classes:
        bad = [c for c in cfg.sample.classes if not 0 <= c < C]
        if bad:
            raise ConfigError(f"sample.classes: {bad[0]} is not a class of this data (0..{C - 1})")
        return list(cfg.sample.classes)
    return torch.linspace(0, C - 1, min(C, 10)).round().long().tolist()


def write_sample_grid(model: GPT, cfg: RunConfig, grid: tuple[int, int], tokenizer, path: Path) -> None:
    """Sample ``sample.per_class`` images of each sample class (seed ``sample.seed``) and save a
    PNG grid, one row per class. Small images are enlarged (nearest) to at least 64 px."""
    from torchvision.utils import save_image

    from .sampling import generate
    device = next(model.parameters()).device
    labels = torch.tensor(sample_classes(cfg), device=device).repeat_interleave(cfg.sample.per_class)
    gen = torch.Generator(device=device).manual_seed(cfg.sample.seed)
    s = cfg.sample
    with preserved_rng(device):
        codes = generate(model, labels, grid, cfg_scale=s.cfg_scale, temperature=s.temperature,
                         top_k=s.top_k, top_p=s.top_p, generator=gen)
    H, W = grid
    images = tokenizer.decode(codes.view(-1, H, W).cpu()).float()
    scale = max(1, -(-64 // images.shape[-1]))
    if scale > 1:
        images = nn.functional.interpolate(images, scale_factor=scale, mode="nearest")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_image(images, path, nrow=s.per_class, padding=2, pad_value=0.5)


# ----------------------------------------------------------------------------- the loop

def default_run_dir(config_name: str | os.PathLike | None) -> Path:
    stem = Path(str(config_name)).stem if config_name else "default"
    return Path("runs") / stem


def _flat(d: dict, prefix: str = "") -> dict:
    """Nested config -> {"section.key": scalar} for tracker hyper-parameters."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out


def _mixed_precision(name: str) -> str:
    if name != "auto":
        return name
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def _trackers(name: str):
    if name == "none":
        return None
    if name == "wandb":
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError("train.tracker=wandb: the wandb package is not installed "
                              "(pip install wandb, or use tensorboard/none)") from None
    return name


def _find_resume(resume: str | None, run_dir: Path) -> Path | None:
    """--resume auto: newest valid checkpoint of run_dir (None if there is none); a path: that
    checkpoint, or the newest valid one of that run folder."""
    if resume is None:
        if ckpt_lib.list_checkpoints(run_dir):
            raise ConfigError(f"run folder {str(run_dir)!r} already has checkpoints: "
                              f"pass --resume auto to continue it, or another --out")
        return None
    if resume == "auto":
        return ckpt_lib.latest_valid(run_dir)
    try:
        return ckpt_lib.resolve(resume)
    except FileNotFoundError as e:
        raise ConfigError(f"--resume {resume}: {e}") from None


def _init_weights(model: GPT, source: str) -> None:
    """train.init_from: model weights of a mutor2d checkpoint (or the newest of a run folder) or a
    LlamaGen GPT checkpoint; optimizer, step and data order start fresh."""
    try:
        # not weights_only: a mutor2d checkpoint also pickles its RNG states (load_llamagen(path) reads only
        # weights and LlamaGen's argparse args)
        obj = torch.load(ckpt_lib.resolve(source), map_location="cpu", weights_only=False)
        load_llamagen(model, obj)
    except Exception as e:
        raise ConfigError(f"train.init_from={source!r}: {type(e).__name__}: {e}") from None


def train(cfg: RunConfig, run_dir: str | os.PathLike, resume: str | None = None) -> Path:
    """Train ``cfg`` into ``run_dir`` up to ``cfg.train.max_steps``; returns the run folder.

    resume: None (a fresh run; refuses a folder that has checkpoints), "auto" (continue from the
    newest valid checkpoint of ``run_dir`` if any) or a checkpoint file / run folder.
    Bad settings raise ConfigError (one line).
    """
    from accelerate import Accelerator
    from accelerate.utils import gather_object
    from tqdm.auto import tqdm

    run_dir = Path(run_dir)
    t, o = cfg.train, cfg.optim
    tracker = _trackers(t.tracker)
    # a distributed launch (LOCAL_RANK set) without CUDA runs on CPU processes over gloo
    cpu_ddp = not torch.cuda.is_available() and int(os.environ.get("LOCAL_RANK", -1)) != -1
    acc = Accelerator(cpu=cpu_ddp, mixed_precision=_mixed_precision(t.mixed_precision),
                      gradient_accumulation_steps=t.grad_accum, log_with=tracker,
                      project_dir=str(run_dir))
    device, rank, world, main = acc.device, acc.process_index, acc.num_processes, acc.is_main_process

    try:
        dataset = build_dataset(cfg.data, "train")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    cfg = resolve_config(cfg, dataset)
    cfg = replace(cfg, train=replace(t, out_dir=str(run_dir)))
    t = cfg.train
    grid = tuple(int(v) for v in dataset.grid)
    resume_path = _find_resume(resume, run_dir)
    saved = ckpt_lib.load(resume_path) if resume_path is not None else None
    if saved is not None:
        check_resume_config(cfg, saved["config"])
    start = int(saved["step"]) if saved is not None else 0

    # model: same init on every process, then per-process RNG streams
    torch.manual_seed(t.seed)
    spec = RegisterSpec.from_config(cfg.objective)
    model = GPT(cfg.model, register_token=spec.uses_registers)
    objective = build_objective(cfg.objective, model)
    module = TrainModule(model, objective)
    layout_gen = seed_process(t.seed, rank, device)
    if saved is not None:
        model.load_state_dict(saved["model"], strict=True)
        objective.load_state_dict(saved["objective"], strict=True)
    elif t.init_from:
        _init_weights(model, t.init_from)
    if t.compile:
        for block in list(model.layers) + list(getattr(objective, "heads", [])):
            block.compile()

    optimizer = torch.optim.AdamW(param_groups(module, o.weight_decay), lr=o.lr, betas=tuple(o.betas),
                                  fused=device.type == "cuda")
    scheduler = build_scheduler(optimizer, o, t.max_steps)
    if saved is not None:
        optimizer.load_state_dict(saved["optimizer"])
        if saved["config"]["optim"] == cfg.to_dict()["optim"]:  # else the new schedule applies
            scheduler.load_state_dict(saved["scheduler"])
    module, optimizer = acc.prepare(module, optimizer)

    ema = None
    if t.ema:
        from timm.utils import ModelEmaV3
        ema = ModelEmaV3(model, decay=t.ema_decay)
        if saved is not None and saved.get("ema") is not None:
            ema.module.load_state_dict(saved["ema"], strict=True)

    if saved is not None:
        states = saved["rng"]
        if len(states) == world:
            set_rng_state(states[rank], layout_gen, device)
        elif main:
            print(f"warning: checkpoint has RNG states of {len(states)} processes, this run has {world}: "
                  f"fresh per-process seeds (the run continues, not bit-exactly)", file=sys.stderr)
        if len(states) != world:
            layout_gen = seed_process(t.seed + start, rank, device)

    sampler = StepBatches(len(dataset), t.batch_size, world, rank, t.grad_accum, t.seed, start, t.max_steps)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=cfg.data.num_workers,
                        pin_memory=device.type == "cuda",
                        generator=torch.Generator().manual_seed(rank_seed(t.seed + start, rank, 2)))

    tokenizer = None
    if cfg.model.prefix == "class":
        from .data import build_tokenizer
        try:
            tokenizer = build_tokenizer(cfg.data)
        except ValueError as e:
            raise ConfigError(f"sample grids need the tokenizer: {e}") from None
        sample_classes(cfg)
    if t.eval_every and (cfg.data.name != "digits" or cfg.model.prefix != "class"):
        raise ConfigError(f"train.eval_every={t.eval_every}: online evaluation uses the embedded digits "
                          f"metric, data.name is {cfg.data.name!r}")
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(config_lib.dump(cfg))
    log = JsonLog(run_dir / "log.jsonl", start, main)
    if tracker:
        acc.init_trackers("tb", config=_flat(cfg.to_dict()))

    gpt = acc.unwrap_model(module).model
    n_flop_params = sum(p.numel() for n, p in acc.unwrap_model(module).named_parameters()
                        if not n.endswith(("tok_embeddings.weight", "embedding_table.weight")))
    peak = peak_flops(device)
    N = grid[0] * grid[1]

    def save(step: int) -> None:
        states = gather_object([rng_state(layout_gen, device)])
        full = acc.get_state_dict(module)
        if not main:
            return
        split = {k: {n[len(k) + 1:]: v for n, v in full.items() if n.startswith(k + ".")}
                 for k in ("model", "objective")}
        ckpt_lib.save_atomic({
            "model": split["model"], "ema": ema.module.state_dict() if ema is not None else None,
            "objective": split["objective"], "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "step": step, "rng": states,
            "config": cfg.to_dict(), "grid": list(grid),
        }, ckpt_lib.checkpoint_path(run_dir, step))
        if t.keep_ckpts:
            for old in ckpt_lib.list_checkpoints(run_dir)[:-t.keep_ckpts]:
                old.unlink(missing_ok=True)

    def samples(step: int) -> None:
        if main and tokenizer is not None:
            net = ema.module if ema is not None else gpt
            write_sample_grid(net, cfg, grid, tokenizer, run_dir / "samples" / f"step_{step:08d}.png")
        acc.wait_for_everyone()

    def online_eval(step: int) -> dict:
        from .metrics import online_digits_eval
        net = ema.module if ema is not None else gpt
        gen = torch.Generator(device=device).manual_seed(cfg.sample.seed)
        with preserved_rng(device):
            res = online_digits_eval(net, cfg.data, t.eval_per_class, gen, tokenizer=tokenizer,
                                     cfg_scale=cfg.sample.cfg_scale, temperature=cfg.sample.temperature,
                                     top_k=cfg.sample.top_k, top_p=cfg.sample.top_p)
        return {f"eval_{k}": v for k, v in res.items()}

    module.train()
    bar = tqdm(total=t.max_steps, initial=start, disable=not main, dynamic_ncols=True, desc="train",
               mininterval=1.0)
    sums: dict[str, torch.Tensor] = {}
    window_start, window_steps = time.perf_counter(), 0
    data = iter(loader)
    for step in range(start, t.max_steps):
        scheduler.step_update(step + 1)  # update s uses lr(s+1): warmup reaches the full lr at s = W-1
        lr = optimizer.param_groups[0]["lr"]
        for _ in range(t.grad_accum):
            batch = next(data)
            lengths = batch.get("lengths")
            with acc.accumulate(module):
                out = module(batch["body"].to(device, non_blocking=True),
                             batch["prefix"].to(device, non_blocking=True), grid,
                             lengths.to(device) if lengths is not None else None, layout_gen)
                acc.backward(out["loss"])
                if acc.sync_gradients:
                    grad_norm = acc.clip_grad_norm_(module.parameters(), o.grad_clip if o.grad_clip > 0 else math.inf)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            for k in ("loss", "loss_ntp", "loss_reg"):
                if k in out:
                    sums[k] = sums.get(k, 0.0) + out[k].detach().float() / t.grad_accum
            seq = out["n_ntp"] + out.get("n_reg", 0)
            sums["seq_tokens"] = sums.get("seq_tokens", 0.0) + seq.detach().float()
        if ema is not None:
            ema.update(gpt, step=step + 1)
        sums["grad_norm"] = sums.get("grad_norm", 0.0) + grad_norm.detach().float()
        window_steps += 1
        done = step + 1

        if done % t.log_every == 0 or done == t.max_steps:
            keys = sorted(sums)
            vals = acc.reduce(torch.stack([sums[k] for k in keys]).to(device), reduction="sum")
            vals = dict(zip(keys, vals.tolist()))
            dt = time.perf_counter() - window_start
            rec = {"step": done, "lr": lr}
            for k in ("loss", "loss_ntp", "loss_reg", "grad_norm"):
                if k in vals:
                    rec[k] = vals[k] / (window_steps * world)
            images = t.batch_size * window_steps
            rec["images_per_s"] = images / dt
            rec["tokens_per_s"] = images * N / dt
            if peak is not None:
                seq_len = vals["seq_tokens"] / images
                flops = train_flops(n_flop_params, gpt.shape.n_layer, gpt.shape.dim, vals["seq_tokens"], seq_len)
                rec["mfu"] = flops / dt / (peak * world)
            log.write(rec)
            if tracker:
                acc.log({f"train/{k}": v for k, v in rec.items() if k != "step"}, step=done)
            bar.set_postfix(loss=f"{rec['loss']:.4f}", img_s=f"{rec['images_per_s']:.0f}", refresh=False)
            sums, window_start, window_steps = {}, time.perf_counter(), 0
        bar.update(1)

        last = done == t.max_steps
        if t.ckpt_every and done % t.ckpt_every == 0 or last:
            save(done)
        if t.sample_every and done % t.sample_every == 0 or last:
            samples(done)
        if t.eval_every and done % t.eval_every == 0:
            if main:
                rec = {"step": done, **online_eval(done)}
                log.write(rec)
                if tracker:
                    acc.log({k.replace("eval_", "eval/"): v for k, v in rec.items() if k != "step"}, step=done)
            acc.wait_for_everyone()
    bar.close()
    if start >= t.max_steps and main:
        print(f"nothing to do: the run is at step {start}, train.max_steps is {t.max_steps}", file=sys.stderr)
    acc.end_training()
    return run_dir
