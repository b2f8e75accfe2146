"""--help of every entry point: the top-level scripts, eval/, bench/, experiments/, tokenizers/ and the
``python -m`` modules (found by their ``__main__`` guard or a package's ``__main__.py``, so a new one
cannot be left out) build their parser with ``build_parser()``; every option, positional and subcommand has a help
text, and every parser uses the shared formatter that shows each option's default
(mutor2d.cli.HelpFormatter). In-process: the modules are imported, no script runs. And in a subprocess
each entry point answers --help and a bad option before torch is imported."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mutor2d.cli import HelpFormatter
from conftest import demo_extra

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for folder in (ROOT, ROOT / "eval", ROOT / "bench", ROOT / "experiments", ROOT / "tokenizers") for p in folder.glob("*.py")
                 if "__main__" in p.read_text())
MODULES = sorted({".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "mutor2d").rglob("*.py")
                  if 'if __name__ == "__main__"' in p.read_text() and p.name != "__main__.py"}
                 | {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "mutor2d").rglob("__main__.py")})
DELEGATES = {"app.py": "mutor2d.demo.cli"}         # scripts whose parser lives in a module
ENTRIES = [p.relative_to(ROOT).as_posix() for p in SCRIPTS] + [f"-m {m}" for m in MODULES]
# runs an entry point with --help, then with a bad option, refusing to import torch (an entry point that
# tries fails at once); prints the exit codes and whether torch was asked for
NO_TORCH_PROBE = """
import importlib.abc, json, os, runpy, sys

class NoTorch(importlib.abc.MetaPathFinder):
    tried = False

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            NoTorch.tried = True
            raise ImportError(f"{name} imported before --help")
        return None

sys.meta_path.insert(0, NoTorch())
entry, codes = sys.argv[1], []
for argv in (["--help"], ["--no-such-option"]):
    sys.argv = [entry, *argv]
    try:
        if entry.startswith("-m "):
            runpy.run_module(entry[3:], run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(entry))       # as python SCRIPT has it
            runpy.run_path(entry, run_name="__main__")
    except SystemExit as e:
        codes.append(e.code)
    except Exception as e:
        codes.append(repr(e))
print(json.dumps({"codes": codes, "torch": NoTorch.tried}))
"""


def script_parser(path: Path, monkeypatch) -> argparse.ArgumentParser:
    if path.name in DELEGATES and path.parent == ROOT:
        return importlib.import_module(DELEGATES[path.name]).build_parser()
    monkeypatch.syspath_prepend(str(path.parent))           # bench/ scripts import bench/common.py
    spec = importlib.util.spec_from_file_location(f"help_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)      # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.build_parser()


def undescribed(parser: argparse.ArgumentParser, where: str) -> list[str]:
    """'where: option' for each action of ``parser`` and its subcommands without a help text, and
    'where: formatter' for a parser that does not show defaults; formats every help page."""
    bad = [] if issubclass(parser.formatter_class, HelpFormatter) else [f"{where}: formatter"]
    parser.format_help()                                       # a bad %-format in a help string fails here
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        if not (action.help or "").strip():
            bad.append(f"{where}: {'/'.join(action.option_strings) or action.dest}")
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                bad += undescribed(sub, f"{where} {name}")
    return bad


def test_every_entry_point_is_found():
    names = {p.relative_to(ROOT).as_posix() for p in SCRIPTS}
    assert {"train.py", "sample.py", "app.py", "eval/fid.py", "bench/lm_step.py", "tokenizers/train_vq.py"} <= names
    assert {"mutor2d.objectives.figure", "mutor2d.lm.data", "mutor2d.checkpoint", "mutor2d.hub"} <= set(MODULES)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_script_option_has_help(path, monkeypatch):
    assert undescribed(script_parser(path, monkeypatch), path.name) == []


@pytest.mark.parametrize("name", MODULES)
def test_every_module_option_has_help(name):
    """A package's parser is its ``__main__``'s (the command line of ``python -m PACKAGE``)."""
    module = importlib.import_module(name)
    if hasattr(module, "__path__"):
        module = importlib.import_module(f"{name}.__main__")
    assert undescribed(module.build_parser(), name) == []


def test_the_formatter_shows_defaults_once():
    ap = argparse.ArgumentParser(formatter_class=HelpFormatter)
    ap.add_argument("--steps", type=int, default=500, help="training steps")
    ap.add_argument("--seed", type=int, default=0, help="seed")
    ap.add_argument("--out", default="mask.png", help="PNG to write (default mask.png)")
    ap.add_argument("--grid", help="token grid (default: the model's)")
    ap.add_argument("--quick", action="store_true", help="CI size")
    text = " ".join(ap.format_help().split())
    assert "training steps (default: 500)" in text and "seed (default: 0)" in text
    assert text.count("mask.png") == 1 and "(default: None)" not in text and "(default: False)" not in text


@pytest.mark.parametrize("entry", ENTRIES)
def test_help_and_argument_errors_come_before_importing_torch(entry):
    """--help (exit 0) and a bad option (exit 2, usage on stderr) without importing torch."""
    from timeouts import limit
    if entry == "app.py":
        demo_extra("gradio")     # without it app.py --help names the extra (test_hardening)
    r = subprocess.run([sys.executable, "-c", NO_TORCH_PROBE, entry], cwd=ROOT, capture_output=True, text=True,
                       timeout=limit(60))
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.splitlines()[-1]) == {"codes": [0, 2], "torch": False}
    assert "usage:" in r.stdout and " error: " in r.stderr
