"""Path-star graph task (Bachmann & Nagarajan 2024, "The pitfalls of next-token prediction").

A graph has a source node with ``degree`` arms; each arm is a path of ``path_len - 1`` further
nodes, so the path from the source to the end of an arm has ``path_len`` nodes. Node labels are
distinct values drawn from ``num_nodes``. One arm's end is the goal.

Sequence (1D, the degenerate grid H = 1):
  prompt (prefix, P = 3E + 4 tokens): the E = degree*(path_len-1) edges "u v |" in random order
      (EDGE ends each edge, as the original's delimiters do), then QUERY, source, goal, ANSWER;
  answer (body, N = path_len tokens): source, a_1, ..., goal.
Loss is on the answer only (the prompt is the prefix). Next-token training learns the shortcut
"follow the edge that starts at the previous node", which cannot choose a_1: ~1/degree solved.
Without the EDGE delimiter that lookup is ambiguous: the token after "u v" is the next edge's u, so
"the token whose predecessor is a_k" matches both a_k's successor and an unrelated u, and telling
them apart needs the parity of the absolute position, which relative (RoPE) attention does not
give (our next-token runs without it never left the initial plateau; docs/RESULTS.md, "Star graph").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from .config import StarGraphDataConfig

QUERY, ANSWER, EDGE = 0, 1, 2      # special tokens; node v is token v + NUM_SPECIAL
NUM_SPECIAL = 3
_ROWS = 8192                       # graphs per random draw in make_graphs


@dataclass(frozen=True)
class StarGraphShape:
    degree: int
    path_len: int
    num_nodes: int

    def __post_init__(self):
        if self.degree < 2:
            raise ValueError(f"data.degree: need at least 2 arms, got {self.degree}")
        if self.path_len < 2:
            raise ValueError(f"data.path_len: need at least 2 nodes on a path, got {self.path_len}")
        need = 1 + self.degree * (self.path_len - 1)
        if need > self.num_nodes:
            raise ValueError(f"data.num_nodes={self.num_nodes}: a {self.degree}-arm graph with "
                             f"path_len {self.path_len} needs {need} distinct nodes")

    @property
    def num_edges(self) -> int:
        return self.degree * (self.path_len - 1)

    @property
    def prompt_len(self) -> int:
        return 3 * self.num_edges + 4

    @property
    def vocab_size(self) -> int:
        return self.num_nodes + NUM_SPECIAL


def make_graphs(shape: StarGraphShape, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` random graphs -> prompts (count, P) and answers (count, path_len), int64 tokens.
    Vectorised: distinct nodes are the first 1 + E entries of a random permutation per graph, drawn
    ``_ROWS`` graphs at a time (the same numbers as one draw; memory stays bounded for large num_nodes)."""
    rng = np.random.default_rng(seed)
    d, L, E = shape.degree, shape.path_len, shape.num_edges
    nodes = np.concatenate([rng.random((min(_ROWS, count - i), shape.num_nodes)).argsort(axis=1)[:, : 1 + E]
                            for i in range(0, count, _ROWS)]) + NUM_SPECIAL
    source = nodes[:, :1]                                                  # (count, 1)
    paths = np.concatenate([np.repeat(source[:, None], d, 1), nodes[:, 1:].reshape(count, d, L - 1)], 2)
    edges = np.stack([paths[:, :, :-1].reshape(count, E), paths[:, :, 1:].reshape(count, E)], 2)
    order = rng.random((count, E)).argsort(axis=1)
    edges = np.take_along_axis(edges, order[:, :, None], 1)                # shuffled edge list
    edges = np.concatenate([edges, np.full((count, E, 1), EDGE)], 2)       # "u v |"
    answers = paths[np.arange(count), rng.integers(d, size=count)]         # (count, L): the goal's arm
    special = np.stack([np.full(count, QUERY), source[:, 0], answers[:, -1], np.full(count, ANSWER)], 1)
    prompts = np.concatenate([edges.reshape(count, 3 * E), special], 1)
    return prompts.astype(np.int64), answers.astype(np.int64)


class StarGraphs(Dataset):
    """Items ``{"body": answer (N,), "prefix": prompt (P,)}``; ``grid`` = (1, path_len).
    ``test`` graphs come from a different seed stream and exclude any prompt seen in train.
    ``reverse`` writes the answer goal -> source (the positive control: each node is then the
    unique predecessor of the previous one, a lookup). ``first_step_index`` is the answer position
    of the node after the source (1, or N-2 when reversed)."""

    num_classes = 0

    def __init__(self, shape: StarGraphShape, count: int, seed: int, exclude: "StarGraphs | None" = None,
                 reverse: bool = False):
        self.shape = shape
        prompts, answers = make_graphs(shape, count, seed)
        if exclude is not None:
            seen = {p.tobytes() for p in exclude.prompts.numpy()}
            keep = np.array([p.tobytes() not in seen for p in prompts], dtype=bool)
            prompts, answers = prompts[keep], answers[keep]
        if reverse:
            answers = np.ascontiguousarray(answers[:, ::-1])
        self.prompts, self.answers = torch.from_numpy(prompts), torch.from_numpy(answers)
        self.first_step_index = shape.path_len - 2 if reverse else 1
        self.grid = (1, shape.path_len)
        self.vocab_size = shape.vocab_size

    def __len__(self) -> int:
        return len(self.answers)

    def __getitem__(self, i: int) -> dict:
        return {"body": self.answers[i], "prefix": self.prompts[i]}


def stargraph_dataset(cfg: StarGraphDataConfig, split: str) -> StarGraphs:
    """The graphs of ``split``: train from ``data_seed``; test from data_seed + 1, no train prompt repeated."""
    shape = StarGraphShape(cfg.degree, cfg.path_len, cfg.num_nodes)
    if split == "train":
        return StarGraphs(shape, cfg.num_train, cfg.data_seed, reverse=cfg.reverse_answer)
    if split == "test":
        train = StarGraphs(shape, cfg.num_train, cfg.data_seed)
        return StarGraphs(shape, cfg.num_test, cfg.data_seed + 1, exclude=train, reverse=cfg.reverse_answer)
    raise ValueError(f"split {split!r}: expected 'train' or 'test'")
