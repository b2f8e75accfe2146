"""LM accuracy evaluation (mutor2d.lm.accuracy, eval/lm_accuracy.py), data formats and the Python API."""
import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

from mutor2d.lm import accuracy
from mutor2d.lm.accuracy import boxed_answer, gsm8k_answer, is_correct, normalize_math

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

# (model output, gold, correct?) -- written from the datasets' formats, not from the rules' code.
GSM8K_CASES = [
    ("She pays 3*4 = 12 dollars.\n#### 12", "12", True),
    ("#### 1,200", "1200", True),
    ("The answer is $1,200.00.", "1200", True),
    ("So the total is 7.0", "7", True),
    ("Each costs 12.50", "12.5", True),
    ("It took 2.5 hours", "2.50", True),
    ("#### -5", "-5", True),
    ("The temperature drops to -5 degrees.", "-5", True),
    ("He now has \u22123 points", "-3", True),
    ("He has 120 apples", "12", False),
    ("#### 12", "120", False),
    ("Total: 3 + 4 = 7 cups", "7", True),
    ("#### 18\n\nQuestion: Tom has 25 pens", "18", True),
    ("#### 12 apples\nThe final total is 13", "12", True),
    ("First 5, then 10, finally 15.", "15", True),
    ("The answer is 15%", "15", True),
    ("It costs $0.50", "0.5", True),
    ("It costs $.50", "0.5", True),
    ("The answer is 1,000,000 dollars", "1000000", True),
    ("1234", "1,234", True),
    ("#### $ 1,234.", "1234", True),
    ("no numbers here", "5", False),
    ("#### 5\n#### 6", "6", True),
    ("x = 3.14159", "3.14", False),
    ("Answer: 0", "0", True),
    ("Answer: -0", "0", True),
    ("#### 42", "6*7=42\n#### 42", True),
    ("The answer is 42.", "43", False),
    ("She ended with 8 marbles (2 + 6 = 8).", "8", True),
    ("8 marbles, from 2 bags of 6", "8", False),          # the last number counts
    ("The answer is 2,5", "2.5", False),                  # not a decimal comma
    ("It is 3-2=1 left", "1", True),
    ("The difference is 7 - 2", "2", True),               # a spaced minus is an operator
    ("#### - 4", "4", True),
]

MATH_CASES = [
    (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}", True),
    (r"\boxed{\dfrac{1}{2}}", r"\frac12", True),
    (r"\boxed{\tfrac12}", r"\frac{1}{2}", True),
    (r"\boxed{0.5}", r"\frac{1}{2}", True),
    (r"\boxed{.5}", "0.5", True),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{3}", False),
    (r"\boxed{12}", "120", False),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left(3,\frac{\pi}{2}\right)", True),
    (r"\boxed{10\text{ cm}}", "10", True),
    (r"\boxed{10 \mbox{ inches}}", r"10\text{ in}", True),
    (r"\boxed{90^\circ}", "90", True),
    (r"\boxed{90^{\circ}}", r"90^\circ", True),
    (r"\boxed{25\%}", "25", True),
    (r"\boxed{25\%}", r"25\%", True),
    (r"\boxed{x = 5}", "5", True),
    (r"\boxed{5.}", "5", True),
    (r"$\boxed{\sqrt2}$", r"\sqrt{2}", True),
    (r"\boxed{2\sqrt{3}}", r"2\sqrt3", True),
    (r"The answer is $\boxed 7$.", "7", True),
    (r"\fbox{-\frac{3}{4}}", "-0.75", True),
    (r"\boxed{\frac{3}{4}}", r"-\frac34", False),
    (r"first \boxed{3} then \boxed{4}", "4", True),
    (r"first \boxed{3} then \boxed{4}", "3", False),
    (r"\boxed{\{1,2\}}", r"\{1,2\}", True),
    (r"\boxed{\text{(C)}}", "(C)", True),
    (r"\boxed{\text{(C)}}", r"\text{(D)}", False),
    (r"the answer is 5", "5", False),                      # no box, no answer
    (r"\boxed{1,000}", "1000", True),
    (r"\boxed{\$18.90}", "18.90", True),
    (r"\boxed{x^{2}+1}", "x^2+1", True),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\dfrac{\sqrt3}{2}", True),
    (r"\boxed{(1, -2)}", "(1,-2)", True),
    (r"\boxed{\frac{1}{2}", r"\frac{1}{2}", False),         # never closed
    (r"\boxed{\pi}", r"\frac{\pi}{1}", False),
    (r"\boxed{\dfrac{10}{4}}", r"\frac{5}{2}", True),
    (r"\boxed{1/2}", r"\frac{1}{2}", True),
    (r"\boxed{7}", r"So the answer is $\boxed{7}$.", True),  # gold given as a solution text
    (r"\boxed{\frac{1}{0}}", "0", False),
]

