"""The path-star graph in Bachmann & Nagarajan's own text format (``python -m mutor2d.lm.data stargraph
--format bn``), its scoring, and the paper's GPT-2 configs (the README trains and scores one on a tiny
GPT-2: tests/test_readme.py)."""
import re

import pytest

from mutor2d.lm import accuracy
from mutor2d.lm.data import main as data_main, stargraph_records
from mutor2d.lm.records import DataError

pytest.importorskip("transformers")


@pytest.mark.parametrize("degree, path_len", [(2, 5), (3, 4), (2, 10)])
def test_bn_records_are_star_graphs_in_their_text(degree, path_len):
    """"u,v|...|u,v/s,g=" then "s,a1,...,g": degree * (path_len - 1) edges, the source with `degree`
    arms, the answer a path of the graph from the source to the goal; the same graphs as the word
    format of the same seed."""
    bn = stargraph_records(degree, path_len, 50, 20, seed=3, fmt="bn")
    words = stargraph_records(degree, path_len, 50, 20, seed=3)
    for r, w in zip(bn, words):
        assert re.fullmatch(r"(\d+,\d+\|)*\d+,\d+/\d+,\d+=", r["prompt"]) and re.fullmatch(r"\d+(,\d+)*", r["answer"])
        edges_text, query = r["prompt"][:-1].split("/")
        edges = [tuple(e.split(",")) for e in edges_text.split("|")]
        source, goal = query.split(",")
        path = r["answer"].split(",")
        assert len(edges) == degree * (path_len - 1) and len(path) == path_len
        assert (path[0], path[-1]) == (source, goal) and sum(u == source for u, _ in edges) == degree
        assert all((a, b) in edges for a, b in zip(path, path[1:]))
        assert path == w["answer"].split() and edges == [tuple(e.split()) for e in w["prompt"].split(" | /")[0].split(" | ")]


def test_the_path_kind_reads_both_formats():
    gold = "3,17,8,41,5"
    assert accuracy.is_correct("3,17,8,41,5", gold, "path") and accuracy.is_correct(" 3 17 8 41 5\n", gold, "path")
    assert not accuracy.is_correct("3,17,8,41", gold, "path") and not accuracy.is_correct("3,17,8,41,5,2", gold, "path")
    assert accuracy.extract("", "path") is None


def test_an_unknown_format_is_one_line(tmp_path, capsys):
    with pytest.raises(DataError, match="--format 'xml': expected one of words, bn"):
        stargraph_records(2, 5, 50, 1, 0, "xml")
    with pytest.raises(SystemExit):
        data_main(["stargraph", str(tmp_path / "x.jsonl"), "--format", "xml"])
    assert "invalid choice: 'xml'" in capsys.readouterr().err


@pytest.mark.parametrize("name, d_max, a", [("sft_stargraph_gpt2_mutor.yaml", 4, 0.5),
                                            ("sft_stargraph_gpt2_p10_mutor.yaml", 6, 0.3),
                                            ("sft_stargraph_gpt2_ntp.yaml", None, None),
                                            ("sft_stargraph_gpt2_p10_ntp.yaml", None, None)])
def test_the_paper_star_graph_configs(name, d_max, a):
    """GPT-2 Large, full fine-tuning in bf16; AdamW 1e-5, (0.9, 0.999), no decay, batch 16, 100 warm-up
    steps then cosine to 1e-5; d = 2..4, a = 0.5 (path 5) or d = 2..6, a = 0.3 (path 10); whole-path scoring."""
    from mutor2d.lm.config import load
    cfg = load(name)
    o, t, m = cfg.optim, cfg.train, cfg.model
    assert (m.hf, m.finetune, m.dtype) == ("models/gpt2-large", "full", "bfloat16")
    assert (o.lr, tuple(o.betas), o.weight_decay, o.schedule, o.warmup_steps, o.min_lr) == \
        (1e-5, (0.9, 0.999), 0.0, "cosine", 100, 1e-5)
    assert t.batch_size == 16 and t.max_steps == 200_000 * 100 // 16 and cfg.eval.kind == "path"
    if d_max is None:
        assert cfg.objective.name == "ntp"
    else:
        assert (cfg.objective.name, cfg.objective.d_min, cfg.objective.d_max, cfg.objective.reg_weight) == \
            ("mutor-1d", 2, d_max, a)
    assert ("p10" in name) == ("p10" in cfg.data.path)
