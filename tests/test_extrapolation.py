"""Position extrapolation (mutor2d.evaluation.extrapolation, mutor2d.lm.extrapolation, eval/extrapolation.py):
NLL by position against hand-computed references on tiny models built here, positions past training
reported and marked, taller grids, one-line refusals. Nothing downloads."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from mutor2d.evaluation.extrapolation import (Curve, ExtrapolationError, check_grid, grid_token_nll, image_curve,
                                              stacked_grids, summarise)
from mutor2d.model.gpt import GPT
from mutor2d.model.config import ModelConfig
from mutor2d.objectives.layout import regular_position_ids

ROOT = Path(__file__).resolve().parent.parent
V, C = 6, 3


@pytest.fixture(autouse=True)
def _threads(one_thread):
    yield


def cli():
    spec = importlib.util.spec_from_file_location("extrapolation_cli", ROOT / "eval" / "extrapolation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_gpt(rope="2d", seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(preset="custom", n_layer=1, n_head=2, dim=16, vocab_size=V, num_classes=C, rope=rope,
                      token_dropout=0, resid_dropout=0, ffn_dropout=0, class_dropout=0, attention="sdpa")
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def test_curve_bins_pool_tokens():
    c = Curve([2.0, 4.0, 9.0, 0.0], [1, 2, 3, 0], [2], ["inside", "beyond"])
    assert c.nll() == [2.0, 2.0, 3.0, None]
    assert c.binned() == {"inside": 2.0, "beyond": 3.0}               # (2 + 4) / 3, 9 / 3
    three = Curve([1.0, 2.0, 3.0], [1, 1, 1], [1, 2], ["inside", "base range", "beyond"])
    assert three.binned() == {"inside": 1.0, "base range": 2.0, "beyond": 3.0}
    short = Curve([1.0], [1], [4], ["inside", "beyond"])               # nothing reached past the limit
    assert short.binned() == {"inside": 1.0, "beyond": None}


def test_stacked_grids_pair_within_a_class_and_use_every_image_once_per_block():
    codes = torch.arange(5)[:, None, None].expand(5, 2, 3).clone()     # image i is all i
    labels = torch.tensor([0, 1, 0, 0, 1])
    grids = stacked_grids(codes, labels, 3)
    assert grids.shape == (5, 6, 3)
    blocks = grids[:, ::2, 0]                                          # (n, 3): the image of each block
    assert blocks[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert blocks[0].tolist() == [0, 2, 3] and blocks[3].tolist() == [3, 0, 2] and blocks[4].tolist() == [4, 1, 4]
    for k in range(3):
        assert sorted(blocks[:, k].tolist()) == [0, 1, 2, 3, 4]
        assert (labels[blocks[:, k]] == labels).all()


def test_grid_nll_equals_one_token_at_a_time():
    """Each token's NLL from a forward over the prefix and the tokens before it only, at the positions of
    the taller grid: the same numbers as the one teacher-forced pass."""
    model = tiny_gpt()
    codes, labels = torch.randint(0, V, (2, 4, 3)), torch.tensor([1, 2])
    got = grid_token_nll(model, codes, labels)
    pos = regular_position_ids((4, 3), 1, length=12)
    body = codes.flatten(1)
    with torch.no_grad():
        for t in range(12):
            logits = model(body[:, :t], pos[:t + 1].expand(2, -1, -1), labels)[:, -1]
            want = -F.log_softmax(logits, -1).gather(1, body[:, t:t + 1])[:, 0]
            assert torch.allclose(got.flatten(1)[:, t], want, atol=1e-5)


def test_taller_grid_rows_are_marked_and_inside_rows_are_the_native_evaluation():
    model = tiny_gpt()
    codes, labels = torch.randint(0, V, (6, 2, 3)), torch.tensor([0, 1, 0, 2, 1, 0])
    curve = image_curve(model, model.cfg, (2, 3), codes, labels, stack=2)
    assert len(curve.count) == 4 and curve.edges == [2] and curve.count == [18] * 4
    native = grid_token_nll(model, codes, labels)                       # (6, 2, 3) at rows 0..1
    assert curve.nll()[:2] == pytest.approx(native.mean((0, 2)).tolist(), abs=1e-6)
    assert curve.binned()["inside"] == pytest.approx(native.mean().item(), abs=1e-6)
    by_hand = grid_token_nll(model, stacked_grids(codes, labels, 2), labels)[:, 2:].mean()
    assert curve.binned()["beyond"] == pytest.approx(by_hand.item(), abs=1e-6)


def test_wrapped_rows_reuse_the_trained_positions():
    """The control: the stacked grid read with row ids mod H; its inside rows are those of the plain run."""
    model = tiny_gpt()
    codes, labels = torch.randint(0, V, (4, 2, 3)), torch.tensor([0, 1, 0, 1])
    grids = stacked_grids(codes, labels, 2)
    pos = regular_position_ids((4, 3), 1)
    pos = torch.stack([torch.where(pos[:, 0] >= 0, pos[:, 0] % 2, -1), pos[:, 1]], dim=-1)
    with torch.no_grad():
        logits = model(grids.flatten(1)[:, :-1], pos.expand(4, -1, -1), labels)
    want = F.cross_entropy(logits.transpose(1, 2), grids.flatten(1), reduction="none").view(4, 4, 3)
    assert torch.allclose(grid_token_nll(model, grids, labels, wrap=2), want, atol=1e-6)
    plain, wrapped = (image_curve(model, model.cfg, (2, 3), codes, labels, 2, wrap=w) for w in (False, True))
    assert wrapped.nll()[:2] == pytest.approx(plain.nll()[:2]) and wrapped.nll()[2:] != pytest.approx(plain.nll()[2:])


def test_image_refusals_are_one_line():
    with pytest.raises(ExtrapolationError, match="rope=1d") as e:
        check_grid(tiny_gpt(rope="1d").cfg, (2, 3), (4, 3))
    assert "\n" not in str(e.value)
    with pytest.raises(ExtrapolationError, match="trained on width 3"):
        check_grid(tiny_gpt().cfg, (2, 3), (4, 2))                      # narrower than trained
    with pytest.raises(ExtrapolationError, match="fewer rows"):
        check_grid(tiny_gpt().cfg, (4, 3), (2, 3))
    with pytest.raises(ExtrapolationError, match="stack 1"):
        stacked_grids(torch.zeros(2, 2, 3, dtype=torch.long), torch.tensor([0, 1]), 1)


def test_summary_refuses_runs_of_one_label_trained_on_different_lengths():
    a, b = (Curve([1.0, 2.0], [1, 1], [e], ["inside", "beyond"]) for e in (1, 2))
    s = summarise([{"label": "x", "curve": a}, {"label": "y", "curve": a}])
    assert s["x"]["beyond - inside"]["mean"] == pytest.approx(1.0) and s["x"]["runs"] == 1
    with pytest.raises(ExtrapolationError, match="label x"):
        summarise([{"label": "x", "curve": a}, {"label": "x", "curve": b}])


def test_image_cli_on_a_trained_run(tiny_digits_run, tmp_path, capsys):
    out = tmp_path / "curves.json"
    result = cli().main(["image", "--run", f"mutor={tiny_digits_run}", "--run", f"mutor={tiny_digits_run}",
                         "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["runs"][0]["trained_grid"] == [8, 8] and saved["runs"][0]["grid"] == [16, 8]
    assert len(saved["runs"][0]["curve"]["nll"]) == 16 and saved["runs"][0]["curve"]["edges"] == [8]
    assert result["summary"]["mutor"]["runs"] == 2 and result["summary"]["mutor"]["beyond"]["sd"] == 0
    assert "| mutor | 2 | 8 | " in capsys.readouterr().out


# ----------------------------------------------------------------------------- language models

def lm_run(folder: Path, train_answers: list[str], base: Path | None = None, rule: str = "causal") -> Path:
    """A run folder as train.py leaves it (a tiny random Llama, its tokenizer, config.yaml naming the
    training file and the base), without training."""
    from mutor2d.lm.tiny import write_tiny_llama
    write_tiny_llama(folder, hidden=16, layers=1, heads=2, seed=len(train_answers), init_std=0.3)
    data = folder / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": "Question: 1+1?\n\nAnswer:", "answer": a}) + "\n"
                            for a in train_answers))
    (folder / "mutor2d_inference.json").write_text(json.dumps({"prompt_attention": rule}))
    cfg = {"task": "lm", "model": {"hf": str(base or "models/none"), "prompt_attention": rule},
           "data": {"name": "jsonl", "path": str(data), "max_prompt_len": 160, "max_answer_len": 64}}
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    return folder


HELD_OUT = [{"prompt": "Question: 2+3?\n\nAnswer:", "answer": " 2+3=5\n5+4=9\n#### 9"},
            {"prompt": "Question: 7?\n\nAnswer:", "answer": " 7+1=8\n#### 8"}]


def test_answer_nll_equals_a_plain_forward_and_marks_positions_past_training(tmp_path):
    from mutor2d.lm.extrapolation import answer_curve
    from mutor2d.lm.hf import load_for_inference, load_tokenizer
    run = lm_run(tmp_path / "run", [" 1+1=2", " 2"])                    # longest: 6 chars + EOS = 7 tokens
    curve, chain = answer_curve(str(run), HELD_OUT)
    assert chain[0]["longest_answer"] == 7 and curve.edges == [7] and curve.bins == ["inside", "beyond"]
    tok, lm = load_tokenizer(run), load_for_inference(run)
    sums, counts = [0.0] * 20, [0] * 20
    for rec in HELD_OUT:
        p = tok(rec["prompt"])["input_ids"]
        a = tok(rec["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        with torch.no_grad():
            logp = F.log_softmax(lm(torch.tensor([p + a])).logits[0].float(), -1)
        for k, t in enumerate(a):
            sums[k] -= logp[len(p) + k - 1, t].item()
            counts[k] += 1
    n = max(k + 1 for k, c in enumerate(counts) if c)
    assert curve.count == counts[:n] and len(curve.count) == 20            # the longer answer: 19 chars + EOS
    assert curve.nll_sum == pytest.approx(sums[:n], abs=1e-4)
    want = sum(sums[7:n]) / sum(counts[7:n])
    assert curve.binned()["beyond"] == pytest.approx(want, abs=1e-5)


def test_a_base_run_in_the_chain_adds_its_range(tmp_path):
    from mutor2d.lm.extrapolation import answer_curve
    base = lm_run(tmp_path / "base", [" 1+1=2\n2+2=4\n#### 4"])        # 19 chars + EOS
    run = lm_run(tmp_path / "run", [" 1+1=2"], base=base)
    curve, chain = answer_curve(str(run), HELD_OUT)
    assert [c["longest_answer"] for c in chain] == [7, 20]
    assert curve.edges == [7, 20] and curve.bins == ["inside", "base range", "beyond"]
    assert set(curve.binned()) == {"inside", "base range", "beyond"}


def test_bidirectional_prompt_rule():
    from mutor2d.lm.extrapolation import prompt_visibility
    vis = prompt_visibility(torch.tensor([3]), torch.tensor([5]), 6, "bidirectional")
    want = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                         [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(vis.dense_mask()[0, 0], want)
    causal = prompt_visibility(torch.tensor([3]), torch.tensor([5]), 6, "causal")
    assert torch.equal(causal.dense_mask()[0, 0, :5, :5], torch.ones(5, 5, dtype=torch.bool).tril())


def test_bad_input_is_one_line(tmp_path, capsys):
    module = cli()
    with pytest.raises(SystemExit) as e:
        module.main(["lm", "--run", f"a={tmp_path / 'missing'}", "--data", "x.jsonl", "--out", str(tmp_path / "o.json")])
    assert e.value.code == 2 and "no such run folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        module.main(["image", "--run", "no-label", "--out", str(tmp_path / "o.json")])
    assert "expected LABEL=RUN" in capsys.readouterr().err
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(HELD_OUT[0]) + "\n")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExtrapolationError, match="no config.yaml") as err:
        module.main(["lm", "--run", f"a={tmp_path / 'empty'}", "--data", str(data), "--data-name", "jsonl",
                     "--out", str(tmp_path / "o.json")])
    assert "\n" not in str(err.value)
    run = lm_run(tmp_path / "run", [" 1+1=2"])
    (run / "train.jsonl").unlink()
    with pytest.raises(ExtrapolationError, match="is not there"):
        module.main(["lm", "--run", f"a={run}", "--data", str(data), "--data-name", "jsonl", "--out", str(tmp_path / "o.json")])
    with pytest.raises(ExtrapolationError, match="no readable checkpoint"):
        module.main(["image", "--run", f"a={tmp_path / 'empty'}", "--out", str(tmp_path / "o.json")])


def test_image_cli_refuses_a_1d_rope_run_in_one_line(tiny_digits_run, tmp_path, monkeypatch):
    from mutor2d.evaluation import extrapolation
    opened = extrapolation.open_image_run(str(tiny_digits_run))
    opened[1].model.rope = "1d"
    monkeypatch.setattr(extrapolation, "open_image_run", lambda run, split: opened)
    with pytest.raises(ExtrapolationError, match="rope=1d"):
        cli().main(["image", "--run", f"a={tiny_digits_run}", "--out", str(tmp_path / "o.json")])

