"""Train a VQ image tokenizer (LlamaGen layout) on the embedded digits or an image folder.

    python tokenizers/train_vq.py configs/vq_digits.yaml
    python tokenizers/train_vq.py configs/vq_digits.yaml --set train.max_steps=200 --set train.out_dir=runs/vq_small
    accelerate launch tokenizers/train_vq.py configs/vq16_folder.yaml --set data.path=/data/imagenet/train

Reruns resume from the newest checkpoint in train.out_dir. Use the result as a tokenizer with
``data.tokenizer: RUN/checkpoints/step_XXXXXXXX.pt`` (or the run folder itself).
"""
import argparse
import sys

from mutor2d.config import ConfigError
from mutor2d.tokenizer.vq_train import load_config, train


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", default="vq_digits", help="YAML path or name under configs/")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        metrics = train(cfg)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print("final eval: " + " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))


if __name__ == "__main__":
    main()
