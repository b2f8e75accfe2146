"""The CPU language study (experiments/lm_study.py) and its synthetic task (mutor2d.lm.arith)."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from mutor2d.lm.accuracy import gsm8k_answer
from mutor2d.lm.arith import arith_alphabet, arith_records
from mutor2d.lm.records import gsm8k_record

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
    from mutor2d.lm.data import main
    from mutor2d.lm.records import load_records
    main(["arith", str(tmp_path / "a.jsonl"), "--count", "5", "--steps", "2", "--seed", "3"])
    assert [r["gold"] for r in load_records("gsm8k", tmp_path / "a.jsonl")] == \
        [gsm8k_answer(r["answer"]) for r in arith_records(5, [2], seed=3)]


def load_study():
    pytest.importorskip("transformers", reason="the study trains Hugging Face models: pip install -e '.[lm]'")
    spec = importlib.util.spec_from_file_location("lm_study", ROOT / "experiments" / "lm_study.py")
    study = importlib.util.module_from_spec(spec)
    sys.modules["lm_study"] = study                     # its dataclasses look their module up
    spec.loader.exec_module(study)
    return study


def check_table(table: str, methods: dict) -> list[float]:
    """The final-accuracy rows name every method in order, the curve has steps 2 and 4 -> accuracies."""
    rows = table.split("\n\n")[0].splitlines()[2:]
    assert [row.split("|")[1].strip() for row in rows] == list(methods)
    accs = [float(row.split("|")[3].split("±")[0]) for row in rows]
    assert all(0.0 <= acc <= 1.0 for acc in accs)
    curve = table.split("\n\n")[-1].splitlines()
    assert curve[0] == "| method | step 2 | step 4 |" and len(curve) == 2 + len(methods)
    return accs


def test_quick_study_table_has_every_method_and_a_rerun_skips_finished_runs(tmp_path):
    study = load_study()
    methods = study.TASKS["arith"].methods
    table = study.main(["--quick", "--out", str(tmp_path)])
    check_table(table, methods)
    assert (tmp_path / "lm_study.png").stat().st_size > 0
    test = [json.loads(line)["question"] for line in (tmp_path / "data" / "test.jsonl").read_text().splitlines()]
    train = {json.loads(line)["question"] for line in (tmp_path / "data" / "train.jsonl").read_text().splitlines()}
    assert test and not set(test) & train                                   # held out
    logs = {p: p.stat().st_mtime for p in tmp_path.glob("runs/*/log.jsonl")}
    assert len(logs) == len(methods)
    assert study.main(["--quick", "--out", str(tmp_path)]) == table
    assert {p: p.stat().st_mtime for p in tmp_path.glob("runs/*/log.jsonl")} == logs      # nothing retrained


def test_stargraph_words_round_trip_and_graph_keys_ignore_edge_order():
    study = load_study()
    size = study.TASKS["stargraph"].size
    tok = study.stargraph_tokenizer(size)
    line = study.stargraph_records(size, 1, 0)[0]
    ids = tok(line["prompt"])["input_ids"]
    assert tok.unk_token_id not in ids and len(ids) == 1 + 3 * 8 + 4          # BOS, "u v |" x 8, "/ s g ="
    answer = tok(line["answer"], add_special_tokens=False)["input_ids"]
    assert len(answer) == 5 and tok.decode(answer + [tok.eos_token_id], skip_special_tokens=True) == line["answer"][1:]
    edges, query = line["prompt"].split("/")
    pairs = [e.strip() for e in edges.split("|") if e.strip()]
    shuffled = {"prompt": " ".join(e + " |" for e in reversed(pairs)) + " /" + query}
    assert shuffled["prompt"] != line["prompt"] and sorted(shuffled["prompt"]) == sorted(line["prompt"])
    assert study.graph_key(shuffled) == study.graph_key(line)
    assert study.graph_key({"prompt": edges + "/ 1 2 ="}) != study.graph_key(line)


def test_quick_stargraph_study_scores_whole_paths_on_held_out_graphs(tmp_path):
    study = load_study()
    task = study.TASKS["stargraph"]
    table = study.main(["--task", "stargraph", "--quick", "--out", str(tmp_path)])
    accs = check_table(table, task.methods)
    assert (tmp_path / "lm_stargraph.png").stat().st_size > 0
    lines = {s: [json.loads(x) for x in (tmp_path / "data" / f"{s}.jsonl").read_text().splitlines()]
             for s in ("train", "test")}
    assert len(lines["test"]) == task.quick.test
    assert not {study.graph_key(r) for r in lines["test"]} & {study.graph_key(r) for r in lines["train"]}
    for acc, objective in zip(accs, task.methods.values()):
        run = next(tmp_path.glob(f"runs/{objective['name']}_d*_s0"))
        record = study.records_of(run)[task.quick.max_steps]
        assert record["evaluator"] == "path exact match" and record["n"] == task.quick.test
        assert record["run_config"]["objective"]["name"] == objective["name"]
        preds = [json.loads(x) for x in (run / "eval" / "predictions_test_step4.jsonl").read_text().splitlines()]
        assert [p["gold"] for p in preds] == [r["answer"] for r in lines["test"]]
        assert acc == pytest.approx(sum(p["correct"] for p in preds) / len(preds), abs=5e-4)
    log = next(tmp_path.glob("runs/mutor-1d_*_s0/log.jsonl")).read_text().splitlines()
    assert any("loss_reg" in json.loads(x) for x in log)                  # the registers trained


def test_the_pretrained_study_shares_one_base_and_pairs_every_arm_with_next_token(tmp_path, capsys):
    """arith_pretrained --quick: one base pretrained once with next-token prediction on a corpus that
    holds no fine-tuning or test question, cached by its recipe's key in --bases and reused by a rerun
    (said in one line); every arm (4 methods x causal/bidirectional prompts) fine-tunes that base (its
    provenance's init names it, as does OUT/summary.json); the table gives 95% intervals and the paired
    difference to the next-token arm of the same prompt attention; arms of one seed that fine-tuned
    different weights are refused unless --allow-mixed-bases."""
    import yaml
    from mutor2d import provenance
    study = load_study()
    task = study.TASKS["arith_pretrained"]
    args = ["--task", "arith_pretrained", "--quick", "--out", str(tmp_path), "--bases", str(tmp_path / "bases")]
    text = study.main(args)
    configs = {p.stem: yaml.safe_load(p.read_text()) for p in (tmp_path / "configs").glob("*.yaml")}
    bases = {c["model"]["hf"] for name, c in configs.items() if name != "pretrain"}
    [base] = list((tmp_path / "bases").iterdir())
    assert bases == {str(base)} and (base / "config.json").is_file() and len(base.name) == 12
    summary = json.loads((tmp_path / "summary.json").read_text())
    base_sha = summary["base"]["sha256"]
    assert summary["base"]["key12"] == base.name and summary["init_sha256_by_seed"] == {"0": base_sha}
    assert [r["arm"] for r in summary["rows"]] == list(study.arms(task))
    assert {p["init"]["sha256"] for p in summary["provenance"]["runs"].values()} == {base_sha}
    capsys.readouterr()
    assert study.main(args) == text
    assert f"reusing the shared base {base.name} ({base})" in capsys.readouterr().out.splitlines()
    run = next((tmp_path / "runs").iterdir())
    record = study.records_of(run)[task.quick.max_steps]                     # the online evaluation's record
    assert record["provenance"]["run"]["init"]["sha256"] == base_sha and record["provenance"]["eval"]["code"]
    sessions = provenance.read_sessions(run)
    sessions[0]["init"]["sha256"] = "f" * 64                                # as if it fine-tuned another base
    (run / provenance.RUN_FILE).write_text(json.dumps({"sessions": sessions}))
    with pytest.raises(study.StudyError, match="different initial weights .*--allow-mixed-bases"):
        study.main(args)
    assert study.main(args + ["--allow-mixed-bases"]) == text
    assert configs["pretrain"]["objective"] == {"name": "ntp"}
    assert sorted(c["model"]["prompt_attention"] for n, c in configs.items() if n != "pretrain") == \
        ["bidirectional"] * 4 + ["causal"] * 4
    held = {json.loads(line)["question"] for f in ("train", "test")
            for line in (tmp_path / "data" / f"{f}.jsonl").read_text().splitlines()}
    corpus = [json.loads(line)["question"] for line in (tmp_path / "data" / "pretrain.jsonl").read_text().splitlines()]
    assert corpus and not held & set(corpus)
    rows = text.split("Intervals and paired differences:\n\n")[1].split("\n\n")[0].splitlines()[2:]
    assert [r.split("|")[1].strip() for r in rows] == list(study.arms(task))
    assert all((r.split("|")[4].strip() == "—") == r.startswith("| next-token") for r in rows)


def test_intervals_by_hand():
    from mutor2d.evaluation.study_tables import t95
    study = load_study()
    mean, half = t95([0.5, 0.7, 0.6])
    assert abs(mean - 0.6) < 1e-12 and abs(half - 4.302653 * 0.1 / 3 ** 0.5) < 1e-5
    assert study.reference_arm("mutor-1d d_max=4, bidirectional") == "next-token, bidirectional"
    assert study.reference_arm("multihead d_max=4") == "next-token"


def test_the_pretrained_stargraph_study_pretrains_on_other_graphs_and_pairs_arms_by_seed(tmp_path):
    """stargraph_pretrained --quick, two seeds: one base pretrained once on walks and leaf-side paths
    over fresh graphs (none with the edges of a fine-tuning or test graph, none asking the task's
    "/ source goal =" query); every arm fine-tunes it with its seed's data order."""
    import yaml
    study = load_study()
    task = study.TASKS["stargraph_pretrained"]
    study.run_all(tmp_path, task, task.quick, [0, 1], tmp_path / "bases")
    configs = {p.stem: yaml.safe_load(p.read_text()) for p in (tmp_path / "configs").glob("*.yaml")}
    finetunes = {n: c for n, c in configs.items() if n != "pretrain"}
    assert len(finetunes) == 2 * len(study.arms(task)) and configs["pretrain"]["objective"] == {"name": "ntp"}
    assert "blowup_factor" not in configs["pretrain"]["train"]        # two kinds of line: the guard's default rule
    assert {c["model"]["hf"] for c in finetunes.values()} == {str(p) for p in (tmp_path / "bases").iterdir()}
    assert len(list((tmp_path / "bases").iterdir())) == 1
    assert {n: c["train"]["seed"] for n, c in finetunes.items()} == {n: int(n[-1]) for n in finetunes}
    lines = {s: study.load_jsonl(tmp_path / "data" / f"{s}.jsonl") for s in ("train", "test", "pretrain")}
    held = {study.graph_edges(r) for s in ("train", "test") for r in lines[s]}
    corpus = lines["pretrain"]
    assert len(corpus) == task.quick.pretrain_count and not held & {study.graph_edges(r) for r in corpus}
    for r in corpus:                                   # walks follow the edges; no line asks "/ s g ="
        path, query = r["answer"].split(), r["prompt"].split("/", 1)[1].split()
        edges = study.graph_edges(r)
        assert all(f"{u} {v}" in edges for u, v in zip(path, path[1:])) or \
            all(f"{v} {u}" in edges for u, v in zip(path, path[1:]))
        assert query in ([path[0], "="], [path[0], "/", path[-1], "="])


def test_the_settings_study_gives_each_setting_its_runs_and_pairs_them_with_the_papers_rule(tmp_path):
    """arith_settings: one run folder per arm (the setting in its name), each arm paired by seed with
    the paper's rule (not next-token), forwards per token of the final evaluation as a column, and
    every arm a config the objectives accept."""
    from mutor2d import config
    study = load_study()
    task = study.TASKS["arith_settings"]
    arms = study.arms(task)
    names = {study.run_name(objective, mode, 0, task) for objective, mode in arms.values()}
    assert len(names) == len(arms) and task.decode == "auto"
    for objective, _ in arms.values():
        config.load("lm_tiny_arith.yaml", [f"objective.{k}={v}" for k, v in objective.items()])
    accuracy = {arm: [0.5 + 0.1 * i, 0.6 + 0.1 * i] for i, arm in enumerate(arms)}
    runs = {}
    for arm, (objective, mode) in arms.items():
        for seed, acc in enumerate(accuracy[arm]):
            run = tmp_path / study.run_name(objective, mode, seed, task)
            (run / "eval").mkdir(parents=True)
            fpt = 1.0 if objective["name"] == "ntp" or "register_visibility" in objective else 0.5
            (run / "eval" / "r.json").write_text(json.dumps({"step": 300, "metrics": {"accuracy": acc},
                                                            "sampling": {"decode_stats": {"forwards_per_token": fpt}}}))
            runs.setdefault(arm, {})[seed] = run
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in
            study.interval_table(runs, 300, tmp_path, task.reference).splitlines()[2:]}
    assert "minus mutor-1d (paper rule)" in study.interval_table(runs, 300, tmp_path, task.reference)
    assert rows[task.reference][3] == "—"
    reference = list(arms).index(task.reference)
    for i, arm in enumerate(arms):
        if arm != task.reference:
            assert rows[arm][3].startswith(f"{0.1 * (i - reference):+.3f} ")
    assert rows["earlier registers"][6] == "1.000" and rows["self-distilled targets"][6] == "0.500"
    assert rows["earlier registers"][7] == "0, 0 |"                        # no run skipped an update


