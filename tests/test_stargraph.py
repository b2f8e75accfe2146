"""Path-star graphs: structure of prompts/answers, disjoint test set, the shortcut's solve rate."""
import pytest
import torch

from mutor2d.config import DataConfig
from mutor2d.stargraph import (ANSWER, NUM_SPECIAL, QUERY, StarGraphShape, build_stargraph,
                               make_graphs, shortcut_answer)


def test_graph_structure():
    shape = StarGraphShape(degree=3, path_len=4, num_nodes=20)
    prompts, answers = make_graphs(shape, 50, seed=0)
    E = shape.num_edges
    assert prompts.shape == (50, 2 * E + 4) and answers.shape == (50, 4)
    for p, a in zip(prompts, answers):
        edges = {(int(u), int(v)) for u, v in p[: 2 * E].reshape(E, 2)}
        assert len(edges) == E
        assert p[2 * E] == QUERY and p[-1] == ANSWER
        assert p[2 * E + 1] == a[0] and p[2 * E + 2] == a[-1]          # source, goal
        assert all((int(u), int(v)) in edges for u, v in zip(a[:-1], a[1:]))  # a real path
        assert sum(1 for u, _ in edges if u == a[0]) == 3              # degree arms from the source
        nodes = {n for e in edges for n in e}
        assert len(nodes) == 1 + 3 * 3 and min(nodes) >= NUM_SPECIAL


def test_split_disjoint_and_seeded():
    cfg = DataConfig(name="stargraph", degree=2, path_len=5, num_nodes=12, num_train=300, num_test=100)
    train, test = build_stargraph(cfg, "train"), build_stargraph(cfg, "test")
    seen = {tuple(p.tolist()) for p in train.prompts}
    assert not any(tuple(p.tolist()) in seen for p in test.prompts)
    assert torch.equal(build_stargraph(cfg, "train").prompts, train.prompts)
    assert train.grid == (1, 5) and train.vocab_size == 14
    item = train[0]
    assert item["body"].shape == (5,) and item["prefix"].shape == (2 * 8 + 4,)


def test_shortcut_solves_about_one_over_degree():
    shape = StarGraphShape(2, 5, 50)
    prompts, answers = make_graphs(shape, 400, seed=3)
    solved = sum(torch.equal(shortcut_answer(torch.from_numpy(p), shape, 0), torch.from_numpy(a))
                 for p, a in zip(prompts, answers))
    assert 0.4 < solved / 400 < 0.6


def test_bad_shape_is_one_line_error():
    with pytest.raises(ValueError, match="num_nodes=5"):
        StarGraphShape(3, 4, 5)
