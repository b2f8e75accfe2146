"""A decode step replayed as a CUDA graph: the eager decode step launches hundreds of small kernels
per token (GPT-B: 55-69x its weight-read floor on an H200, docs/BENCHMARKS.md); a graph launches them
as one. ``capture_decoder(model)`` makes the plain rounds (one regular token per row, no registers:
``--decode plain``, with or without CFG) of every batch replay one graph over ``GPT.fixed_decode``: the
whole static KV cache under the mask "keys 0..index", the index a device tensor, so one graph serves
every position of a batch; prefill and speculative rounds stay eager. The tokens are those of the
eager step up to float rounding (the same kernels, the cache read under a mask).

A batch captures its graph at its first plain round (its cache is its own): the step runs twice
eagerly on a side stream (warm-up: the same inputs, so the keys written are the same), then once
under capture. ``graphs`` is what captures and replays: :class:`CudaGraphs` on CUDA; tests pass a
stand-in with the same two methods that replays eagerly on the CPU.
"""
from __future__ import annotations

import time

import torch
from torch import Tensor


class CudaGraphs:
    """torch.cuda.CUDAGraph capture of a function of static buffers; counts captures and their time."""

    def __init__(self):
        self.captures, self.seconds = 0, 0.0

    def capture(self, fn) -> tuple[object, Tensor]:
        """(graph, its output buffer) of ``fn()``, after two warm-up calls on a side stream."""
        t0 = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        torch.cuda.synchronize()
        self.captures, self.seconds = self.captures + 1, self.seconds + time.perf_counter() - t0
        return graph, out

    def summary(self) -> str:
        return (f"decode step replayed as a CUDA graph: {self.captures} capture(s), "
                f"{self.seconds:.2f} s in all" if self.captures else "")


class CapturedStep:
    """``GPT.fixed_decode`` of a batch of ``rows`` (the model's cache batch) behind static input
    buffers: a call copies its inputs in and replays the graph (captured at the first call)."""

    def __init__(self, model, rows: int, graphs):
        dev = model.output.weight.device
        self.model, self.graphs = model, graphs
        self.tokens = torch.zeros(rows, 1, dtype=torch.long, device=dev)
        self.positions = torch.zeros(rows, 1, 2, dtype=torch.long, device=dev)
        self.index = torch.zeros((), dtype=torch.long, device=dev)
        self.graph = self.out = None

    def __call__(self, tokens: Tensor, positions: Tensor, index: int) -> Tensor:
        """Logits (rows, 1, vocab) of ``tokens`` (rows, 1) at ``positions`` (rows, 1, 2), cache index ``index``."""
        self.tokens.copy_(tokens)
        self.positions.copy_(positions)
        self.index.fill_(index)
        if self.graph is None:
            self.graph, self.out = self.graphs.capture(
                lambda: self.model.fixed_decode(self.tokens, self.positions, self.index))
        self.graph.replay()
        return self.out.clone()          # the buffer is overwritten by the next replay


def capture_decoder(model, graphs=None) -> None:
    """Make the plain decode rounds of ``model`` replay a captured graph (``GPTStep``); ``graphs``:
    default :class:`CudaGraphs` (CUDA only)."""
    if graphs is None:
        if model.output.weight.device.type != "cuda":
            raise ValueError("capture_decoder: CUDA graphs need the model on a CUDA device "
                             f"(it is on {model.output.weight.device})")
        graphs = CudaGraphs()
    model.decode_graphs = graphs
