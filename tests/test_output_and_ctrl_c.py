"""What a user sees at the end of a command, and what Ctrl-C does.

The rule for terminal output: a progress bar is closed (or written above) before any line that ends a
run; the last line of a failed run is its error, that of a finished run its summary. A redirected log
gets lines (the expected time, steps, checkpoints, grids), not one line of bar redraws. Ctrl-C gives
one line at start-up (exit 130: every entry script, while it still imports) and mid-way (sample.py
--npz keeps its finished shards for the rerun, which says it reuses them). Also: what sample.py says
of its speed, what eval/fid.py refuses to compare, what the leaderboard does not compare, the VQ run's
last line, and the names and paths a mistyped config or checkpoint gets."""
import fcntl
import json
import os
import pty
import re
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY_DIGITS
from test_cli_values import script
from timeouts import limit

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = limit(180)
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
TRAIN = [sys.executable, "train.py", "--config", "digits_mutor2d.yaml", *(a for s in TINY_DIGITS for a in ("--set", s))]
pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


def on_a_terminal(cmd: list[str], preexec_fn=None) -> tuple[int, list[str]]:
    """(exit code, the lines a 120-column terminal shows) of ``cmd`` with stdin, stdout and stderr on a
    pseudo-terminal: each line as it reads once the bar's carriage-return redraws are done."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, cwd=ROOT, env=ENV, preexec_fn=preexec_fn)
    os.close(slave)
    out, deadline = b"", time.monotonic() + TIMEOUT
    while True:
        ready, _, _ = select.select([master], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            proc.kill()
            raise subprocess.TimeoutExpired(cmd, TIMEOUT)
        try:
            data = os.read(master, 1 << 16)
        except OSError:               # EIO: the command's side of the terminal is closed
            data = b""
        if not data:
            break
        out += data
    os.close(master)
    shown = [line.rstrip("\r").split("\r")[-1].rstrip() for line in out.decode(errors="replace").split("\n")]
    return proc.wait(TIMEOUT), [line for line in shown if line]


def test_the_last_line_is_the_error_of_a_failed_run_and_the_summary_of_a_finished_one(tmp_path):
    """The sweep's 4 KB-free disk, as a file-size limit (no mount needed): train.py's error was printed on
    the bar's line and the bar redrawn after it (last line ``train:   0%| ...``), exit 2, and a
    half-written config.yaml stayed. A finished run ended with a "run folder:" line after its summary."""
    failed = tmp_path / "failed"
    code, lines = on_a_terminal([*TRAIN, "--out", str(failed)],
                                preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (600, 600)))
    assert code == 74 and lines[-1] == (f"error: could not write into run folder '{failed}' (File too large); "
                                        "no checkpoint had been written"), lines
    assert not failed.exists() or not [p for p in failed.rglob("*") if p.is_file()]   # no config.yaml, no temp
    done = tmp_path / "done"
    code, lines = on_a_terminal([*TRAIN, "--out", str(done), "--set", "train.max_steps=3"])
    assert code == 0 and any(line.startswith("train: 100%|") for line in lines), lines      # the bar was drawn
    assert lines[-1].startswith("done: steps 1-3 in ") and f"; run folder {done};" in lines[-1], lines
    assert lines[0].startswith("image run on cpu: ") and f"step 3: checkpoint {done / 'checkpoints'}" in "\n".join(lines)


def test_a_run_lock_that_cannot_be_written_leaves_no_file_and_no_folder(tmp_path):
    """The first write of a run: an empty run.lock (and its new folder) stayed behind on a full disk."""
    code = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_FSIZE, (10, 10))\n"
            "from mutor2d.engine.lock import run_lock\nwith run_lock(sys.argv[1]):\n    pass")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], env=ENV, capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 1 and "File too large" in r.stderr and list(tmp_path.iterdir()) == []


def test_a_redirected_log_gets_lines_with_the_expected_time_checkpoints_and_grids(tmp_path, capsys):
    """stderr not a terminal (a log file, here pytest's capture): no bar, but the expected time after the
    first logged step (with the threads and load it depends on), step lines, and each checkpoint and grid
    saved (was: one progress-bar line and nothing else until the end)."""
    from mutor2d.engine.loop import train
    from test_training import tiny
    run = tmp_path / "run"
    train(tiny("train.max_steps=4", "train.ckpt_every=2", "train.sample_every=2"), run)
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert "\r" not in err and "train:" not in err
    assert re.fullmatch(r"expected time: about \d+ s more for steps 2-4 \([\d.e-]+ s a step over steps 1-1 on cpu, "
                        r"1 thread(, load average [\d.]+)? on \d+ cores; a busier machine, or more threads than free "
                        r"cores \(OMP_NUM_THREADS\), takes longer\)", lines[1]), lines
    assert lines[2].startswith("step 1/4: loss ") and "so far, about " in lines[2]
    for step in (2, 4):
        assert f"step {step}: checkpoint {run / 'checkpoints' / f'step_{step:08d}.pt'}" in lines
        assert f"step {step}: sample grid {run / 'samples' / f'step_{step:08d}.png'}" in lines
    assert any(line.startswith("step 4/4: loss ") for line in lines) and lines[-1].startswith("done: steps 1-4 ")


# ----------------------------------------------------------------------------- Ctrl-C

ENTRY_SCRIPTS = ["train.py", "sample.py", "app.py", *(str(p.relative_to(ROOT)) for d in ("tokenizers", "eval", "experiments", "bench")
                                                    for p in sorted((ROOT / d).glob("*.py")) if p.name != "common.py")]

# Ctrl-C while a script imports its own modules: SIGINT to itself at its first mutor2d import after the
# Ctrl-C rule's (mutor2d.preempt); the script run as ``python SCRIPT`` runs it (its folder first on sys.path)
INTERRUPT_AT_IMPORT = """
import importlib.abc, os, runpy, signal, sys
class CtrlC(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.startswith("mutor2d.") and name != "mutor2d.preempt":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, CtrlC())
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_ctrl_c_while_any_entry_script_imports_is_one_line_exit_130():
    """Was a KeyboardInterrupt traceback from wherever the import was (SIGTERM at that moment: clean);
    the benchmarks too."""
    procs = {s: subprocess.Popen([sys.executable, "-c", INTERRUPT_AT_IMPORT, s], cwd=ROOT, env=ENV, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE) for s in ENTRY_SCRIPTS}
    assert {"train.py", "sample.py", "app.py", "tokenizers/train_vq.py", "eval/fid.py", "experiments/compare.py"} <= set(procs)
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=TIMEOUT)
        assert (proc.returncode, out, err) == (130, "", "interrupted by Ctrl-C\n"), name


