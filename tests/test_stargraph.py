"""Path-star graphs: structure of prompts/answers, disjoint test set, the shortcut's solve rate."""
import pytest
import torch

from mutor2d.data import stargraph
from mutor2d import config as config_lib
from mutor2d.config import ConfigError, make
from mutor2d.data.stargraph import ANSWER, EDGE, NUM_SPECIAL, QUERY, StarGraphShape, make_graphs
from mutor2d.registry import build


def shortcut_answer(prompt: torch.Tensor, shape: StarGraphShape, first_step: int) -> torch.Tensor:
    """The 'Clever Hans' answer: from the source take ``first_step``-th outgoing edge, then follow
    the unique edge out of each node. Solves 1/degree of graphs."""
    E = shape.num_edges
    edges = prompt[: 3 * E].view(E, 3)[:, :2]
    source = prompt[3 * E + 1]
    out = [source]
    starts = edges[edges[:, 0] == source][:, 1]
    node = starts[first_step % len(starts)]
    out.append(node)
    for _ in range(shape.path_len - 2):
        node = edges[edges[:, 0] == node][0, 1]
        out.append(node)
    return torch.stack(out)


def test_graph_structure():
    shape = StarGraphShape(degree=3, path_len=4, num_nodes=20)
    prompts, answers = make_graphs(shape, 50, seed=0)
    E = shape.num_edges
    assert prompts.shape == (50, 3 * E + 4) and answers.shape == (50, 4)
    for p, a in zip(prompts, answers):
        edges = {(int(u), int(v)) for u, v in p[: 3 * E].reshape(E, 3)[:, :2]}
        assert len(edges) == E
        assert p[3 * E] == QUERY and p[-1] == ANSWER
        assert (p[2: 3 * E: 3] == EDGE).all()                            # "u v |" per edge
        assert p[3 * E + 1] == a[0] and p[3 * E + 2] == a[-1]          # source, goal
        assert all((int(u), int(v)) in edges for u, v in zip(a[:-1], a[1:]))  # a real path
        assert sum(1 for u, _ in edges if u == a[0]) == 3              # degree arms from the source
        nodes = {n for e in edges for n in e}
        assert len(nodes) == 1 + 3 * 3 and min(nodes) >= NUM_SPECIAL


def test_graphs_drawn_in_chunks_equal_one_draw(monkeypatch):
    shape = StarGraphShape(degree=3, path_len=4, num_nodes=30)
    whole = make_graphs(shape, 10, seed=5)
    monkeypatch.setattr(stargraph, "_ROWS", 3)                        # 3 + 3 + 3 + 1 graphs
    for a, b in zip(whole, make_graphs(shape, 10, seed=5)):
        assert (a == b).all()


def test_split_disjoint_and_seeded():
    cfg = make("data", name="stargraph", degree=2, path_len=5, num_nodes=12, num_train=300, num_test=100)
    train, test = build(cfg, "train"), build(cfg, "test")
    seen = {tuple(p.tolist()) for p in train.prompts}
    assert not any(tuple(p.tolist()) in seen for p in test.prompts)
    assert torch.equal(build(cfg, "train").prompts, train.prompts)
    assert train.grid == (1, 5) and train.vocab_size == 12 + NUM_SPECIAL
    item = train[0]
    assert item["body"].shape == (5,) and item["prefix"].shape == (3 * 8 + 4,)


def test_shortcut_solves_about_one_over_degree():
    shape = StarGraphShape(2, 5, 50)
    prompts, answers = make_graphs(shape, 400, seed=3)
    solved = sum(torch.equal(shortcut_answer(torch.from_numpy(p), shape, 0), torch.from_numpy(a))
                 for p, a in zip(prompts, answers))
    assert 0.4 < solved / 400 < 0.6


def test_bad_shape_is_one_line_error():
    with pytest.raises(ValueError, match="num_nodes=5"):
        StarGraphShape(3, 4, 5)
    with pytest.raises(ConfigError, match=r"^data.num_test: expected .*, got 0$"):
        config_lib.load("stargraph_ntp.yaml", ["data.num_test=0"])


