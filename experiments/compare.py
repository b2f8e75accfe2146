"""Digits study: next-token vs MuToR (1D, 2D dense/sparse) vs the multi-head baseline, trained,
sampled and scored through the library (mutor2d.evaluation.study holds the logic; this is its
command line).

    python experiments/compare.py --out runs/study_digits [--methods next-token,mutor-2d-D4,...]
        [--seeds 0,1,2] [--steps 600] [--eval-steps 300,600] [--num 1000] [--cfg 1.0,2.0]
        [--jobs 2] [--compute-matched mutor-2d-D4] [--plot docs/digits_fid_vs_step.png]
    python experiments/compare.py --config study2_digits.yaml --val-every 150 --fractions 0.25,0.5 \
        --cm-ratio R ...                              # the second protocol (docs/RESULTS.md)
    python experiments/compare.py --quick --out /tmp/q      # CI: the whole pipeline, tiny sizes

For each method and seed: train ``--config`` (default configs/study_digits.yaml) with the method's
objective (RUN = OUT/METHOD/seedS), then at each eval step: class-balanced samples at each CFG scale
(RUN/samples/eval_stepXXXXXXXX_cfgS.npz), the embedded FID/IS/precision/recall and class accuracy
against digits:train, and the teacher-forced next-token NLL of the digits test split (NTP head, nats
per token; EMA weights when the config keeps them); one record per (step, cfg) in RUN/eval/
(eval/leaderboard.py reads them).
Selection (``--val-every N``, needs data.val_fraction > 0): the validation NLL of every N-th
checkpoint (RUN/val_nll.json); the lowest one's step is sampled and scored too, and the table's
"val-best" row holds each seed's record at its selected step. Never selected on test.
Data fractions (``--fractions 0.25,0.5``): the ``--fraction-methods`` also train on those nested
shares of the training images (RUN = OUT/METHOD@F/seedS); OUT/fraction.png plots the best
validation NLL, the test NLL and FID at the selected step against the share.
Compute-matched point: next-token trained for ``steps x t(method)/t(next-token)`` steps, t = median
measured training seconds per step (from RUN/log.jsonl) of the runs above, or ``--cm-ratio`` (to add
seeds later at the step an earlier invocation measured: the measured ratio depends on machine load).
Under a constant lr that is a checkpoint of the next-token runs (they train on to ``--cm-max`` x
steps); under a decaying lr it is a run of its own (OUT/next-token-cm/seedS) and needs ``--cm-ratio``.
Floor: real held-out images (digits:test) against the same reference, as is and resampled to ``--num``.
Runs train seed by seed: the fraction methods at full data, their fraction runs, the other methods,
the compute-matched runs. Outputs: OUT/table.md (mean ± sd over seeds), OUT/summary.json, the plots.
Rerunning resumes: finished trainings, curves, sample files and records are kept. Stopping: Ctrl-C,
SIGTERM or killing the driver stops every job at its next step after a checkpoint (exit 75); no job
trains on alone or starts a queued run.
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
from mutor2d.evaluation import plan
from mutor2d.evaluation.options import DEFAULT_CACHE
from mutor2d.plugins import load_plugins

# --quick: the first protocol's config with the second's parts switched on (validation split, EMA,
# selection, a data fraction) at CI sizes
QUICK = dict(methods="next-token,mutor-2d-sparse", seeds="0", steps=4, eval_steps="4", num=20, cfg="1.0,2.0",
             jobs=1, floor_draws=1, compute_matched="mutor-2d-sparse", val_every=2, fractions="0.5",
             fraction_methods="next-token",
             overrides=["model.dim=32", "train.batch_size=8", "optim.warmup_steps=1", "train.log_every=1",
                        "data.val_fraction=0.2", "train.ema=true", "train.ema_decay=0.5"])


def parse_list(text: str, kind, name: str) -> list:
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise plan.StudyError(f"--{name} {text!r}: expected comma-separated {kind.__name__} values") from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--out", required=True, help="study folder (runs go to OUT/METHOD/seedS)")
    ap.add_argument("--config", default=plan.BASE_CONFIG, help="base config, YAML path or name under configs/")
    ap.add_argument("--methods", default="next-token,mutor-2d-D4,mutor-2d-sparse",
                    help=f"comma-separated, of {','.join(plan.METHODS)}")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds of every method")
    ap.add_argument("--steps", type=int, default=500, help="training steps of every run")
    ap.add_argument("--eval-steps", default="250,500", help="checkpoints to evaluate, at most --steps (their gcd divides --steps)")
    ap.add_argument("--num", type=int, default=1000, help="class-balanced samples per evaluation")
    ap.add_argument("--cfg", default="1.0,2.0", help="CFG scales to sample at")
    ap.add_argument("--jobs", type=int, default=2, help="processes at a time (one CPU thread each)")
    ap.add_argument("--compute-matched", default="mutor-2d-D4",
                    help="train next-token for this method's measured wall time ('' = skip)")
    ap.add_argument("--cm-max", type=float, default=2.0,
                    help="next-token runs train to this multiple of --steps (the compute-matched point's limit)")
    ap.add_argument("--cm-ratio", type=float, default=None,
                    help="use this cost ratio (method step / next-token step) instead of the one measured in "
                         "this invocation: to add seeds to an earlier study at its compute-matched step")
    ap.add_argument("--val-every", type=int, default=0,
                    help="score the validation NLL of every N-th checkpoint and also evaluate the lowest one's "
                         "step (needs data.val_fraction > 0; 0 = off)")
    ap.add_argument("--fractions", default="", help="shares of the training images in (0, 1) that "
                    "--fraction-methods also train on (e.g. 0.25,0.5; '' = none)")
    ap.add_argument("--fraction-methods", default="next-token,mutor-2d-D4", help="methods of the --fractions runs")
    ap.add_argument("--fraction-plot", default=None, help="PNG path (default OUT/fraction.png)")
    ap.add_argument("--ntp-eval-steps", default="", help="next-token also trains to the last of these and is "
                    "scored at them (e.g. 1600,1800,2000 for 2T; '' = none)")
    ap.add_argument("--speedup", default="", help="the pre-registered test of this method at T = --steps against "
                    "next-token at 2T (mutor2d/evaluation/speedup.py; '' = off)")
    ap.add_argument("--device", default="cpu", help="where the runs sample and score: cpu or cuda (training "
                    "uses the engine's accelerator: CUDA when there is one)")
    ap.add_argument("--floor-draws", type=int, default=5, help="resamples of the held-out floor")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override the base config for every run (e.g. model.dim=32)")
    ap.add_argument("--plot", default=None, help="PNG path (default OUT/fid_vs_step.png)")
    ap.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="digits classifier / feature cache")
    ap.add_argument("--report-only", action="store_true",
                    help="only rebuild the table and plot from the records already in OUT")
    ap.add_argument("--quick", action="store_true", help="CI: 2 methods (+ a data fraction), 1 seed, 4 steps, "
                    "20 samples, validation split and selection")
    return ap


def settings(args: argparse.Namespace) -> plan.Study:
    """The parsed flags as study settings (--quick: the CI sizes)."""
    if not args.out.strip():
        raise plan.StudyError("--out '': expected a study folder")
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v if k != "overrides" else v + args.overrides)
    return plan.Study(
        out=Path(args.out), methods=parse_list(args.methods, str, "methods"), seeds=parse_list(args.seeds, int, "seeds"),
        steps=args.steps, eval_steps=parse_list(args.eval_steps, int, "eval-steps"), num=args.num,
        cfg_scales=parse_list(args.cfg, float, "cfg"), jobs=args.jobs, compute_matched=args.compute_matched,
        cm_max=args.cm_max, cm_ratio=args.cm_ratio, floor_draws=args.floor_draws, overrides=args.overrides,
        plot=Path(args.plot) if args.plot else None, cache=Path(args.cache_dir).expanduser(),
        report_only=args.report_only, base=args.config, val_every=args.val_every,
        fractions=parse_list(args.fractions, float, "fractions"),
        fraction_methods=parse_list(args.fraction_methods, str, "fraction-methods"),
        fraction_plot=Path(args.fraction_plot) if args.fraction_plot else None,
        ntp_eval_steps=parse_list(args.ntp_eval_steps, int, "ntp-eval-steps"), speedup=args.speedup,
        device=args.device)


def main(argv=None) -> dict:
    """Run the study of the flags (checked before torch is imported) and print its table."""
    load_plugins()
    args = build_parser().parse_args(argv)
    study = settings(args)
    study.check_flags()
    from mutor2d.evaluation.study import run_study
    summary = run_study(study)
    summary["settings"] = dict(vars(args))
    out = Path(args.out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(summary["table"])
    print(f"table: {out / 'table.md'}\nplot: {summary['plot']}", flush=True)
    if "fraction_plot" in summary:
        print(f"fraction plot: {summary['fraction_plot']}", flush=True)
    return summary


if __name__ == "__main__":
    run_entry(main)
