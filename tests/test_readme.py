"""The README's commands, then docs/TUTORIAL.md's (the first-hour walkthrough), in order, on a fresh
copy of the project, as a newcomer runs them (so neither page can drift from the code).

Rules (the tutorial states them): every ```bash and ```python block runs in order in one fresh folder
holding the project's tracked files; install steps (venv, activate, pip) and the test-suite command are
left out (this environment is the installed one); a block whose first line is ``# needs: ...`` is not
run; every training command gets ``--set train.max_steps=20`` in place of its own --max-steps (the tutorial's one override); ``app.py``
is started, must serve its page, and is stopped. The commands of the language-model and tokenizer
sections share no file with the image ones: each of the three chains runs in README order, the chains
side by side (the suite's time).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import demo_extra
from timeouts import limit

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("README.md", "docs/TUTORIAL.md")        # run in this order, as one walk
QUICK = "--set train.max_steps=20"
SKIPPED = re.compile(r"^(python3 -m venv|\. \.venv/bin/activate|pip install|python -m pytest)")
TRAINING = re.compile(r"^python (train\.py|tokenizers/train_vq\.py) ")
CHAINS = {"stargraph": re.compile(r"stargraph_bn|tiny-gpt2|sg_gpt2"),
          "language": re.compile(r"mutor2d\.lm|lm_tiny_arith|tiny-llama|arith_"), "tokenizer": re.compile(r"vq_digits")}


def readme_blocks(text: str) -> list[tuple[str, str]]:
    """[(language, body)] of the README's bash and python blocks, in order."""
    return re.findall(r"^```(bash|python)\n(.*?)^```", text, flags=re.S | re.M)


def commands(text: str, quick: bool = True) -> list[tuple[str, str]]:
    """[(kind, command)]: kind "python" (a script), "app" (a server) or "shell"; the rules above (``quick``:
    training commands capped at 20 steps, their own --max-steps dropped; else as written)."""
    out = []
    for lang, body in readme_blocks(text):
        if body.startswith("# needs:"):
            continue
        if lang == "python":
            out.append(("python", body))
            continue
        for line in body.replace("\\\n", " ").splitlines():
            steps = [s.strip() for s in line.split(" && ") if s.strip() and not SKIPPED.match(s.strip())]
            for step in steps:
                step = " ".join(re.sub(r"\s+#.*$", "", step).split())      # no trailing comment
                if quick and TRAINING.match(step):
                    step = f"{re.sub(r' --max-steps [0-9]+', '', step)} {QUICK}"
                out.append(("app" if step.startswith("python app.py") else "shell", step))
    return out


def walk() -> list[tuple[str, str]]:
    """The commands of README.md, then those of docs/TUTORIAL.md."""
    return [step for page in PAGES for step in commands((ROOT / page).read_text())]


def test_readme_rules_pick_the_commands():
    text = ("```bash\npython3 -m venv .venv && . .venv/bin/activate && pip install -e . && python train.py "
            "--config a.yaml\n```\n```bash\n# needs: GPUs\npython train.py --config big.yaml\n```\n"
            "```bash\npython sample.py --ckpt r \\\n    --cfg 2.0      # a grid\npython app.py --ckpt r\n```\n"
            "```python\nprint(1)\n```\n```text\npython nothing.py\n```\n")
    assert commands(text.replace("a.yaml", "a.yaml --max-steps 900")) == commands(text)     # the walk's cap wins
    assert commands(text) == [("shell", f"python train.py --config a.yaml {QUICK}"),
                              ("shell", "python sample.py --ckpt r --cfg 2.0"),
                              ("app", "python app.py --ckpt r"), ("python", "print(1)\n")]


WALK_STEPS = 1000     # the most steps a walkthrough training command trains as written (CPU minutes)


def test_every_training_command_as_written_fits_the_walk():
    """The walk caps training at 20 steps, so it cannot see a command that trains for days as written
    (the star-graph stand-in once took the paper's 1,250,000 steps): each training command outside a
    ``# needs:`` block, with its own --max-steps / --set, trains at most WALK_STEPS steps."""
    import importlib.util
    import shlex
    from mutor2d import config as config_lib
    spec = importlib.util.spec_from_file_location("train_vq_walk", ROOT / "tokenizers" / "train_vq.py")
    train_vq = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_vq)                        # its parser is train.py's with CONFIG first
    seen = 0
    for page in PAGES:
        for kind, step in commands((ROOT / page).read_text(), quick=False):
            if kind != "shell" or not TRAINING.match(step):
                continue
            args = train_vq.build_parser().parse_args(shlex.split(step)[2:])
            name = args.config or args.config_file
            steps = args.max_steps or config_lib.load(name, args.overrides).train.max_steps
            assert steps <= WALK_STEPS, f"{page}: {step} trains {steps} steps"
            seen += 1
    assert seen >= 5