# ----------------------------------------------------------------------------- evaluation

import importlib.util
import json
import shutil
from pathlib import Path

from mutor2d.evaluation import stargraph as stargraph_eval
from mutor2d.evaluation import records
from mutor2d.model.config import ModelConfig
from mutor2d.model.gpt import GPT
from mutor2d.objectives.layout import regular_position_ids
from mutor2d.data.stargraph import StarGraphs
from mutor2d.evaluation.stargraph import solve_rates, teacher_forced_accuracy

ROOT = Path(__file__).resolve().parent.parent


def test_reverse_answer_is_the_flipped_path():
    shape = StarGraphShape(2, 5, 20)
    fwd, rev = StarGraphs(shape, 30, seed=4), StarGraphs(shape, 30, seed=4, reverse=True)
    assert torch.equal(rev.prompts, fwd.prompts) and torch.equal(rev.answers, fwd.answers.flip(1))
    assert fwd.first_step_index == 1 and rev.first_step_index == 3
    assert torch.equal(rev.answers[:, rev.first_step_index], fwd.answers[:, 1])
    cfg = make("data", name="stargraph", degree=2, path_len=5, num_nodes=20, num_train=50, num_test=20,
                     reverse_answer=True)
    test = build(cfg, "test")
    assert (test.answers[:, 0] == test.prompts[:, -2]).all()           # starts at the goal


def test_solve_rates_scores_exact_paths_and_first_step(monkeypatch):
    """solve_rates on stand-in decoders: the truth solves everything; the shortcut solves exactly the
    graphs whose first step it guesses, so solve rate == first-step accuracy, near 1/degree."""
    shape = StarGraphShape(2, 5, 50)
    for reverse in (False, True):
        ds = StarGraphs(shape, 300, seed=5, reverse=reverse)
        lookup = {p.numpy().tobytes(): i for i, p in enumerate(ds.prompts)}
        short = torch.stack([shortcut_answer(p, shape, 0) for p in ds.prompts])
        if reverse:
            short = short.flip(1)

        def fake(answers):
            return lambda model, prompts, grid, **kw: answers[[lookup[p.numpy().tobytes()] for p in prompts]]
        monkeypatch.setattr(stargraph_eval, "generate", fake(ds.answers))
        assert solve_rates(None, ds, batch_size=64) == {"solve_rate": 1.0, "first_step_acc": 1.0, "n": 300}
        monkeypatch.setattr(stargraph_eval, "generate", fake(short))
        r = solve_rates(None, ds, batch_size=64)
        truth = (short == ds.answers).all(1).float().mean().item()
        assert r["solve_rate"] == pytest.approx(truth) and r["first_step_acc"] == pytest.approx(truth)
        assert 0.35 < truth < 0.65
        wrong_last = short.clone()
        wrong_last[:, ds.first_step_index] = 0                           # first step always wrong
        monkeypatch.setattr(stargraph_eval, "generate", fake(wrong_last))
        assert solve_rates(None, ds, batch_size=64)["first_step_acc"] == 0.0


def _tiny_model(register_token: bool, vocab: int) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(preset="custom", n_layer=2, n_head=2, dim=32, vocab_size=vocab, conditioning="prompt",
                      rope="1d", token_dropout=0, resid_dropout=0, ffn_dropout=0, class_dropout=0,
                      attention="sdpa")
    model = GPT(cfg, register_token=register_token).eval()
    torch.nn.init.normal_(model.output.weight, std=1.0)                 # zero-initialised otherwise
    return model


