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
import os
from pathlib import Path

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

from mutor2d import checkpoint as ckpt_lib          # the command line parses before torch is imported
from mutor2d.checkpoint import inference, locate
from mutor2d import config as config_lib
from mutor2d.cli import HelpFormatter
from mutor2d.config import ConfigError
from mutor2d.config_files import parse_override, read_mapping
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
    """Load and check the run's config (a bad one fails before torch is imported), then train."""
    from mutor2d.engine import default_run_dir
    overrides = list(args.overrides)
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    if args.config:
        data = read_mapping(args.config)
        cfg = config_lib.load(data, overrides)             # the mapping is not modified
        saved = saved_config(args.resume, args.out or cfg.train.out_dir or default_run_dir(args.config))
        if saved is not None:                  # resuming: the run's own config, plus what --set says
            report_resume_changes(data, saved, overrides)
            cfg = config_lib.load(saved, overrides)
    elif args.resume and args.resume != "auto":
        cfg = config_lib.load(inference.read_meta(args.resume)["config"], overrides)
    else:
        raise ConfigError("--config is required (it may be left out only with --resume PATH)")
    if args.out == "":
        raise ConfigError("--out '': expected a run folder path (leave --out out for train.out_dir)")
    run_dir = args.out or cfg.train.out_dir or default_run_dir(args.config)
    if Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise ConfigError(f"run folder {str(run_dir)!r} exists and is not a folder; expected a run folder "
                          f"(--out, train.out_dir)")
    from mutor2d.engine.loop import train                 # torch: after the config is checked
    return train(cfg, run_dir, resume=args.resume)


def saved_config(resume: str | None, run_dir) -> dict | None:
    """The stored config of the checkpoint ``--resume`` continues from (None: a fresh run, or none to
    read here; the engine then says why)."""
    try:
        path = ckpt_lib.latest_valid(run_dir) if resume == "auto" else locate.resolve(resume) if resume else None
        return inference.read_meta(path)["config"] if path is not None else None
    except (ValueError, FileNotFoundError):
        return None


def report_resume_changes(file_data: dict, saved: dict, overrides: list[str]) -> None:
    """On resume the saved config wins over the config file; say which values --set changes and which
    values of the file are not used (main process only)."""
    from mutor2d.engine.config import flat
    if os.environ.get("RANK", "0") != "0":
        return
    old, given = flat(saved), {".".join(k): v for k, v in map(parse_override, overrides)}
    for key, value in given.items():
        if key in old and old[key] != value:
            print(f"note: {key} changed on resume: {old[key]!r} -> {value!r}", flush=True)
    unused = sorted(k for k, v in flat(file_data).items() if k not in given and k in old and old[k] != v)
    if unused:
        print(f"note: resuming with the run's saved config; the config file's {', '.join(unused)} differ and are "
              f"not used (--set them to change them)", flush=True)


def main(argv=None) -> Path:
    return execute(build_parser().parse_args(argv))


def execute(args: argparse.Namespace) -> Path:
    """Run the parsed command line (train.py's, or a shim's with the same options) -> the run folder."""
    from mutor2d.engine.entry import run_entry

    def start() -> Path:
        load_plugins()
        return run(args)
    return run_entry(start)        # the run's last line is its summary (or its error), naming the run folder


if __name__ == "__main__":
    main()
