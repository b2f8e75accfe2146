"""Path-star graph task (Bachmann & Nagarajan 2024, "The pitfalls of next-token prediction").

A graph has a source node with ``degree`` arms; each arm is a path of ``path_len - 1`` further
nodes, so the path from the source to the end of an arm has ``path_len`` nodes. Node labels are
distinct values drawn from ``num_nodes``. One arm's end is the goal.

Sequence (1D, the degenerate grid H = 1):
  prompt (prefix, P = 2E + 4 tokens): the E = degree*(path_len-1) edges "u v" in random order,
      then QUERY, source, goal, ANSWER;
  answer (body, N = path_len tokens): source, a_1, ..., goal.
Loss is on the answer only (the prompt is the prefix). Next-token training learns the shortcut
"follow the edge that starts at the previous node", which cannot choose a_1: ~1/degree solved.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

QUERY, ANSWER = 0, 1       # special tokens; node v is token v + NUM_SPECIAL
NUM_SPECIAL = 2


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
        return 2 * self.num_edges + 4

    @property
    def vocab_size(self) -> int:
        return self.num_nodes + NUM_SPECIAL


def make_graphs(shape: StarGraphShape, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` random graphs -> prompts (count, P) and answers (count, path_len), int64 tokens."""
    rng = np.random.default_rng(seed)
    d, L, E = shape.degree, shape.path_len, shape.num_edges
    prompts = np.empty((count, shape.prompt_len), dtype=np.int64)
    answers = np.empty((count, L), dtype=np.int64)
    for i in range(count):
        nodes = rng.choice(shape.num_nodes, size=1 + d * (L - 1), replace=False) + NUM_SPECIAL
        source, arms = nodes[0], nodes[1:].reshape(d, L - 1)
        paths = np.concatenate([np.full((d, 1), source), arms], axis=1)      # (d, L)
        edges = np.stack([paths[:, :-1].reshape(-1), paths[:, 1:].reshape(-1)], axis=1)
        edges = edges[rng.permutation(E)]
        goal_arm = rng.integers(d)
        prompts[i] = np.concatenate([edges.reshape(-1), [QUERY, source, paths[goal_arm, -1], ANSWER]])
        answers[i] = paths[goal_arm]
    return prompts, answers


class StarGraphs(Dataset):
    """Items ``{"body": answer (N,), "prefix": prompt (P,)}``; ``grid`` = (1, path_len).
    ``test`` graphs come from a different seed stream and exclude any prompt seen in train."""

    num_classes = 0

    def __init__(self, shape: StarGraphShape, count: int, seed: int, exclude: "StarGraphs | None" = None):
        self.shape = shape
        prompts, answers = make_graphs(shape, count, seed)
        if exclude is not None:
            seen = {p.tobytes() for p in exclude.prompts.numpy()}
            keep = np.array([p.tobytes() not in seen for p in prompts], dtype=bool)
            prompts, answers = prompts[keep], answers[keep]
        self.prompts, self.answers = torch.from_numpy(prompts), torch.from_numpy(answers)
        self.grid = (1, shape.path_len)
        self.vocab_size = shape.vocab_size

    def __len__(self) -> int:
        return len(self.answers)

    def __getitem__(self, i: int) -> dict:
        return {"body": self.answers[i], "prefix": self.prompts[i]}


def build_stargraph(cfg, split: str) -> StarGraphs:
    """Train and test sets of a DataConfig (degree, path_len, num_nodes, num_train, num_test,
    data_seed); test graphs use seed data_seed + 1 and never repeat a train prompt."""
    shape = StarGraphShape(cfg.degree, cfg.path_len, cfg.num_nodes)
    if split == "train":
        return StarGraphs(shape, cfg.num_train, cfg.data_seed)
    if split == "test":
        train = StarGraphs(shape, cfg.num_train, cfg.data_seed)
        return StarGraphs(shape, cfg.num_test, cfg.data_seed + 1, exclude=train)
    raise ValueError(f"split {split!r}: expected 'train' or 'test'")


def shortcut_answer(prompt: torch.Tensor, shape: StarGraphShape, first_step: int) -> torch.Tensor:
    """The 'Clever Hans' answer: from the source take ``first_step``-th outgoing edge, then follow
    the unique edge out of each node. For tests of the harness: solves 1/degree of graphs."""
    E = shape.num_edges
    edges = prompt[: 2 * E].view(E, 2)
    source = prompt[2 * E + 1]
    out = [source]
    starts = edges[edges[:, 0] == source][:, 1]
    node = starts[first_step % len(starts)]
    out.append(node)
    for _ in range(shape.path_len - 2):
        node = edges[edges[:, 0] == node][0, 1]
        out.append(node)
    return torch.stack(out)
