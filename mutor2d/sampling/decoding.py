"""Generation with a KV cache from the image GPT and a decoding mode: ``generate`` (its checks, then
``run_decoder``), ``decoding_mode``, ``GPTStep`` (the GPT as a ``rounds.Step``), ``compile_decoder``
(torch.compile of a decode step); the modes and rules: mutor2d.sampling."""
from __future__ import annotations

import types

import torch
from torch import Tensor

from ..registry import build
from .config import DecodeConfig, checkpoint_spec, check_sampling
from ..config import make
from .captured import CapturedStep
from .rounds import Extras, Frame, Progress, decode
from ..objectives.layout import regular_position_ids
from .rules import SamplingRules
from .stats import DecodeStats


class GPTStep:
    """The image GPT over a batch being decoded (``rounds.Step``): its static KV cache holds regular
    input i at cache index i (``commit`` has nothing to undo); guided, the model runs [cond; uncond]
    rows, both fed the drawn token, and the step hands back combined logits (``logits``: identity).
    With the model's ``decode_graphs`` set (``sampling.captured``), its plain rounds replay a graph."""

    def __init__(self, model, prefix: Tensor, rules: SamplingRules, frame: Frame, K: int):
        self.model, self.rules, self.batch = model, rules, prefix.shape[0]
        self.prefix = torch.cat([prefix, model.conditioning.null_prefix(model.cfg, prefix)]) if rules.guided else prefix
        self.positions = frame.positions[:frame.P].expand(self.prefix.shape[0], frame.P, 2)
        model.setup_cache(self.prefix.shape[0], frame.P + frame.N - 1 + K)
        graphs = model.decode_graphs                           # sampling.captured.capture_decoder
        self.captured = CapturedStep(model, self.prefix.shape[0], graphs) if graphs is not None and not K else None

    def twice(self, t: Tensor) -> Tensor:
        return torch.cat([t, t]) if self.rules.guided else t

    def _extras(self, extras: Extras | None, start: int | Tensor) -> tuple:
        """(positions, read limits) of the registers for the model, cache indices from ``start``."""
        if extras is None:
            return ()
        start = start[:, None] if isinstance(start, Tensor) else start
        return self.twice(extras.positions), self.twice(start + extras.reads)

    def prefill(self, extras):
        return self.rules.combine(self.model.decode(None, self.positions, 0, self.prefix, *self._extras(extras, 0)))

    def forward(self, tokens, index, positions, extras):
        if self.captured is not None and extras is None and isinstance(index, int):
            return self.rules.combine(self.captured(self.twice(tokens), self.twice(positions), index))
        start = index if isinstance(index, int) else shared_start(index, self.twice)
        return self.rules.combine(self.model.decode(self.twice(tokens), self.twice(positions), start, None,
                                                    *self._extras(extras, index)))

    def logits(self, out: Tensor) -> Tensor:
        return out

    def commit(self, kept, active) -> None:
        """Nothing: the next forward writes from its own regular index over what was not kept."""


def shared_start(start: Tensor, twice) -> int | Tensor:
    """Cache starts (B,) -> one int when every row starts at the same index (the model then takes its
    single-start path: slices, no scatter, causal attention without extras), else the per-row starts
    for all rows."""
    first = int(start[0])
    return first if bool((start == first).all()) else twice(start)


def unwrap_model(model):
    """The GPT inside DDP / torch.compile wrappers."""
    while (inner := getattr(model, "module", None) or getattr(model, "_orig_mod", None)) is not None:
        model = inner
    return model


def decoding_mode(decode: str | DecodeConfig, objective, grid: tuple[int, int], **options) -> DecodeConfig:
    """A checked decoding mode fitted to a checkpoint of ``objective`` on ``grid``: ``decode`` a
    DecodeConfig, or a mode's name with its fields as ``options`` (e.g. ``"registers", draft=2``)."""
    if not isinstance(decode, DecodeConfig):
        decode = make("sample.decode", name=decode, **options)
    elif options:
        raise ValueError(f"decode options {sorted(options)} go in the DecodeConfig, not beside it")
    return decode.fit(objective, grid)


@torch.no_grad()
def generate(model, prefix: Tensor, grid: tuple[int, int], *, cfg_scale: float = 1.0,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             generator: torch.Generator | None = None, decode: str | DecodeConfig = "plain",
             objective=None, stats: DecodeStats | None = None, **options) -> Tensor:
    """Sample bodies for ``prefix`` -> LongTensor (B, H*W) in raster order.

    prefix: what the model's conditioning kind takes (class labels (B,), ``num_classes`` = the null
    class; prompt tokens (B, P); ...). cfg_scale != 1 turns on classifier-free guidance (kinds with
    a null prefix only). temperature 0 = greedy. ``decode``: a mode's name with its fields as
    ``options`` (``draft=2`` for registers, ``window=4`` for jacobi), or a DecodeConfig.
    ``objective``: the checkpoint's objective config section (register drafts take their offsets,
    edge rule and default length from it). ``stats``, a DecodeStats, receives the run's counts
    (forward passes, tokens per forward, acceptance by draft distance)."""
    check_sampling(cfg_scale, temperature, top_k, top_p, where="")
    H, W = grid
    if H < 1 or W < 1:
        raise ValueError(f"grid: expected H, W >= 1, got {H}x{W}")
    mode = decoding_mode(decode, objective, grid, **options)
    rules = SamplingRules.of(cfg_scale, temperature, top_k, top_p)
    return run_decoder(model, prefix, grid, rules, mode, objective, generator, stats)