# star-graph answers: the whole output, word for word (gold written as the converter writes it)
PATH_CASES = [
    ("3 17 8 41 5", " 3 17 8 41 5", True),
    (" 3 17 8 41 5", "3 17 8 41 5", True),
    ("3  17\n8 41 5 ", " 3 17 8 41 5", True),              # spacing is not a word
    ("3 17 8 41", " 3 17 8 41 5", False),                   # one node short
    ("3 17 8 41 5 5", " 3 17 8 41 5", False),               # one node too many
    ("3 17 8 41 5 =", " 3 17 8 41 5", False),               # a trailing non-node word
    ("3 22 9 40 5", " 3 17 8 41 5", False),                 # the other arm (shortcut's wrong guess)
    ("3 8 17 41 5", " 3 17 8 41 5", False),                 # right nodes, wrong order
    ("3 17 8 4 15", " 3 17 8 41 5", False),                 # same characters, other words
    ("31 7 8 41 5", " 3 17 8 41 5", False),
    ("", " 3 17 8 41 5", False),
    ("  \n", " 3 17 8 41 5", False),
]


@pytest.mark.parametrize("output,gold,expected", GSM8K_CASES)
def test_gsm8k_table(output, gold, expected):
    assert is_correct(output, gold, "gsm8k") is expected


@pytest.mark.parametrize("output,gold,expected", MATH_CASES)
def test_math_table(output, gold, expected):
    assert is_correct(output, gold, "math") is expected


@pytest.mark.parametrize("output,gold,expected", PATH_CASES)
def test_path_table(output, gold, expected):
    assert is_correct(output, gold, "path") is expected


def test_path_extraction():
    assert accuracy.extract(" 3 17\n 8 ", "path") == "3 17 8" and accuracy.extract(" \n ", "path") is None
    assert accuracy.extract("#### 5", "path") == "#### 5"          # no other kind's rules
    items = [{"output": o, "gold": g} for o, g, _ in PATH_CASES]
    assert accuracy.score(items, "path") == {"accuracy": 3 / len(items), "n": len(items), "correct": 3,
                                             "no_answer": 2, "kind": "path"}


