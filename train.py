"""Train a model: python train.py --config NAME [--out RUN_DIR] [--set section.key=value ...]
[--max-steps N] [--resume auto|PATH]

Runs on one CPU/GPU as is, and on many GPUs/nodes with ``accelerate launch train.py ...``. Resuming
(``--resume``) continues with the run's saved config: only values given with --set / --max-steps
change it (each change is named), and values of the config file that differ are named and not used.
The run folder (default runs/<config name>, or train.out_dir) receives config.yaml, log.jsonl,
checkpoints/ and samples/, and run.lock while a run holds it (one live run per folder). See
mutor2d/engine/ for the rules.

Exit codes: 0 done; 2 bad config or input, or the run folder is in use by another live run (one line
on stderr); 1 training diverged (non-finite or blown-up updates); 74 a checkpoint could not be written
(disk full, I/O error; the earlier ones are kept); 75 stopped by SIGTERM/SIGINT after writing a
checkpoint (continue with --resume auto); 130 Ctrl-C before the run had a checkpoint (one line).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

from mutor2d.checkpoint import inference            # the command line parses before torch is imported
from mutor2d import config as config_lib
from mutor2d.cli import HelpFormatter
from mutor2d.config import ConfigError
from mutor2d.config_files import read_mapping
from mutor2d.plugins import load_plugins


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Train a class-conditional AR model (NTP / MuToR / multi-head).",
                                 formatter_class=HelpFormatter)
    ap.add_argument("--config", help="YAML path or name under configs/ (e.g. digits_mutor2d.yaml); "
                                     "optional with --resume PATH (the checkpoint's config is used)")
    ap.add_argument("--out", help="run folder (default: train.out_dir, else runs/<config name>)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a config value (repeatable)")
    ap.add_argument("--max-steps", type=int, help="override train.max_steps (default: the config's)")
    ap.add_argument("--resume", metavar="auto|PATH",
                    help="'auto': continue from the newest readable checkpoint of the run folder (fresh "
                         "start if it has none); PATH: a checkpoint file or run folder to continue from. "
                         "A resumed run keeps its saved config except what --set / --max-steps change "
                         "(default: a fresh run; a run folder with checkpoints is refused)")
    return ap


def run(args: argparse.Namespace) -> Path:
    """Load the plugins (MUTOR2D_PLUGINS), load and check the run's config (a bad one fails before torch
    is imported), then train. Where a resumed run continues from, and with which config, the engine
    decides once, holding the run's lock (mutor2d.engine.setup.ResumeWith: the saved config plus --set /
    --max-steps)."""
    from mutor2d.engine import default_run_dir
    load_plugins()
    overrides = list(args.overrides)
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    if args.config:
        data = read_mapping(args.config)
    elif args.resume and args.resume != "auto":
        data = inference.read_meta(args.resume)["config"]      # the named checkpoint's config: its task, folder
    else:
        raise ConfigError("--config is required (it may be left out only with --resume PATH)")
    cfg = config_lib.load(data, overrides)                     # the mapping is not modified
    if args.out == "":
        raise ConfigError("--out '': expected a run folder path (leave --out out for train.out_dir)")
    run_dir = args.out or cfg.train.out_dir or default_run_dir(args.config)
    if Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise ConfigError(f"run folder {str(run_dir)!r} exists and is not a folder; expected a run folder "
                          f"(--out, train.out_dir)")
    from mutor2d.engine.loop import train                 # torch: after the config is checked
    from mutor2d.engine.setup import ResumeWith
    return train(cfg, run_dir, resume=args.resume, resume_with=ResumeWith(overrides, data))


def main(argv=None) -> Path:
    return execute(build_parser().parse_args(argv))


def execute(args: argparse.Namespace) -> Path:
    """Run the parsed command line (train.py's, or a shim's with the same options) -> the run folder."""
    from mutor2d.engine.entry import run_entry
    return run_entry(lambda: run(args))    # the last line: the run's summary or error, naming its folder


if __name__ == "__main__":
    main()