@torch.no_grad()
def run_decoder(model, prefix: Tensor, grid: tuple[int, int], rules: SamplingRules, mode: DecodeConfig,
                objective=None, generator: torch.Generator | None = None,
                stats: DecodeStats | None = None, progress: Progress | None = None) -> Tensor:
    """``generate`` after its checks: checked ``rules`` and a fitted ``mode`` (``decoding_mode``), so
    a caller sampling many batches checks its settings once. The prefix is checked by the model's
    conditioning kind; the model runs in eval mode (its training flag is restored after). The drafter
    follows the register rules of ``objective`` (the checkpoint's section); ``progress``
    (``rounds.Progress``) sees the tokens as they are emitted."""
    model = unwrap_model(model)
    model.conditioning.check(model.cfg, prefix)
    if rules.guided and not model.conditioning.guidable:
        raise ValueError(f"cfg_scale={rules.cfg_scale}: classifier-free guidance needs a null prefix (class "
                         f"labels have one), this model is conditioned on {model.cfg.conditioning!r}")
    drafter = build(mode, checkpoint_spec(objective), grid, len(prefix), model.output.weight.device)
    if drafter.needs_registers and not model.has_register_token:
        raise ValueError(f"decode={mode.name!r} needs a checkpoint trained with registers; this model has no "
                         "register embedding (use decode='jacobi' or 'plain')")
    prefix = prefix.to(model.output.weight.device)
    P, N = model.prefix_len(prefix), grid[0] * grid[1]
    frame = Frame(grid, P, regular_position_ids(grid, P, P + N + drafter.K).to(prefix.device))
    was_training = model.training
    model.eval()
    try:
        bodies = decode(GPTStep(model, prefix, rules, frame, drafter.K), drafter, frame, rules, generator, stats,
                        progress=progress)
    finally:
        model.clear_cache()
        model.train(was_training)
    if stats is not None:
        stats.tokens += bodies.numel()
    return bodies


# inductor settings of a compiled decode step on CPU: weights frozen into the graph as constants
# and prepacked for inductor's C++ GEMM template (chosen over ATen's by benchmarking at compile
# time). A GPT-B decode step of 4 rows: 1.98x its weight-bandwidth floor against 2.85x without
# (docs/BENCHMARKS.md).
CPU_DECODE_INDUCTOR = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}


def compile_decoder(model, inductor: dict | None = None) -> None:
    """Make ``model.decode`` run its step compiled with torch.compile (``model.decode_step``; dynamic
    shapes: the cache position changes every step). Sampling results are unchanged up to float rounding.

    ``inductor``: torch._inductor.config settings in force whenever the compiled function runs (and
    compiles); default ``CPU_DECODE_INDUCTOR`` on the CPU, none elsewhere. With ``freezing`` the
    weights are constants of the compiled code (one more, prepacked, copy): compile again after
    changing them.

    The KV cache goes in as arguments, not module attributes: dynamo treats those as static (under
    ``freezing`` as constants guarded by identity: every ``setup_cache`` would recompile). Tensor
    arguments go in as fresh contiguous copies: callers pass slices (``pos[t:t + 1].expand(...)``)
    whose storage offset changes every step; dynamo would guard on it and recompile until its
    recompile limit, then fall back to eager."""
    model = unwrap_model(model)
    layers = [layer.attention for layer in model.layers]
    eager_decode = model.eager_decode
    if inductor is None:
        inductor = CPU_DECODE_INDUCTOR if model.output.weight.device.type == "cpu" else {}
    settings = dict(inductor)
    from torch._inductor import config as inductor_config

    def step(caches, args, kwargs):
        for attention, cache in zip(layers, caches):
            attention.cache = cache
        return eager_decode(*args, **kwargs)
    # a code object of its own: dynamo's graphs and recompile budget are per code object
    step = types.FunctionType(step.__code__.replace(), step.__globals__, step.__name__,
                              step.__defaults__, step.__closure__)
    compiled = torch.compile(step, dynamic=True)

    def fresh(x):
        return x.clone(memory_format=torch.contiguous_format) if isinstance(x, Tensor) else x

    def decode(*args):
        inputs = ([a.cache for a in layers], tuple(map(fresh, args)), {})
        if not settings:                  # the default on CUDA: no patch to enter on every step
            return compiled(*inputs)
        with inductor_config.patch(settings):
            return compiled(*inputs)
    model.decode_step = decode
