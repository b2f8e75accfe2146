"""Train a VQ image tokenizer (LlamaGen layout) on the embedded digits or an image folder.

    python tokenizers/train_vq.py --config vq_digits.yaml
    python tokenizers/train_vq.py --config vq_digits.yaml --set train.max_steps=200 --out runs/vq_small
    python tokenizers/train_vq.py --config vq_photos.yaml      (the photo crops: docs/TUTORIAL.md step 10)
    accelerate launch tokenizers/train_vq.py --config vq_photos.yaml --set model.preset=vq16 \
        --set data.path=/data/imagenet/train --set data.eval_path=/data/imagenet/val \
        --set data.crop_range=1.1 --out runs/vq16          (LlamaGen's VQ-16 at 256 px)

train.py with the config also taken as an optional first argument (``train_vq.py vq_digits.yaml``;
default vq_digits): the same entry, options, resume rule (``--resume auto`` continues a run folder),
exit codes (75: stopped by a signal after a checkpoint) and last line (the run's summary, with its last
reconstruction metrics and the codebook's use, "N of M codes (P %)", called low under 25 %).
``train.py --config vq_digits.yaml`` trains the same run. Use the result as a tokenizer with
``data.tokenizer: RUN/checkpoints/step_XXXXXXXX.pt`` (or the run folder itself).
"""
import sys
from pathlib import Path

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

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
    if args.config and args.config_file and args.config != args.config_file:
        ap.error(f"--config {args.config} and CONFIG {args.config_file}: give the config once")
    args.config = args.config or args.config_file or (None if args.resume not in (None, "auto") else "vq_digits")
    return train_entry.execute(args)


if __name__ == "__main__":
    main()
