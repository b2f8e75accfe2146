"""Tokenise an ImageFolder tree (root/CLASS/IMAGE, the ImageNet train layout) into a codes folder.

    python tokenizers/extract_codes.py --images /data/imagenet/train --tokenizer vq_ds16_c2i.pt \
        --out data/imagenet_codes --crops 5 --flip
    MUTOR2D_PLUGINS=my_tokenizer python tokenizers/extract_codes.py --images IMGS --tokenizer mine:ARG --out OUT
    accelerate launch --num_processes 8 tokenizers/extract_codes.py ...   (shards split over GPUs)

--tokenizer takes any registered tokenizer as ``data.tokenizer`` does: KIND, KIND:ARG (e.g. pixel:17,
vq:PATH) or a bare path (a VQ checkpoint). Writes codes.npy (uint16, num_images x num_augs x H x W,
memory-mapped), labels.npy, files.txt and header.json (see mutor2d/tokenizer/codes.py). Rerunning the
same command resumes: finished shards are skipped. Exits with status 2 and a one-line error when no
image could be read. Train on the result with ``data.name: codes``, ``data.path: OUT``,
``data.tokenizer:`` the same --tokenizer value.
"""
import argparse
import sys

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

from mutor2d.checks import WORKERS_LIMIT
from mutor2d.cli import HelpFormatter          # the command line parses and checks before torch is imported
from mutor2d.plugins import load_plugins
from mutor2d.tokenizer.config import CROP_RANGE, IMAGE_SIZE_LIMIT


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--images", required=True, help="ImageFolder root: one subfolder per class")
    ap.add_argument("--tokenizer", required=True,
                    help="KIND[:ARG] of a registered tokenizer, or a VQ checkpoint path (LlamaGen vq_ds16_c2i.pt "
                         "or train_vq.py output)")
    ap.add_argument("--out", required=True, help="output codes folder (created; reused to resume)")
    ap.add_argument("--image-size", type=int, default=None,
                    help="resolution to tokenise at (default: the tokenizer's own, 256 for LlamaGen's VQ-16)")
    ap.add_argument("--crops", type=int, default=1, help="1 = ADM centre crop only; up to 5 adds the 4 corner crops")
    ap.add_argument("--flip", action=argparse.BooleanOptionalAction, default=True,
                    help="add the horizontal mirror of every crop (default: on)")
    ap.add_argument("--crop-range", type=float, default=1.1, help="corner crops come from a centre crop this much larger")
    ap.add_argument("--shard-size", type=int, default=1024, help="images per resumable shard")
    ap.add_argument("--batch-size", type=int, default=64, help="views per tokenizer call")
    ap.add_argument("--workers", type=int, default=4, help="image decoding processes per rank")
    ap.add_argument("--max-shards", type=int, default=None,
                    help="stop each process after this many new shards (default: all)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def check_args(args: argparse.Namespace) -> None:
    """A flag's bad value is a one-line ValueError naming the flag, the value and what was expected;
    checked before torch is imported (CodesError's package, mutor2d.tokenizer, imports it)."""
    low, high = CROP_RANGE
    checks = [("--image-size", args.image_size, args.image_size is None or 1 <= args.image_size <= IMAGE_SIZE_LIMIT,
               f"1..{IMAGE_SIZE_LIMIT} pixels"),
              ("--crop-range", args.crop_range, low <= args.crop_range <= high, f"a number in [{low:g}, {high:g}]"),
              ("--max-shards", args.max_shards, args.max_shards is None or args.max_shards >= 1, ">= 1"),
              ("--shard-size", args.shard_size, args.shard_size >= 1, ">= 1"),
              ("--batch-size", args.batch_size, args.batch_size >= 1, ">= 1"),
              ("--workers", args.workers, 0 <= args.workers <= WORKERS_LIMIT, f"0..{WORKERS_LIMIT}")]
    for flag, value, ok, want in checks:
        if not ok:
            raise ValueError(f"{flag} {value}: expected {want}")


def run(args: argparse.Namespace) -> dict:
    import torch
    from accelerate import PartialState

    from mutor2d import io
    from mutor2d.tokenizer.base import build_tokenizer
    from mutor2d.tokenizer.extract import extract
    state = PartialState(cpu=not torch.cuda.is_available())  # cpu: gloo when launched on CPUs
    tokenizer = build_tokenizer(args.tokenizer, image_size=args.image_size).to(state.device)
    with io.exit_on_write_error(f"codes folder {args.out}"):
        return extract(args.images, args.out, tokenizer, num_crops=args.crops, flip=args.flip,
                       crop_range=args.crop_range, shard_size=args.shard_size, batch_size=args.batch_size,
                       num_workers=args.workers, max_shards=args.max_shards, state=state,
                       progress=not args.no_progress)


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
        load_plugins()
        return run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