def test_teacher_forced_accuracy_matches_one_token_at_a_time():
    """Accuracies from the register layout equal those of plain causal runs: the NTP head over the
    regular sequence, and for each (anchor t, offset d) a run of prompt, x_0..x_t and one register
    standing at the position of the target's NTP predictor. A tiny vocabulary keeps a
    random model's accuracies well away from 0."""
    shape = StarGraphShape(2, 4, 7)
    ds = StarGraphs(shape, 120, seed=6)
    N, P = shape.path_len, shape.prompt_len
    model = _tiny_model(True, shape.vocab_size)
    got = teacher_forced_accuracy(model, ds, [2, 3], batch_size=50)
    with torch.no_grad():
        pos = regular_position_ids(ds.grid, P).expand(len(ds), -1, -1)
        logits = model(ds.answers[:, : N - 1], pos, ds.prompts)
        ntp = (logits[:, P - 1:].argmax(-1) == ds.answers).float().mean(0)
        assert got["ntp"] == pytest.approx(ntp.tolist(), abs=1e-6)
        assert 0 < min(got["ntp"]) and max(got["ntp"]) < 1
        for d in (2, 3):
            want = [None] * N
            for t in range(-1, N - 1 - d + 1):
                target = t + d
                if target >= N:
                    continue
                p = torch.cat([regular_position_ids(ds.grid, P, P + t + 1), torch.tensor([[0, P + target - 1]])])
                p = p.expand(len(ds), -1, -1)
                out = model(ds.answers[:, : t + 1], p, ds.prompts, 1)[:, -1]
                want[target] = round((out.argmax(-1) == ds.answers[:, target]).float().mean().item(), 4)
            assert got["reg"][d] == pytest.approx(want, abs=1e-4), d
    plain = teacher_forced_accuracy(_tiny_model(False, shape.vocab_size), ds, [2, 3], batch_size=50)
    assert plain["reg"] == {} and len(plain["ntp"]) == N


def _load_script(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_and_evaluate_tiny_run(tmp_path):
    """The real path: train.py trains a tiny MuToR-1D star-graph model for a few steps, eval/stargraph.py
    scores its checkpoint and writes a record the leaderboard lists with a solve_rate column."""
    cfg = tmp_path / "sg.yaml"
    cfg.write_text(
        "model: {preset: custom, n_layer: 1, n_head: 2, dim: 32, conditioning: prompt, rope: 1d, token_dropout: 0,\n"
        "        resid_dropout: 0, ffn_dropout: 0, class_dropout: 0, attention: sdpa}\n"
        "data: {name: stargraph, degree: 2, path_len: 5, num_nodes: 20, num_train: 256, num_test: 40}\n"
        "objective: {name: mutor-1d, d_min: 2, d_max: 4, reg_weight: 0.5}\n"
        "optim: {lr: 1.0e-3}\n"
        "train: {batch_size: 16, max_steps: 4, log_every: 2, ckpt_every: 4, tracker: none}\n")
    run = tmp_path / "run"
    _load_script("train_cli", ROOT / "train.py").main(["--config", str(cfg), "--out", str(run)])
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 4 and "loss_reg" in log[-1]
    ev = _load_script("stargraph_cli", ROOT / "eval" / "stargraph.py")
    rec = ev.main(["--ckpt", str(run), "--batch-size", "16"])
    path = run / "eval" / "stargraph_step00000004.json"
    assert json.loads(path.read_text())["metrics"]["solve_rate"] == rec["metrics"]["solve_rate"]
    assert rec["step"] == 4 and rec["n"] == 40 and rec["method"] == "mutor-1d"
    assert 0 <= rec["metrics"]["solve_rate"] <= rec["metrics"]["first_step_acc"] <= 1
    assert sorted(rec["metrics"]["reg_acc_by_target"]) == [2, 3, 4]
    assert rec["metrics"]["reg_acc_by_target"][2][0] is None                # x_0 is never a register target
    table = records.markdown_table(records.read_records([run])[0])
    assert "solve_rate" in table.splitlines()[0] and "first_step_acc" in table.splitlines()[0]
    with pytest.raises(ValueError, match="--offsets 7"):
        ev.main(["--ckpt", str(run), "--offsets", "7"])
    shutil.copyfile(run / "checkpoints" / "step_00000004.pt", tmp_path / "copy.pt")   # outside a run folder:
    ev.main(["--ckpt", str(tmp_path / "copy.pt"), "--num", "8", "--batch-size", "8"])  # the record goes beside it
    assert json.loads((tmp_path / "copy_eval" / "stargraph_step00000004.json").read_text())["n"] == 8