def fresh_copy(dest: Path) -> Path:
    """The project's tracked files (a fresh clone's content) under ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_once(command: str, cwd: Path, env: dict) -> None:
    """Start the demo, wait until its page answers 200, stop it."""
    port = free_port()
    proc = subprocess.Popen(shlex.split(command) + ["--port", str(port)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + limit(240)
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
                    assert page.status == 200
                    return
            except OSError:
                time.sleep(1)
        raise AssertionError(f"{command}: no page on port {port}\n{proc.stdout.read() if proc.poll() else ''}")
    finally:
        proc.terminate()
        proc.wait(timeout=limit(30))


def chain_of(command: str) -> str:
    return next((name for name, pattern in CHAINS.items() if pattern.search(command)), "image")


def run_chain(steps: list[tuple[str, str]], work: Path, env: dict) -> None:
    """Run ``steps`` in order in ``work``; the first failure raises, naming its command."""
    for kind, command in steps:
        if kind == "app":
            serve_once(command, work, env)
            continue
        argv = [sys.executable, "-c", command] if kind == "python" else ["bash", "-c", command]
        r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=limit(600))
        assert r.returncode == 0, f"README command failed: {command}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the git checkout (git ls-files)")
def test_readme_commands_run_in_order_on_a_fresh_folder(tmp_path):
    demo_extra("gradio")
    work = fresh_copy(tmp_path / "clone")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(work)}
    steps = walk()
    assert len(steps) >= 20 and sum(kind == "app" for kind, _ in steps) == 1
    chains = {name: [s for s in steps if chain_of(s[1]) == name] for name in ("image", *CHAINS)}
    assert all(len(chain) >= 2 for chain in chains.values()), {k: len(v) for k, v in chains.items()}
    with ThreadPoolExecutor(len(chains)) as pool:
        for done in [pool.submit(run_chain, chain, work, env) for chain in chains.values()]:
            done.result()
    assert (work / "runs/digits_mutor2d/eval").is_dir() and (work / "runs/lm_tiny_arith/eval").is_dir()
    assert (work / "runs/digits_vq_mutor2d/checkpoints").is_dir()
    assert list((work / "runs/sg_gpt2_mutor/eval").glob("*.json"))          # the B&N star graph, scored


def test_ci_runs_the_readmes_test_command():
    """.ci/run runs the README's test command, flags included (-n 2 among them)."""
    readme = re.findall(r"python -m pytest[^\n`]*", (ROOT / "README.md").read_text())
    ci = re.findall(r"^python -m pytest.*$", (ROOT / ".ci/run").read_text(), flags=re.M)
    assert len(readme) == 1 and ci == readme, (readme, ci)


def test_the_files_the_suite_starts_first_exist():
    """A renamed long file would silently lose its early start (conftest.FIRST_FILES)."""
    import conftest
    assert [name for name in conftest.FIRST_FILES if not (ROOT / "tests" / name).is_file()] == []


def test_the_readmes_three_commands_are_among_the_tested_ones():
    """The README's table of the three commands (train, sample, evaluate) shows commands the walk runs."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## The three commands"):readme.index("## The method in one screen")]
    shown = re.findall(r"^\| \w+ \| `(python [^`]+)`", section, flags=re.M)
    run = {re.sub(rf" {re.escape(QUICK)}$", "", command) for _, command in walk()}
    assert len(shown) == 3 and [c for c in shown if c not in run] == [], shown


def test_the_tutorial_keeps_its_walk_and_its_needs_blocks():
    """The walkthrough moved from the README keeps its steps: the main job in the README, the photos
    chain (step 10) and the cluster blocks marked ``# needs:`` in the tutorial."""
    readme, tutorial = ((ROOT / page).read_text() for page in PAGES)
    assert "python train.py --config digits_mutor2d.yaml" in [c for _, c in commands(readme)][0]
    needs = [body for _, body in readme_blocks(tutorial) if body.startswith("# needs:")]
    assert len(needs) >= 3 and any("photos" in body for body in needs), len(needs)
    assert [n for n in range(1, 11) if f"**{n}. " not in tutorial] == []
