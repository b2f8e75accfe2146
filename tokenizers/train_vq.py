"""Train a VQ image tokenizer (LlamaGen layout) on the embedded digits or an image folder.

    python tokenizers/train_vq.py configs/vq_digits.yaml
    python tokenizers/train_vq.py configs/vq_digits.yaml --set train.max_steps=200 --out runs/vq_small
    accelerate launch tokenizers/train_vq.py configs/vq16_folder.yaml --set data.path=/data/imagenet/train

train.py with the config as an optional first argument (default vq_digits) and the last
reconstruction metrics printed at the end: the same entry, options, resume rule (``--resume auto``
continues a run folder) and exit codes (75: stopped by a signal after a checkpoint). ``train.py
--config vq_digits.yaml`` trains the same run. Use the result as a tokenizer with ``data.tokenizer:
RUN/checkpoints/step_XXXXXXXX.pt`` (or the run folder itself).
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train as train_entry  # noqa: E402  (the command line parses before torch is imported)


def build_parser():
    ap = train_entry.build_parser()
    ap.description = __doc__
    ap.add_argument("config_file", nargs="?", metavar="CONFIG",
                    help="YAML path or name under configs/ (as --config; default vq_digits)")
    return ap


def main(argv=None) -> Path:
    ap = build_parser()
    args = ap.parse_args(argv)
    for flag, value in (("--config", args.config), ("CONFIG", args.config_file)):
        if value is not None and not value.strip():
            ap.error(f"{flag} {value!r}: expected a YAML path or a name under configs/ (leave it out for vq_digits)")
    args.config = args.config or args.config_file or (None if args.resume not in (None, "auto") else "vq_digits")
    run_dir = train_entry.execute(args)
    if os.environ.get("RANK", "0") == "0" and (Path(run_dir) / "log.jsonl").is_file():    # none: no step ran
        from mutor2d.engine.runlog import read_log
        evals = [r["eval"] for r in read_log(run_dir) if "eval" in r]
        if evals:
            print("final eval: " + " ".join(f"{k}={v:.4g}" for k, v in evals[-1].items()))
    return run_dir


if __name__ == "__main__":
    main()
