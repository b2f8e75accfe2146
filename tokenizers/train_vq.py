"""Train a VQ image tokenizer (LlamaGen layout) on the embedded digits or an image folder.

    python tokenizers/train_vq.py configs/vq_digits.yaml
    python tokenizers/train_vq.py configs/vq_digits.yaml --set train.max_steps=200 --set train.out_dir=runs/vq_small
    accelerate launch tokenizers/train_vq.py configs/vq16_folder.yaml --set data.path=/data/imagenet/train

The same engine as train.py (which also takes these configs: ``train.py --config vq_digits.yaml``), with
one difference: a rerun resumes from the newest checkpoint in train.out_dir (``--resume auto``). Exit
codes as train.py's (75: stopped by a signal after a checkpoint). Use the result as a tokenizer with
``data.tokenizer: RUN/checkpoints/step_XXXXXXXX.pt`` (or the run folder itself).
"""
import argparse

from mutor2d.cli import HelpFormatter   # the command line parses before torch is imported (in main)
from mutor2d.plugins import load_plugins


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("config", nargs="?", default="vq_digits", help="YAML path or name under configs/")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a config value (repeatable)")
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    from mutor2d.engine import run_entry
    from mutor2d.vq.run import load_config, train

    def start() -> dict:
        load_plugins()
        return train(load_config(args.config, args.overrides))
    metrics = run_entry(start)
    print("final eval: " + " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))


if __name__ == "__main__":
    main()
