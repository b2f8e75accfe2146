"""The image run's periodic jobs: sample grids and the online digits evaluation, and its throughput.

Hooks of the engine's shape (mutor2d.engine.hooks): called after every step with the run and a
StepStatus, after the logger and the checkpointer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..checks import ConfigError
from ..data.tokens import build_tokenizer
from ..engine.hooks import StepStatus, due
from ..engine.runlog import JsonLog, eval_text
from ..engine.rng import preserved_rng
from ..engine.setup import RunState
from ..io import say
from ..engine.speed import peak_flops, train_flops
from ..sampling.images import grid_classes, tokenizer_to


def image_rates(run: RunState, steps: int, applied: int, dt: float, sums: dict) -> dict:
    """images/s and body tokens/s over the logged steps, and MFU on a known GPU."""
    world, B = run.acc.num_processes, run.cfg.train.batch_size
    images = B * steps
    rec = {"images_per_s": images / dt, "tokens_per_s": images * run.grid[0] * run.grid[1] / dt}
    peak = peak_flops(run.device)
    if peak is not None and sums:
        seqs = B * applied
        flops = train_flops(run.model.shape, run.cfg.model.vocab_size, seqs, sums["seq_tokens"] / seqs)
        rec["mfu"] = flops / dt / (peak * world)
    return rec


@dataclass
class SampleGrids:
    """RUN/samples/step_N.png: sample.per_class samples of each grid row's choice (``classes``: indices
    into the conditioning kind's choices; class labels: the classes), one row per choice."""
    tokenizer: object
    classes: list[int] = field(default_factory=list)

    def __call__(self, run: RunState, status: StepStatus) -> None:
        if status.stopping or not due(run.cfg.train.sample_every, status):
            return
        model = run.sampling_model()              # every process: FSDP gathers the shards
        if run.main:
            from ..sampling.images import write_grid
            path = run.run_dir / "samples" / f"step_{status.done:08d}.png"
            with preserved_rng(run.device):
                write_grid(model, tokenizer_to(self.tokenizer, run.device), run.grid, run.cfg.sample,
                           self.classes, path, objective=run.cfg.objective)
            say(f"step {status.done}: sample grid {path.absolute()}")
        run.acc.wait_for_everyone()


@dataclass
class OnlineEval:
    """Every train.eval_every steps: the embedded digits metric on fresh samples, into log.jsonl and as a
    record in RUN/eval/ (the leaderboard's table and FID-vs-step plot read it like eval/fid.py's)."""
    tokenizer: object
    log: JsonLog

    def __call__(self, run: RunState, status: StepStatus) -> None:
        t = run.cfg.train
        if status.stopping or not due(t.eval_every, status, at_end=False):
            return
        model = run.sampling_model()              # every process: FSDP gathers the shards
        if run.main:
            from ..evaluation import online
            from ..evaluation.records import write_record
            with preserved_rng(run.device):
                res = online.online_digits_eval(model, run.cfg.data, t.eval_per_class, run.cfg.sample,
                                                tokenizer_to(self.tokenizer, run.device), run.cfg.sample.seed,
                                                grid=run.grid)
            rec = {"step": status.done, **{f"eval_{k}": v for k, v in res.items()}}
            self.log.write(rec)
            say(f"step {status.done}: evaluation {eval_text(rec)}")
            write_record(online.online_record(run.cfg, status.done, res), run.run_dir / "eval")
            if t.tracker != "none":
                run.acc.log({f"eval/{k}": v for k, v in res.items()}, step=status.done)
        run.acc.wait_for_everyone()


def image_hooks(run: RunState, log: JsonLog) -> list:
    """Sample grids for a conditioning kind with a fixed set of choices (and the online digits evaluation
    when train.eval_every); a kind without one gets neither, said in one line at start-up. ConfigError
    if the data's tokenizer cannot be built. The hooks decode on the training device, where the model
    samples (as sample.py does); the tokenizer reaches no optimizer, EMA or checkpoint."""
    cfg = run.cfg
    kind = cfg.model.conditioning_kind()
    count = kind.num_choices(cfg.model)
    if count is None:
        if run.main:
            print(f"note: no sample grids are written: model.conditioning={kind.name!r} has no fixed set of "
                  f"prefixes to sample", flush=True)
        return []
    try:
        with preserved_rng(run.device):        # a VQ's init draws numbers: keep the training streams
            tokenizer = build_tokenizer(cfg.data)
    except (ValueError, OSError) as e:
        raise ConfigError(f"sample grids need the tokenizer: {e}") from None
    hooks = [SampleGrids(tokenizer, grid_classes(cfg.sample, count))]
    if cfg.train.eval_every:
        hooks.append(OnlineEval(tokenizer, log))
    return hooks
