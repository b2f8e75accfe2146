"""``python -m mutor2d.checkpoint export CKPT OUT.safetensors``: a checkpoint's weights (EMA when
present) as one safetensors file, config and grid in its metadata (mutor2d.checkpoint.export)."""
from __future__ import annotations

import argparse

from .. import io
from ..cli import HelpFormatter
from .export import export_parts, save_safetensors


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m mutor2d.checkpoint", formatter_class=HelpFormatter,
                                 description="Export a checkpoint's weights as safetensors for sharing.")
    sub = ap.add_subparsers(dest="cmd", required=True, help="what to do (export: one safetensors file)")
    ex = sub.add_parser("export", help="CKPT (file or run folder) -> OUT.safetensors", formatter_class=HelpFormatter,
                        description="Write a checkpoint's weights (EMA when it has them), config, step and grid as "
                                    "one safetensors file.")
    ex.add_argument("ckpt", help="checkpoint file, sharded checkpoint folder or run folder (its newest checkpoint)")
    ex.add_argument("out", help="the .safetensors file to write")
    ex.add_argument("--no-ema", action="store_true", help="export the raw weights even when EMA exists")
    return ap


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    try:
        parts = export_parts(args.ckpt, args.out, use_ema=not args.no_ema)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    with io.exit_on_write_error(args.out):
        out = save_safetensors(*parts, args.out)
    print(f"wrote {out}")


if __name__ == "__main__":
    from ..preempt import exit_on_ctrl_c
    exit_on_ctrl_c()        # python -m: a Ctrl-C mid-way is one line, exit 130
    main()