def test_a_study_refuses_to_pair_arms_the_guard_filtered_unevenly(tmp_path):
    """Seed 1 of MuToR-1D skipped 4 of 300 updates, next-token none: 4 > 0.01 x 300, so the paired
    difference is refused in one line unless asked for; the table shows the skips per seed."""
    study = load_study()
    runs = {}
    for arm, skips in (("next-token", (0, 0)), ("mutor-1d d_max=4", (1, 4))):
        for seed, n in enumerate(skips):
            run = tmp_path / f"{arm}_{seed}"
            (run / "eval").mkdir(parents=True)
            (run / "eval" / "r.json").write_text(json.dumps({"step": 300, "metrics": {"accuracy": 0.5}}))
            lines = [{"event": "skip", "step": 10 + k, "reason": "blowup"} for k in range(n)]
            (run / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
            runs.setdefault(arm, {})[seed] = run
    with pytest.raises(study.StudyError, match=r"^mutor-1d d_max=4 and next-token \(seed 1\) skipped 4 and 0 "
                                         r"of 300 updates.*--allow-skip-mismatch") as e:
        study.check_skips(runs, 300, "next-token", 0.01)
    assert "\n" not in str(e.value)
    study.check_skips(runs, 300, "next-token", 0.02)                       # 4 <= 6: within the tolerance
    row = [line for line in study.interval_table(runs, 300, tmp_path).splitlines() if line.startswith("| mutor")]
    assert row[0].endswith("| 1, 4 |")


def test_studies_with_one_base_recipe_share_its_key_and_another_recipe_or_code_does_not(tmp_path, monkeypatch):
    """arith_pretrained_4step, arith_settings and arith_budget pretrain the same base: one key, whatever their --out;
    arith_pretrained's recipe (another corpus) and other code get other keys."""
    from mutor2d import provenance
    study = load_study()

    def key(name, out):
        task = study.TASKS[name]
        train, test = study.write_data(out / "data", task, task.quick)
        seen = {task.key(r) for r in study.load_jsonl(train) + study.load_jsonl(test)}
        return study.base_recipe(out, task, task.quick, seen)[1]

    four = key("arith_pretrained_4step", tmp_path / "a")
    assert key("arith_settings", tmp_path / "b") == four
    assert key("arith_budget", tmp_path / "e") == four        # its larger test set holds no 1-3-step line
    assert key("arith_pretrained", tmp_path / "c") != four
    monkeypatch.setattr(provenance, "code_identity", lambda root=None: {"commit": "0" * 40, "dirty": False,
                                                                        "diff_sha256": None})
    assert key("arith_settings", tmp_path / "d") != four


def fake_run(folder: Path, correct_by_step: dict[int, list[bool]]) -> Path:
    """A run folder holding only what the bootstrap reads: a record and a predictions file per step."""
    (folder / "eval").mkdir(parents=True)
    for step, correct in correct_by_step.items():
        (folder / "eval" / f"step{step}.json").write_text(json.dumps({"step": step, "metrics": {}}))
        lines = [json.dumps({"index": i, "correct": c}) for i, c in reversed(list(enumerate(correct)))]
        (folder / "eval" / f"predictions_test_step{step}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_the_budget_bootstrap_pairs_arms_by_seed_and_item(tmp_path):
    """Equal arms differ by exactly 0 in every draw; an arm right where the reference is wrong by
    exactly +1; the interval of a mixed arm holds its mean and is wider than a seed-only one would be."""
    study = load_study()
    rng = __import__("random").Random(0)
    ref = {s: [rng.random() < 0.5 for _ in range(40)] for s in range(4)}
    runs = {"next-token": {s: fake_run(tmp_path / f"ref{s}", {10: ref[s], 20: ref[s]}) for s in ref},
            "same": {s: fake_run(tmp_path / f"same{s}", {10: ref[s], 20: ref[s]}) for s in ref},
            "flipped": {s: fake_run(tmp_path / f"flip{s}", {10: [not c for c in ref[s]], 20: ref[s]}) for s in ref}}
    boot = study.bootstrap(runs, "next-token")
    assert sorted(boot) == [10, 20]
    assert boot[10]["same"]["diff"] == (0.0, 0.0, 0.0) and boot[10]["next-token"]["diff"] is None
    mean, lo, hi = boot[10]["next-token"]["acc"]
    assert mean == sum(map(sum, ref.values())) / 160 and lo < mean < hi and hi - lo > 0.1  # 160 items: ~±0.08
    d, dlo, dhi = boot[10]["flipped"]["diff"]
    assert dlo <= d <= dhi and abs(d - (1 - 2 * mean)) < 1e-9
    assert boot[20]["flipped"]["diff"] == (0.0, 0.0, 0.0)
    table = study.bootstrap_table(boot, "next-token")
    assert table.splitlines()[2].startswith("| 10 | next-token | ") and len(table.splitlines()) == 2 + 6


@pytest.mark.parametrize("flags, needle", [
    (["--max-steps", "0"], "--max-steps 0: expected 1..10000000"),                # was: taken as not given
    (["--max-steps", str(10 ** 12)], "--max-steps 1000000000000: expected 1..10000000"),   # was: trained for ever
    (["--out", ""], "--out '': expected a study folder"),                         # was: runs/lm_study in the cwd
    (["--out", "FILE"], "expected a study folder"),                               # was: NotADirectoryError
    (["--bases", "FILE"], "expected a folder of bases"),
    (["--plot", ""], "--plot '': expected a .png path"),
])
def test_study_flags_that_would_be_ignored_or_run_for_ever_are_one_line(tmp_path, monkeypatch, capsys, flags, needle):
    study = load_study()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("x")
    with pytest.raises(SystemExit) as e:
        study.main(["--task", "arith", "--out", "study", *flags])
    assert e.value.code == 2 and needle in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]                # nothing written