# the library's own commands (python -m mutor2d.X): SIGINT to itself as the command parses its arguments
INTERRUPT_MID_COMMAND = """
import argparse, os, runpy, signal, sys
def ctrl_c(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
argparse.ArgumentParser.parse_args = ctrl_c
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""
LIBRARY_COMMANDS = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__main__")
                          for p in (ROOT / "mutor2d").rglob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def test_ctrl_c_in_any_python_m_command_is_one_line_exit_130():
    """Was a KeyboardInterrupt traceback (the scripts' rule did not reach ``python -m mutor2d.data.photos``
    and the other library commands)."""
    assert {"mutor2d.data.photos", "mutor2d.checkpoint", "mutor2d.hub", "mutor2d.lm.tiny"} <= set(LIBRARY_COMMANDS)
    procs = {m: subprocess.Popen([sys.executable, "-c", INTERRUPT_MID_COMMAND, m], cwd=ROOT, env=ENV, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE) for m in LIBRARY_COMMANDS}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=TIMEOUT)
        assert (proc.returncode, out, err) == (130, "", "interrupted by Ctrl-C\n"), name


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see torch being loaded")
def test_ctrl_c_while_train_py_loads_torch_is_one_line_and_writes_nothing(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([*TRAIN, "--out", str(run)], cwd=ROOT, env=ENV, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + TIMEOUT
    while "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130 and len(err.splitlines()) == 1 and err.startswith("interrupted by Ctrl-C"), err
    assert not run.exists()                          # (a later Ctrl-C, in the run's start-up, says more: below)


def test_ctrl_c_in_a_runs_start_up_is_one_line_130_or_75_once_it_has_a_checkpoint(tiny_digits_run, tmp_path,
                                                                                  monkeypatch, capsys):
    """Ctrl-C after the run folder is held but before the steps (the steps stop on it with 75 as on
    SIGTERM): the lock is let go; a fresh run says nothing was saved (130), a resumed one where to go on (75)."""
    from mutor2d.engine import loop
    from mutor2d.engine.entry import run_entry
    from test_training import tiny

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(loop, "build_run", ctrl_c)
    fresh, resumed = tmp_path / "fresh", tmp_path / "resumed"
    shutil.copytree(tiny_digits_run, resumed)
    for run, resume, code, line in (
            (fresh, None, 130, "interrupted by Ctrl-C: no checkpoint had been written; run the same command to start "
                               "again"),
            (resumed, "auto", 75, "interrupted by Ctrl-C; its checkpoints are kept (newest: step_00000002.pt): "
                                  "continue with --resume auto")):
        try:
            with pytest.raises(SystemExit) as e:
                run_entry(lambda: loop.train(tiny(), run, resume=resume))
        except KeyboardInterrupt:                       # it would end the test session: a failure instead
            pytest.fail("Ctrl-C at start-up left run_entry as a KeyboardInterrupt")
        assert e.value.code == code and capsys.readouterr().err.splitlines() == [line]
        assert not (run / "run.lock").exists()


def test_ctrl_c_mid_npz_keeps_the_finished_shards_and_the_rerun_says_it_reuses_them(tiny_digits_run, tmp_path):
    """Was a 30-line KeyboardInterrupt traceback from sampling/plain.py (SIGTERM: one line, rerun continues)."""
    npz, shards = tmp_path / "s.npz", tmp_path / "s_shards"
    cmd = [sys.executable, "sample.py", "--ckpt", str(tiny_digits_run), "--num", "40", "--batch-size", "1",
           "--npz", str(npz)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + TIMEOUT
    while not (shards.is_dir() and list(shards.glob("shard_*.npz"))) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=TIMEOUT)
    done = len(list(shards.glob("shard_*.npz")))
    assert proc.returncode == 130 and "Traceback" not in err and 1 <= done < 40 and not npz.exists(), err
    assert err.splitlines()[-1] == (f"interrupted by Ctrl-C: {done} of 40 shards are finished in {shards}; the same "
                                    "command makes the rest")
    again = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=TIMEOUT)
    lines = again.stdout.splitlines()
    assert again.returncode == 0 and lines[0] == (f"reusing {done} of 40 shards finished earlier in {shards}; making "
                                                  f"the other {40 - done}"), again.stdout + again.stderr
    assert re.fullmatch(rf"sampled {40 - done} images in [\d.]+ s of decoding \(--decode plain: 64\.0 forwards per "
                        r"image, [\d.]+ images/s\)", lines[1]) and lines[-1].startswith(f"wrote {npz} (40 samples")
    assert np.load(npz)["images"].shape == (40, 8, 8, 3) and not shards.exists()
    todo = 40 - done                                    # stderr is a pipe, not a terminal: lines, not a bar
    assert "\r" not in again.stderr and again.stderr.splitlines()[-1].startswith(f"shards {todo}/{todo}: ")
    assert all(re.fullmatch(rf"shards \d+/{todo}: \d+ s so far, about \d+ s left", line)
               for line in again.stderr.splitlines()), again.stderr


# ----------------------------------------------------------------------------- what commands say

def test_sample_py_grid_says_its_speed(tiny_digits_run, tmp_path, capsys):
    sample = script("sample.py", "sample_speed_line")
    sample.main(["--ckpt", str(tiny_digits_run), "--per-class", "2", "--out", str(tmp_path / "g.png"),
                 "--decode", "jacobi"])
    lines = capsys.readouterr().out.splitlines()
    match = re.fullmatch(r"sampled 4 images in [\d.]+ s of decoding \(--decode jacobi: ([\d.]+) forwards per image, "
                         r"[\d.]+ images/s\)", lines[-2])
    assert match and 1 <= float(match.group(1)) <= 64 and lines[-1].startswith(f"wrote {tmp_path / 'g.png'}")


def _sample_file(path: Path, side: int, data: str | None) -> Path:
    meta = {"config": {"data": {"name": data}}} if data else {}
    np.savez(path, images=np.zeros((4, side, side, 3), np.uint8), meta=np.array(json.dumps(meta)))
    return path


def test_fid_refuses_a_reference_of_another_data_set_or_image_size(tmp_path):
    """Digits samples against photos:train: FID 653.7, exit 0, a record and a leaderboard row."""
    from mutor2d.evaluation.options import MetricsError
    fid = script("eval/fid.py", "fid_comparable")
    digits = _sample_file(tmp_path / "digits.npz", 8, "digits")
    with pytest.raises(MetricsError) as e:
        fid.main([str(digits), "--ref", "photos:train", "--json", str(tmp_path / "r.json")])
    assert str(e.value) == (f"samples {digits} are 8x8-pixel images of data set 'digits', the reference photos:train "
                            "32x32-pixel images of data set 'photos': expected a reference of the samples' data set "
                            "and image size")
    with pytest.raises(MetricsError, match=r"16x16-pixel images: expected a reference"):      # data sets unknown
        fid.main([str(_sample_file(tmp_path / "a.npz", 8, None)), "--ref", str(_sample_file(tmp_path / "b.npz", 16, None)),
                  "--json", str(tmp_path / "r.json")])
    assert not (tmp_path / "r.json").exists()


def test_the_leaderboard_compares_forwards_per_image_not_speeds_measured_under_other_loads():
    from mutor2d.evaluation import records
    rec = {"metrics": {"fid": 20.0}, "sampling": {"decode": "registers", "decode_options": {"draft": 3},
                                                 "decode_stats": {"forwards_per_sequence": 21.3, "tokens_per_s": 310.0}}}
    row = records.markdown_table([rec], paper=False).splitlines()[-1]
    assert "registers draft=3: 21.3 fwd/img |" in row and "tok/s" not in row


def test_a_vq_runs_last_line_names_its_codebook_use_and_says_when_it_is_low(tmp_path, capsys):
    from mutor2d import config
    from mutor2d.vq.run import LOW_USAGE, usage_text
    assert LOW_USAGE == 0.25
    assert usage_text(14 / 512, 512) == "14 of 512 codes (2.7 %; low, under 25 %)"     # the tutorial's photo VQ
    assert usage_text(0.5, 256) == "128 of 256 codes (50.0 %)"
    train_vq = script("tokenizers/train_vq.py", "train_vq_last_line")
    run = train_vq.main(["--config", "vq_digits.yaml", "--out", str(tmp_path / "vq"), "--max-steps", "2",
                         *(a for s in ("model.preset=tiny", "data.eval_images=16", "train.batch_size=4",
                                       "train.log_every=1") for a in ("--set", s))])
    last = capsys.readouterr().out.splitlines()[-1]
    used = re.search(r"evaluation at step 2: l1 [\d.e-]+, mse [\d.e-]+, psnr [\d.]+, usage (\d+) of (\d+) codes "
                     r"\(([\d.]+) %(; low, under 25 %)?\), perplexity [\d.]+;", last)
    assert last.startswith("done: steps 1-2 in ") and last.endswith(f"run folder {run}") and used, last
    assert (used.group(4) is not None) == (float(used.group(3)) < 25)
    assert int(used.group(2)) == config.load("vq_digits.yaml", ["model.preset=tiny"]).model.codebook_size


def test_train_vq_cites_real_configs_and_takes_the_config_either_way():
    """Its --help named configs/vq16_folder.yaml (no such file); train.py takes --config, train_vq.py a
    positional: both are taken, and given twice differently they are refused."""
    cited = set()
    for path in [ROOT / "train.py", ROOT / "sample.py", *(p for d in ("tokenizers", "eval", "experiments", "bench")
                                                           for p in (ROOT / d).glob("*.py"))]:
        cited |= set(re.findall(r"(?:--config |train_vq\.py |configs/)(?:configs/)?([\w.-]+\.yaml)", path.read_text()))
    assert {"vq_digits.yaml", "vq_photos.yaml"} <= cited
    assert [name for name in sorted(cited) if not (ROOT / "configs" / name).is_file()] == []
    train_vq = script("tokenizers/train_vq.py", "train_vq_config_forms")
    help_text = train_vq.build_parser().format_help()
    assert "--config vq_photos.yaml" in help_text and "vq16_folder" not in help_text
    for argv in (["--config", "vq_digits.yaml"], ["vq_digits.yaml"]):
        args = train_vq.build_parser().parse_args(argv)
        assert (args.config or args.config_file) == "vq_digits.yaml"
    with pytest.raises(SystemExit):
        train_vq.main(["--config", "vq_digits.yaml", "vq_photos.yaml"])


def test_a_mistyped_config_name_gets_a_suggestion_and_the_absolute_paths_tried(tmp_path, monkeypatch):
    from mutor2d.checkpoint.locate import resolve
    from mutor2d.config import ConfigError
    from mutor2d.config_files import CONFIG_DIR, resolve_path
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        resolve_path("digits_mutor2.yaml")
    assert str(e.value) == (f"config 'digits_mutor2.yaml' not found (looked for {tmp_path / 'digits_mutor2.yaml'}, "
                            f"{CONFIG_DIR / 'digits_mutor2.yaml'}); did you mean 'digits_mutor2d.yaml'?")
    with pytest.raises(ConfigError, match=r"\(looked for .*/vq_photo, .*/configs/vq_photo, .*/configs/vq_photo\.yaml\); "
                                          r"did you mean 'vq_photos\.yaml'\?$"):
        resolve_path("vq_photo")
    with pytest.raises(FileNotFoundError) as e:
        resolve("runs/digits")
    assert str(e.value) == f"checkpoint 'runs/digits' ({tmp_path / 'runs' / 'digits'}) does not exist"
