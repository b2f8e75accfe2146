"""app.py's command line, parsed and checked before torch (or gradio) is imported; mutor2d.demo.page serves
the page. Without the demo extra, every command (``--help`` too) prints one line naming it."""
from __future__ import annotations

import argparse
import importlib.util
import sys

from ..cli import HelpFormatter


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python app.py", formatter_class=HelpFormatter,
                                description="The mutor2d demo page: sample a class grid from a checkpoint.")
    p.add_argument("--ckpt", required=True, help="checkpoint file, run folder, safetensors export or hub folder")
    p.add_argument("--port", type=int, default=7860, help="port of the page")
    p.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to serve other machines")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--no-ema", dest="ema", action="store_false", help="the raw weights even when EMA exists")
    return p


def main(argv=None) -> None:
    """Without gradio: one line naming the extra, exit 2 (before parsing, so ``--help`` says it too).
    Then parse, and serve through mutor2d.demo."""
    if importlib.util.find_spec("gradio") is None:
        print('error: the demo needs gradio (not installed): pip install -e ".[demo]"', file=sys.stderr)
        raise SystemExit(2)
    args = build_parser().parse_args(argv)
    from .page import run
    run(args)
