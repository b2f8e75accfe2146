"""FID / IS / precision / recall / KID of samples against a reference, through torch-fidelity.

    python eval/fid.py SAMPLES --ref REF [--features inception|digits|photos] [--inception-weights PATH]
                       [--metrics fid,is,prc,kid] [--json OUT] [--method NAME] [--device auto|cpu|cuda]

SAMPLES: a sample.py --npz file, any npz of uint8 images (images / arr_0), or an image folder.
REF: an image folder, an npz of images, an ADM reference batch (arr_0 and/or mu, sigma: FID then uses
the stored mu/sigma; precision/recall and KID need arr_0), digits:train / digits:test, or
photos:train / photos:test (the photo crops, mutor2d.data.photos). --features defaults to the
classifier trained here for those (digits, photos), else inception.
The record goes to --json OUT, else to RUN/eval/ when the samples' metadata names a run, else stdout.
No input is unpickled: --inception-weights must be a plain state dict (read with weights_only=True).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

from mutor2d.cli import HelpFormatter          # the command line parses and checks before torch is imported
from mutor2d.engine.entry import run_entry
from mutor2d.evaluation import records
from mutor2d.evaluation.options import DEFAULT_CACHE, DIGITS_DATA_SEED, EMBEDDED, FEATURES, METRICS, MetricsError
from mutor2d.io import exit_on_write_error, read_safetensors
from mutor2d.plugins import load_plugins


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter, epilog=__doc__)
    ap.add_argument("samples", help="sample npz or image folder")
    ap.add_argument("--ref", required=True, help="reference: folder, npz (images and/or mu/sigma), digits:SPLIT, photos:SPLIT")
    ap.add_argument("--features", choices=sorted(FEATURES), default=None,
                    help="feature extractor (default: digits / photos for digits:* / photos:* references, "
                         "else inception)")
    ap.add_argument("--inception-weights", default=None,
                    help="torch-fidelity Inception weights file (pt_inception-2015-12-05); default: download")
    ap.add_argument("--metrics", default=",".join(METRICS),
                    help=f"comma-separated subset of {','.join(METRICS)} (prc = precision/recall)")
    ap.add_argument("--json", default=None, help="write the record here, a .json file or a folder (default: RUN/eval/ "
                                                 "of the run the samples' metadata names, else stdout)")
    ap.add_argument("--method", default=None, help="method name for the record (default: the run's objective)")
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    ap.add_argument("--batch-size", type=int, default=64, help="images per feature-extractor forward")
    ap.add_argument("--cache-dir", default=str(DEFAULT_CACHE),
                    help="digits classifier and reference-feature cache (default: %(default)s)")
    ap.add_argument("--no-cache", action="store_true", help="do not cache reference features")
    ap.add_argument("--quiet", action="store_true", help="no torch-fidelity progress output")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def feature_name(args) -> str:
    """--features, else digits for a digits:* reference and inception for any other."""
    return args.features or next((k for k in EMBEDDED if args.ref.startswith(f"{k}:")), "inception")


def check_args(args) -> list[str]:
    """The metrics --metrics names; one-line MetricsErrors for flags that are bad without reading an
    image (before torch is imported)."""
    if args.inception_weights and feature_name(args) != "inception":
        raise MetricsError(f"--inception-weights is for --features inception, not {feature_name(args)!r}")
    if args.batch_size < 1:
        raise MetricsError(f"--batch-size: expected >= 1, got {args.batch_size}")
    if args.inception_weights and args.inception_weights.endswith(".safetensors"):   # torch.load reads these
        read_safetensors(args.inception_weights, "--inception-weights", tensors=False)
    if args.json is not None and not args.json.strip():
        raise MetricsError(f"--json {args.json!r}: expected a .json path or a folder (leave it out for RUN/eval/)")
    out = Path(args.json or ".")
    if out.suffix != ".json" and out.exists() and not out.is_dir():
        raise MetricsError(f"--json {args.json!r}: is a file without the .json suffix; expected a .json path or "
                           "a folder")
    if Path(args.cache_dir).expanduser().is_file():
        raise MetricsError(f"--cache-dir {args.cache_dir!r}: is a file; expected a folder")
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    if not metrics:
        raise MetricsError(f"--metrics {args.metrics!r}: expected a comma-separated subset of {','.join(METRICS)}")
    return metrics


def score(args, metrics: list[str]) -> tuple:
    """(result, samples, reference) of the parsed flags and ``metrics`` (``check_args``)."""
    from mutor2d.evaluation import metrics as M
    from mutor2d.evaluation.sources import open_images
    features = feature_name(args)
    samples = open_images(args.samples)
    data_seed = ((samples.meta.get("config") or {}).get("data") or {}).get("data_seed", DIGITS_DATA_SEED)
    reference = open_images(args.ref, data_seed)
    M.check_comparable(samples, reference)          # what the user paired; before a classifier is loaded
    cache = Path(args.cache_dir).expanduser()
    weights = (M.embedded_weights(features, data_seed, cache) if features in EMBEDDED
               else args.inception_weights)
    result = M.compute_metrics(samples, reference, features=features, weights_path=weights, metrics=metrics,
                               device=args.device, batch_size=args.batch_size, cache_root=cache / "fidelity_cache",
                               use_cache=not args.no_cache, verbose=not args.quiet)
    return result, samples, reference


def record_place(args, samples):
    """--json, else RUN/eval/ of the run the samples' metadata names, else None (stdout)."""
    if args.json is not None:
        return args.json
    run = records.run_dir_from_meta(samples.meta)
    if run is not None and not run.is_dir():
        raise MetricsError(f"the samples' metadata names run folder {str(run)!r}, which does not exist here; "
                           "pass --json OUT")
    return None if run is None else run / "eval"


def main(argv=None) -> dict:
    load_plugins()
    args = parse_args(argv)
    result, samples, reference = score(args, check_args(args))
    record = records.make_record(result, samples=samples, reference=reference, method=args.method,
                                 samples_path=args.samples)
    for k, v in result.metrics.items():
        print(f"{k:>10}: {v:.6g}")
    for k, why in result.skipped.items():
        print(f"{k:>10}: skipped ({why})")
    out = record_place(args, samples)
    if out is None:
        print(json.dumps(record, indent=2))
    else:
        with exit_on_write_error(str(out)):
            print(f"record: {records.write_record(record, out)}")
    return record


if __name__ == "__main__":
    run_entry(main)
