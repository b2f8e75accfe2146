"""Provenance (mutor2d.provenance): what a record holds, the code identity of a checkout, fingerprints
and their cache, and where runs, checkpoints and evaluation records keep it."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mutor2d import checkpoint, config, io, provenance
from mutor2d.checkpoint import export, inference
from mutor2d.engine.loop import train

sys.path.insert(0, str(Path(__file__).parent))
from conftest import TINY_DIGITS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args],
                   check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    """A throwaway checkout with one committed file."""
    if subprocess.run(["git", "--version"], capture_output=True).returncode != 0:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "a.py")
    git(repo, "commit", "-qm", "one")
    return repo


def test_the_record_has_every_field():
    p = provenance.provenance(data=provenance.named("d", "1" * 64), init=provenance.random_init(3))
    assert set(p) == {"code", "versions", "device", "threads", "data", "init"}
    assert set(p["versions"]) == {"python", "torch", "transformers", "peft", "accelerate", "torch_fidelity", "numpy"}
    assert p["versions"]["torch"] and p["device"] and p["threads"] >= 1
    assert p["init"] == {"name": "random init, seed 3", "sha256": provenance.text_sha256("random init, seed 3")}
    assert json.loads(json.dumps(p)) == p
    code = p["code"]                                  # this checkout (or an installed package)
    assert set(code) in ({"commit", "dirty", "diff_sha256"}, {"package_version"})


def test_a_changed_tracked_file_makes_the_checkout_dirty_and_changes_the_diff_hash(repo):
    clean = provenance.code_identity(repo)
    assert len(clean["commit"]) == 40 and clean["dirty"] is False and clean["diff_sha256"] is None
    (repo / "a.py").write_text("x = 2\n")
    first = provenance.code_identity(repo)
    assert first["dirty"] is True and first["commit"] == clean["commit"] and len(first["diff_sha256"]) == 64
    assert provenance.code_identity(repo) == first                              # stable
    (repo / "a.py").write_text("x = 3\n")
    second = provenance.code_identity(repo)
    assert second["diff_sha256"] != first["diff_sha256"]
    (repo / "new.py").write_text("y = 1\n")                                     # untracked files count too
    assert provenance.code_identity(repo)["diff_sha256"] != second["diff_sha256"]
    assert provenance.code_text(second) == clean["commit"][:12] + "+dirty"
    assert provenance.code_text(clean) == clean["commit"][:12]


def test_without_git_or_outside_a_checkout_the_package_version_stands_for_the_code(repo, tmp_path, monkeypatch):
    outside = tmp_path / "plain"
    outside.mkdir()
    assert provenance.code_identity(outside) == {"package_version": provenance.package_version()}
    assert provenance.code_identity(repo)["commit"]

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")
    monkeypatch.setattr(subprocess, "run", no_git)
    assert provenance.code_identity(repo) == {"package_version": provenance.package_version()}
    assert set(provenance.provenance(device="cpu", threads=1, root=repo)["code"]) == {"package_version"}


def test_a_folder_fingerprint_is_stable_and_changes_with_one_byte(tmp_path):
    folder = tmp_path / "store"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"\x00" * 100)
    (folder / "sub" / "b.json").write_text('{"k": 1}')
    first = provenance.fingerprint(folder)
    assert first == provenance.fingerprint(folder) and first["path"] == str(folder.resolve())
    (folder / "sub" / "b.json").write_text('{"k": 2}')                           # one byte
    assert provenance.fingerprint(folder)["sha256"] != first["sha256"]
    (folder / "sub" / "b.json").write_text('{"k": 1}')
    assert provenance.fingerprint(folder) == first                              # content, not times
    (folder / "sub" / "b.json").rename(folder / "sub" / "c.json")                # names count
    assert provenance.fingerprint(folder)["sha256"] != first["sha256"]
    assert provenance.fingerprint(tmp_path / "nothing")["sha256"] is None and provenance.fingerprint(None) is None
    assert provenance.fingerprint(folder / "a.bin")["sha256"] == io.file_sha256(folder / "a.bin")


def test_a_large_file_is_hashed_once_per_path_size_and_mtime(tmp_path, monkeypatch):
    monkeypatch.setenv("MUTOR2D_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(provenance, "CACHE_MIN_BYTES", 10)
    big = tmp_path / "codes.npy"
    big.write_bytes(b"x" * 100)
    want = io.file_sha256(big)
    assert provenance.file_sha256(big) == want and (tmp_path / "cache" / "hashes.json").is_file()
    reads = []
    monkeypatch.setattr(io, "file_sha256", lambda path: reads.append(path) or "0" * 64)
    assert provenance.file_sha256(big) == want and reads == []                  # from the cache
    big.write_bytes(b"y" * 100)                                                 # same size, another mtime
    assert provenance.file_sha256(big) == "0" * 64 and len(reads) == 1
    small = tmp_path / "small.txt"
    small.write_text("tiny")
    provenance.file_sha256(small)
    assert len(reads) == 2                                                      # small files: never cached


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """A 2-step digits run with checkpoints at steps 1 and 2."""
    out = tmp_path_factory.mktemp("prov") / "run"
    train(config.load("digits_mutor2d.yaml", TINY_DIGITS + ["train.ckpt_every=1"]), out)
    return out


def test_a_run_writes_its_provenance_and_its_checkpoints_carry_it(digits_run, tmp_path):
    [session] = provenance.read_sessions(digits_run)
    assert session["start_step"] == 0 and session["started"]
    assert session["data"]["name"] == "digits" and session["data"]["path"].endswith("digits.csv.gz")
    assert session["data"]["sha256"] == io.file_sha256(session["data"]["path"])
    assert session["init"] == provenance.random_init(0) and session["device"] == "cpu"
    carried = {k: v for k, v in session.items() if k not in ("started", "start_step")}
    assert inference.read_meta(digits_run)["provenance"] == carried
    assert checkpoint.load(checkpoint.latest_valid(digits_run))["provenance"] == carried
    out = export.export_safetensors(digits_run, tmp_path / "w.safetensors")
    assert inference.read_meta(out)["provenance"] == carried                 # the export keeps it


def test_a_resumed_run_appends_its_session_and_warns_when_versions_differ(digits_run, tmp_path, monkeypatch, capsys):
    import shutil
    run = tmp_path / "run"
    shutil.copytree(digits_run, run)
    real = provenance.versions
    monkeypatch.setattr(provenance, "versions", lambda: {**real(), "torch": "0.0.1"})
    train(config.load("digits_mutor2d.yaml", TINY_DIGITS + ["train.ckpt_every=1", "train.max_steps=3"]), run,
          resume="auto")
    first, second = provenance.read_sessions(run)
    assert second["start_step"] == 2 and second["versions"]["torch"] == "0.0.1" and first["versions"] == real()
    warned = [line.split("\r")[-1].split("it/s]")[-1] for line in capsys.readouterr().err.splitlines()
              if "first session" in line]                                    # after the progress bar's start
    assert warned == [f"warning: this session's versions differ from the run's first session "
                      f"({run / provenance.RUN_FILE})"]
    assert inference.read_meta(run)["provenance"]["versions"]["torch"] == "0.0.1"


def test_an_init_from_run_names_the_checkpoint_it_starts_from(digits_run, tmp_path):
    from mutor2d.image.run import init_fingerprint
    found = init_fingerprint(str(digits_run), 0)
    assert found == provenance.fingerprint(checkpoint.latest_valid(digits_run))


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_script", ROOT / "eval" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_records_carry_the_runs_provenance_and_the_leaderboard_shows_its_commit_and_warns(digits_run, tmp_path,
                                                                                          capsys):
    from mutor2d.evaluation import records
    [session] = provenance.read_sessions(digits_run)
    for name, code in (("a", {"commit": "a" * 40, "dirty": False, "diff_sha256": None}),
                       ("b", {"commit": "b" * 40, "dirty": True, "diff_sha256": "c" * 64})):
        run = tmp_path / name
        run.mkdir()
        provenance.append_session(run, {**session, "code": code}, 0)
        rec = {"method": "ntp", "objective": {"name": "ntp"}, "step": 2, "metrics": {"fid": 9.0},
               "evaluator": {"feature_extractor": "digits"}, "reference": "digits:train", "n": 10,
               "sampling": {}, "samples": f"{name}.npz"}
        path = records.write_record(rec, run / "eval")
    written = json.loads(path.read_text())["provenance"]
    assert written["run"]["code"]["commit"] == "b" * 40 and written["eval"]["versions"] == provenance.versions()
    board = load_script("leaderboard")
    table = board.main([str(tmp_path / "a"), str(tmp_path / "b")])
    head, _, *rows = table.splitlines()
    column = [c.strip() for c in head.split("|")].index("commit")
    assert [[c.strip() for c in row.split("|")][column] for row in rows] == ["a" * 12, "b" * 12 + "+dirty"]
    err = capsys.readouterr().err.splitlines()
    assert err == ["warning: the compared runs differ in code (b vs a)"]
    board.main([str(tmp_path / "a"), str(tmp_path / "a")])
    assert capsys.readouterr().err == ""                                        # same runs: no warning
