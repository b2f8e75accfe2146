"""The CPU language study (eval/lm_study.py) and its synthetic task (mutor2d.lm.arith)."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from mutor2d.lm.accuracy import gsm8k_answer
from mutor2d.lm.arith import arith_alphabet, arith_records
from mutor2d.lm.data import gsm8k_record

ROOT = Path(__file__).resolve().parent.parent


def test_arith_problems_are_worked_out_in_gsm8k_format():
    recs = arith_records(200, [1, 2, 3], seed=0)
    assert recs == arith_records(200, [1, 2, 3], seed=0) and recs != arith_records(200, [1, 2, 3], seed=1)
    alphabet = set(arith_alphabet())
    for i, rec in enumerate(recs):
        lines = rec["answer"].split("\n")
        assert len(lines) == [1, 2, 3][i % 3] + 1
        value = int(lines[0].split("+")[0].split("-")[0])
        for line in lines[:-1]:                       # each step's arithmetic holds and chains on
            lhs, rhs = line.split("=")
            a, op, b = (lhs.partition("+") if "+" in lhs else lhs.partition("-"))
            assert int(a) == value and 0 <= int(rhs) <= 20
            value = int(a) + int(b) if op == "+" else int(a) - int(b)
            assert value == int(rhs)
        assert gsm8k_answer(rec["answer"]) == str(value) == gsm8k_record(rec)["gold"]
        text = gsm8k_record(rec)
        assert set(text["prompt"] + text["answer"]) <= alphabet
    with pytest.raises(ValueError, match="steps=\\[0\\]"):
        arith_records(3, [0], seed=0)


def test_arith_converter_writes_lines_the_gsm8k_reader_takes(tmp_path):
    from mutor2d.lm.data import load_records, main
    main(["arith", str(tmp_path / "a.jsonl"), "--count", "5", "--steps", "2", "--seed", "3"])
    assert [r["gold"] for r in load_records("gsm8k", tmp_path / "a.jsonl")] == \
        [gsm8k_answer(r["answer"]) for r in arith_records(5, [2], seed=3)]


def test_quick_study_table_has_every_method_and_a_rerun_skips_finished_runs(tmp_path):
    spec = importlib.util.spec_from_file_location("lm_study", ROOT / "eval" / "lm_study.py")
    study = importlib.util.module_from_spec(spec)
    sys.modules["lm_study"] = study                     # its dataclasses look their module up
    spec.loader.exec_module(study)
    table = study.main(["--quick", "--out", str(tmp_path)])
    rows = table.split("\n\n")[0].splitlines()[2:]
    assert [row.split("|")[1].strip() for row in rows] == list(study.METHODS)
    for row in rows:
        acc = float(row.split("|")[3].split("±")[0])
        assert 0.0 <= acc <= 1.0
    curve = table.split("\n\n")[-1].splitlines()
    assert curve[0] == "| method | step 2 | step 4 |" and len(curve) == 2 + len(study.METHODS)
    assert (tmp_path / "lm_study.png").stat().st_size > 0
    test = [json.loads(line)["question"] for line in (tmp_path / "data" / "test.jsonl").read_text().splitlines()]
    train = {json.loads(line)["question"] for line in (tmp_path / "data" / "train.jsonl").read_text().splitlines()}
    assert test and not set(test) & train                                   # held out
    logs = {p: p.stat().st_mtime for p in tmp_path.glob("runs/*/log.jsonl")}
    assert len(logs) == len(study.METHODS)
    assert study.main(["--quick", "--out", str(tmp_path)]) == table
    assert {p: p.stat().st_mtime for p in tmp_path.glob("runs/*/log.jsonl")} == logs      # nothing retrained