def test_extraction_rules():
    assert gsm8k_answer("The answer is $1,200.00.") == "1200" and gsm8k_answer("none") is None
    assert boxed_answer(r"\boxed{\frac{a}{\sqrt{b}}} and \fbox{x}") == "x"
    assert boxed_answer(r"\boxed{\frac{a}{\sqrt{b}}}") == r"\frac{a}{\sqrt{b}}"
    assert boxed_answer(r"\boxedx") is None and boxed_answer("no box") is None
    assert normalize_math(r"\frac12") == normalize_math(r"\dfrac{1}{2}") == r"\frac{1}{2}"
    assert accuracy.score([{"output": "#### 3", "gold": "3"}, {"output": "none", "gold": "3"}], "gsm8k") == \
        {"accuracy": 0.5, "n": 2, "correct": 1, "no_answer": 1, "kind": "gsm8k"}
    with pytest.raises(ValueError, match="--kind 'mmlu': expected one of gsm8k, math, path"):
        accuracy.extract("x", "mmlu")


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "eval" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_lines(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_argument_errors_are_one_line(capsys):
    for argv, message in ((["--score", "p.jsonl"], "--score needs --kind"), (["--ckpt", "run"], "--ckpt needs --data"),
                          (["--score", "p.jsonl", "--kind", "gsm8k", "--batch-size", "0"], "--batch-size 0: expected >= 1")):
        with pytest.raises(SystemExit) as stop:
            _script("lm_accuracy").parse_args(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and message in err and "Traceback" not in err


def test_score_mode_prints_accuracy_last(tmp_path, capsys):
    rows = [{"output": out, "gold": gold} for out, gold, _ in MATH_CASES]
    result = _script("lm_accuracy").main(["--score", str(_write_lines(tmp_path / "p.jsonl", rows)), "--kind", "math"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    expected = sum(c for _, _, c in MATH_CASES) / len(MATH_CASES)
    assert last == result and last["accuracy"] == pytest.approx(expected) and last["n"] == len(MATH_CASES)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"output": "1", "gold": "1"}\n{"output": 3}\n{"output": "1", "gold": "1"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected an object with string fields \['output', 'gold'\]"):
        _script("lm_accuracy").main(["--score", str(bad), "--kind", "gsm8k"])


def _fake_items(n):
    return [{"prompt": f"Q{i}", "prompt_ids": [1] * (1 + i % 3), "gold": str(i)} for i in range(n)]


def _fake_generate(calls):
    def generate(batch):
        calls.append([it["prompt"] for it in batch])
        return [f"#### {it['gold'] if int(it['gold']) % 2 else 99}" for it in batch]   # odd items right
    return generate


def test_shards_merge_and_resume(tmp_path):
    items, calls = _fake_items(7), []
    one = tmp_path / "one.jsonl"
    assert accuracy.predict(items, _fake_generate(calls), one, "gsm8k", batch_size=2) == 7
    merged_one = accuracy.merge_parts(one)
    two = tmp_path / "two.jsonl"                      # two simulated processes, then the main one merges
    done = [accuracy.predict(items, _fake_generate(calls), two, "gsm8k", rank, 2, 2) for rank in (0, 1)]
    assert done == [4, 3] and accuracy.shard(list(range(7)), 1, 2) == [1, 3, 5]
    assert {p.name for p in tmp_path.iterdir()} == {"one.jsonl", "two.jsonl.part0of2", "two.jsonl.part1of2"}
    assert accuracy.merge_parts(two) == merged_one == accuracy.collect(one, 7)
    assert [it["index"] for it in merged_one] == list(range(7)) and not list(tmp_path.glob("*.part*"))
    assert accuracy.score(merged_one, "gsm8k")["correct"] == 3
    calls.clear()                                     # resume: nothing left to do
    assert accuracy.predict(items, _fake_generate(calls), two, "gsm8k", 0, 2) == 0 and not calls
    part = accuracy.part_path(tmp_path / "three.jsonl", 0, 1)   # a writer killed mid-line
    part.write_text(json.dumps(merged_one[0]) + "\n" + json.dumps(merged_one[1])[:20])
    assert accuracy.predict(items, _fake_generate(calls), tmp_path / "three.jsonl", "gsm8k") == 6
    assert accuracy.merge_parts(tmp_path / "three.jsonl") == merged_one
    with pytest.raises(ValueError, match="item 0 was written for another prompt"):
        accuracy.predict([{**items[0], "prompt": "other"}], _fake_generate(calls), one, "gsm8k")
    with pytest.raises(ValueError, match="2 of 9 items missing"):
        accuracy.collect(one, 9)


def test_a_shorter_share_is_padded_to_the_agreed_batch_count_and_the_padding_dropped(tmp_path):
    """Sharded generation: 5 items in batches of 2 are 2 batches on process 0 and 1 on process 1,
    which runs one more (item 0) whose output is not written; ``agree`` gets each own count."""
    items, plain, padded = _fake_items(5), tmp_path / "plain.jsonl", tmp_path / "padded.jsonl"
    for rank in (0, 1):
        accuracy.predict(items, _fake_generate([]), plain, "gsm8k", rank, 2, 2)
    asked, calls = [], {0: [], 1: []}

    def agree(batches):
        asked.append(batches)
        return 2                                      # the largest count of the two processes
    for rank in (0, 1):
        assert accuracy.predict(items, _fake_generate(calls[rank]), padded, "gsm8k", rank, 2, 2, agree) == 3 - rank
    assert asked == [2, 1] and [len(c) for c in calls.values()] == [2, 2] and calls[1][-1] == ["Q0"]
    assert len(accuracy.part_path(padded, 1, 2).read_text().splitlines()) == 2
    assert accuracy.merge_parts(padded) == accuracy.merge_parts(plain)


# ----------------------------------------------------------------------------- data formats

pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import mutor2d.lm as lm_pkg  # noqa: E402
from mutor2d.config import ConfigError  # noqa: E402
from mutor2d.evaluation import records  # noqa: E402
from mutor2d.lm import data, hf, offline_tokenizers  # noqa: E402
from mutor2d.lm import prompts as lm_prompts  # noqa: E402
from mutor2d.lm import records as lm_records  # noqa: E402

CHARS = "0123456789+=#?:.$, \nQuestinAswrPblmSouxytabcdef<>/\\{}"
CHAT = ("{% for m in messages %}<{{ m.role[0] }}>{{ m.content }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}<a>{% endif %}")
SUMS = [(a, b) for a in range(4) for b in range(3)]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def tiny_tokenizer(chat=True):
    tok = offline_tokenizers.char_tokenizer(CHARS)
    if chat:
        tok.chat_template = CHAT
    return tok


def tiny_lm(tok):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
                                        eos_token_id=2))


def format_lines(fmt):
    """The same sums as prompt/answer, prompt/completion or chat lines (the gold in the answer)."""
    rows = []
    for a, b in SUMS:
        q, ans = f"Question: {a}+{b}?\nAnswer:", f" {a}+{b}={a + b}\n#### {a + b}"
        rows.append({"prompt-answer": {"prompt": q, "answer": ans},
                     "prompt-completion": {"prompt": q, "completion": ans},
                     "messages": {"messages": [{"role": "user", "content": f"{a}+{b}?"},
                                               {"role": "assistant", "content": f"#### {a + b}"}]}}[fmt])
    return rows


def test_line_formats_and_one_line_errors(tmp_path):
    for fmt in ("prompt-answer", "prompt-completion", "messages"):
        recs = lm_records.load_records("jsonl", _write_lines(tmp_path / f"{fmt}.jsonl", format_lines(fmt)))
        assert len(recs) == len(SUMS) and ("messages" in recs[0]) == (fmt == "messages")
    conv = {"prompt": [{"role": "user", "content": "1+1?"}], "completion": [{"role": "assistant", "content": "2"}]}
    [rec] = lm_records.load_records("jsonl", _write_lines(tmp_path / "conv.jsonl", [conv]))
    assert rec["train_from"] == 1 and len(rec["messages"]) == 2
    bad = {"not json": "{", "no fields": {"question": "q"}, "role": {"messages": [{"role": "bot", "content": "x"}]},
           "number": {"prompt": "p", "answer": 3}, "gold": {"prompt": "p", "answer": "a", "gold": [1]}}
    expect = {"not json": "not JSON", "no fields": 'expected {"prompt","answer"}, {"prompt","completion"} or',
              "role": "messages[0] must be",
              "number": "expected string fields ['prompt', 'answer']; missing or not a string: ['answer']",
              "gold": "'gold' must be a string or a number"}
    for name, line in bad.items():
        path = tmp_path / "bad.jsonl"
        path.write_text(json.dumps({"prompt": "p", "answer": "a"}) + "\n\n"
                        + (line if isinstance(line, str) else json.dumps(line)) + "\n")
        with pytest.raises(lm_records.DataError, match=re.escape(f"bad.jsonl:3: {expect[name]}")) as e:
            lm_records.load_records("jsonl", path)
        assert "\n" not in str(e.value)
    gsm = _write_lines(tmp_path / "gsm.jsonl", [{"question": "q", "answer": "2"}])
    with pytest.raises(lm_records.DataError, match=r"gsm.jsonl:1: the GSM8K answer has no '#### N'"):
        lm_records.load_records("gsm8k", gsm)
    chat = lm_records.load_located("jsonl", tmp_path / "messages.jsonl")
    with pytest.raises(lm_records.DataError, match=r"messages.jsonl:1: chat lines need a tokenizer with a chat template"):
        lm_prompts.tokenize([r for _, r in chat], tiny_tokenizer(chat=False), 64, 64, where=[w for w, _ in chat])


def test_chat_loss_only_on_assistant_turns():
    tok = tiny_tokenizer()
    turns = [{"role": "system", "content": "sum"}, {"role": "user", "content": "1+1?"},
             {"role": "assistant", "content": "2"}, {"role": "user", "content": "2+3?"},
             {"role": "assistant", "content": "5"}]
    examples = lm_prompts.tokenize([{"messages": turns, "train_from": 0}], tok, 256, 256)
    assert [tok.decode(a) for _, a in examples] == ["2<eos>", "5<eos>"]         # no extra EOS added
    assert tok.decode(examples[1][0]).endswith("<u>2+3?<eos><a>")                 # the whole history
    assert len(lm_prompts.tokenize([{"messages": turns, "train_from": 3}], tok, 256, 256)) == 1
    with pytest.raises(lm_records.DataError, match="no assistant turn to train on"):
        lm_prompts.tokenize([{"messages": turns[:2], "train_from": 0}], tok, 256, 256)


def test_converters_and_check_cli(tmp_path, capsys):
    gsm = _write_lines(tmp_path / "gsm.jsonl", [{"question": "1+1?", "answer": "1+1=2\n#### 2"}])
    math = _write_lines(tmp_path / "math.jsonl", [{"problem": "Half?", "solution": r"It is $\boxed{\frac12}$."}])
    data.main(["gsm8k", str(gsm), str(tmp_path / "g.jsonl")])
    data.main(["math", str(math), str(tmp_path / "m.jsonl")])
    assert json.loads((tmp_path / "g.jsonl").read_text())["gold"] == "2"
    assert json.loads((tmp_path / "m.jsonl").read_text()) == {
        "prompt": "Question: Half?\n\nAnswer:", "answer": r" It is $\boxed{\frac12}$.", "gold": r"\frac12"}
    data.main(["check", str(tmp_path / "m.jsonl")])
    assert capsys.readouterr().out.strip().endswith("m.jsonl: 1 valid lines")
    with pytest.raises(SystemExit) as e:
        data.main(["math", str(gsm), str(tmp_path / "x.jsonl")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "gsm.jsonl:1: expected string fields ['problem', 'solution']" in err



def test_openmath_split_keeps_one_problem_source_and_its_expected_answer(tmp_path, capsys):
    """The paper's 1M-MATH / 1M-GSM: OpenMathInstruct-2 lines filtered by problem_source; the gold is the
    line's expected_answer even where the solution boxes another form of it."""
    rows = [{"problem": "Half of 1?", "generated_solution": r"So $\boxed{0.5}$.", "expected_answer": r"\frac{1}{2}",
             "problem_source": "augmented_math"},
            {"problem": "2+2?", "generated_solution": r"$\boxed{4}$", "expected_answer": "4", "problem_source": "gsm8k"},
            {"problem": "x?", "generated_solution": r"$\boxed{1}$", "expected_answer": "1", "problem_source": "math"}]
    src = _write_lines(tmp_path / "omi.jsonl", rows)
    data.main(["openmath", str(src), str(tmp_path / "m.jsonl")])
    got = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [g["gold"] for g in got] == [r"\frac{1}{2}", "1"]
    assert got[0] == {"prompt": "Question: Half of 1?\n\nAnswer:", "answer": r" So $\boxed{0.5}$.", "gold": r"\frac{1}{2}"}
    data.main(["openmath", str(src), str(tmp_path / "g.jsonl"), "--split", "gsm"])
    assert [json.loads(x)["gold"] for x in (tmp_path / "g.jsonl").read_text().splitlines()] == ["4"]
    gsm = _write_lines(tmp_path / "gsm.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    with pytest.raises(SystemExit) as e:
        data.main(["openmath", str(gsm), str(tmp_path / "x.jsonl")])
    assert e.value.code == 2 and "no line has problem_source in ['math', 'augmented_math']" in capsys.readouterr().err


# ----------------------------------------------------------------------------- train, then evaluate

@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models") / "tiny"
    tok = tiny_tokenizer()
    tiny_lm(tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _cfg(hf_ref, path, finetune="lora"):
    return {"task": "lm", "model": {"hf": str(hf_ref), "finetune": finetune, "lora_targets": ["q_proj", "v_proj"]},
            "data": {"path": str(path)}, "optim": {"lr": 1e-2},
            "train": {"batch_size": 4, "max_steps": 2, "log_every": 1}}


def _last_json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("fmt", ["prompt-answer", "prompt-completion", "messages"])
def test_train_each_format_then_evaluate(tmp_path, base, fmt, capsys, monkeypatch):
    path = _write_lines(tmp_path / "sums.jsonl", format_lines(fmt))
    run = lm_pkg.train(_cfg(base, path), tmp_path / "run")
    script = _script("lm_accuracy")
    args = ["--ckpt", str(run), "--data", str(path), "--max-new-tokens", "6", "--batch-size", "5"]
    result = script.main(args)
    assert _last_json(capsys) == result and result["n"] == len(SUMS) and result["kind"] == "gsm8k"
    preds = accuracy.read_predictions(result["predictions"])
    assert [p["index"] for p in preds] == list(range(len(SUMS)))
    assert [p["gold"] for p in preds] == [(f"#### {a + b}" if fmt == "messages" else f" {a}+{b}={a + b}\n#### {a + b}")
                                          for a, b in SUMS]
    assert preds[0]["prompt"] == ("<u>0+0?<eos><a>" if fmt == "messages" else "Question: 0+0?\nAnswer:")
    assert script.main(["--score", result["predictions"], "--kind", "gsm8k"]) == _last_json(capsys)
    assert accuracy.score(preds, "gsm8k")["accuracy"] == result["accuracy"]
    if fmt == "messages":                             # deterministic: a second run gives the same outputs
        again = script.main(args + ["--out", str(tmp_path / "b.jsonl")])
        assert [p["output"] for p in accuracy.read_predictions(again["predictions"])] == [p["output"] for p in preds]
    # a rerun generates nothing (resumed); fake outputs on a new file: --score agrees with generation
    monkeypatch.setattr(hf, "generate", lambda lm, tok, ids, n, stop, **kw: pytest.fail("regenerated"))
    assert script.main(args) == {**result, "record": result["record"]}
    monkeypatch.setattr(hf, "generate", lambda lm, tok, ids, n, stop, **kw: [f"#### {len(p) % 3}" for p in ids])
    faked = script.main(args + ["--out", str(tmp_path / "fake.jsonl")])
    assert 0 < faked["accuracy"] < 1
    assert script.main(["--score", faked["predictions"], "--kind", "gsm8k"])["accuracy"] == faked["accuracy"]
    table = _script("leaderboard").main([str(run)])
    head, rows = table.splitlines()[0], table.splitlines()[2:]
    assert "| accuracy |" in head and len(rows) == (3 if fmt == "messages" else 2)   # one per prediction file
    from mutor2d import provenance
    commit = provenance.code_text(provenance.read_sessions(run)[-1]["code"])        # the run's code
    assert any(f"| {result['accuracy']:.3f} | {commit} | gsm8k exact match | sums.jsonl | 12 |" in r for r in rows)


def test_model_objects_base_reference_and_merge(tmp_path, base, monkeypatch):
    from peft import PeftModel
    import shutil
    monkeypatch.chdir(tmp_path)
    shutil.copytree(base, tmp_path / "models" / "tiny")
    _write_lines(tmp_path / "d.jsonl", format_lines("prompt-answer"))
    run = lm_pkg.train(_cfg("models/tiny", "d.jsonl"), "run_rel", ["train.ckpt_every=1"])   # relative stays relative
    assert json.loads((run / "adapter_config.json").read_text())["base_model_name_or_path"] == "models/tiny"
    step = _script("lm_accuracy").main(["--ckpt", "run_rel/step_1", "--data", "d.jsonl", "--max-new-tokens", "2"])
    assert step["predictions"] == "run_rel/eval/predictions_d_step1.jsonl"
    from mutor2d.lm.data import model_positions          # without --max-new-tokens: the default fits the model
    positions = model_positions("run_rel")
    assert positions < 512 and _script("lm_accuracy").parse_args(["--ckpt", "run_rel", "--data", "d.jsonl"]
                                                                 ).max_new_tokens == positions
    assert json.loads(Path(step["record"]).read_text())["step"] == 1
    merged, wrapped = hf.load_for_inference(run), hf.load_for_inference(run, merge=False)
    assert isinstance(merged, LlamaForCausalLM) and isinstance(wrapped, PeftModel)
    assert not any("lora" in name for name, _ in merged.named_modules())
    x = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        torch.testing.assert_close(merged(x).logits, wrapped(x).logits)
        assert not torch.allclose(merged(x).logits, hf.load_causal_lm("models/tiny")(x).logits)
    tok = tiny_tokenizer()
    with pytest.raises(ConfigError, match="model.hf: expected a local folder or cached hub name"):
        lm_pkg.train(_cfg("", "d.jsonl"), "run_obj", model=tiny_lm(tok), tokenizer=tok)
    run = lm_pkg.train(_cfg("org/tiny-llama", "d.jsonl"), "run_obj", model=tiny_lm(tok), tokenizer=tok)
    assert json.loads((run / "adapter_config.json").read_text())["base_model_name_or_path"] == "org/tiny-llama"
    assert "hf: org/tiny-llama" in (run / "config.yaml").read_text()
    run = lm_pkg.train(_cfg("", "d.jsonl", "full"), "run_full", model=tiny_lm(tok), tokenizer=tok)
    assert isinstance(hf.load_for_inference(run), LlamaForCausalLM)
    with pytest.raises(hf.LMModelError, match="'org/not-cached': no transformers model at .* none in the local"):
        hf.load_causal_lm("org/not-cached")


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_a_flipped_byte_in_a_run_folders_weights_is_refused_by_every_reader(tmp_path, base, finetune, capsys):
    """A run folder and its step_N/ record their weight files' SHA-256 (mutor2d_checksums.json);
    load_for_inference and eval/lm_accuracy.py refuse a changed byte in one line naming the file; a
    folder without the record (transformers' own save) loads, said once; a malformed safetensors header
    there is one line too."""
    import shutil
    path = _write_lines(tmp_path / "sums.jsonl", format_lines("prompt-answer"))
    run = lm_pkg.train(_cfg(base, path, finetune), tmp_path / "run", ["train.ckpt_every=1"])
    for folder in (run, run / "step_1"):
        record = json.loads((folder / hf.CHECKSUMS_FILE).read_text())["sha256"]
        weights = "model.safetensors" if finetune == "full" else "adapter_model.safetensors"
        assert weights in record and all(len(v) == 64 for v in record.values())
    hf.load_for_inference(run)                                               # intact: loads
    weights = run / ("model.safetensors" if finetune == "full" else "adapter_model.safetensors")
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01                                                         # one bit of one weight
    weights.write_bytes(bytes(data))
    with pytest.raises(hf.LMModelError, match=rf"^{re.escape(str(weights))} is corrupt: its SHA-256 does not match"):
        hf.load_for_inference(run)
    import subprocess
    import sys
    done = subprocess.run([sys.executable, str(ROOT / "eval" / "lm_accuracy.py"), "--ckpt", str(run), "--data", str(path),
                           "--max-new-tokens", "2"], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    err = [line for line in done.stderr.strip().splitlines() if not line.startswith("warning:")]
    assert done.returncode == 2 and len(err) == 1 and "is corrupt" in err[0] and weights.name in err[0], done.stderr
    plain = tmp_path / "plain"                                               # no record: loads, said once
    shutil.copytree(run / "step_1", plain)
    (plain / hf.CHECKSUMS_FILE).unlink()
    hf.load_for_inference(plain)
    assert re.search(r"^warning: .*plain' has no mutor2d_checksums.json .* load unverified$", capsys.readouterr().err, re.M)
    if finetune == "full":
        (plain / "model.safetensors").write_bytes(b"\xff" * 8 + b"not a header")
        with pytest.raises(hf.LMModelError, match="cannot load the transformers model"):
            hf.load_for_inference(plain)


def test_generate_left_padded_batch_equals_one_by_one(base):
    lm, tok = hf.load_for_inference(base), hf.load_tokenizer(base)
    prompts = [tok(t)["input_ids"] for t in ("Question: 1+2?\nAnswer:", "3+4=", "Problem: x")]
    batched = hf.generate(lm, tok, prompts, 10)
    assert batched == [hf.generate(lm, tok, [p], 10)[0] for p in prompts] and all(batched)
    stop = batched[0][3:5]                                 # a stop string the first output holds
    cut = hf.generate(lm, tok, prompts, 10, [stop])
    assert cut[0] == batched[0][:batched[0].index(stop)]
    assert all(c == b[:len(c)] and stop not in c for c, b in zip(cut, batched))


def test_generate_with_stop_strings_a_narrow_character_tokenizer_cannot_map():
    """transformers cannot build its stop-string criteria for a character vocabulary without the
    letters it probes with: generation still runs, and the text is cut at the stop string."""
    tok = offline_tokenizers.char_tokenizer("0123456789+=\n")
    lm = tiny_lm(tok).eval()
    prompts = [tok("1+2=")["input_ids"], tok("3=")["input_ids"]]
    plain = hf.generate(lm, tok, prompts, 8)
    stopped = hf.generate(lm, tok, prompts, 8, ["\nQuestion:", "3"])
    assert [p.split("3")[0] for p in plain] == stopped
