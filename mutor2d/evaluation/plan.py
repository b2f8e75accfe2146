"""The settings of a digits study (experiments/compare.py's flags): the methods, run labels, each run's config
and the checks of a :class:`Study`. Light (no torch): experiments/compare.py checks its flags with
``Study.check_flags`` before importing torch; mutor2d.evaluation.study runs a study.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from .. import config as config_lib
from ..checks import WORKERS_LIMIT
from ..config_files import parse_override
from .options import DEFAULT_CACHE

WINDOW = (0.8, 0.9, 1.0)   # the convergence test's late window (mutor2d.evaluation.speedup), fractions of T


def method_steps(T: int) -> list[int]:
    """The method's scored steps of the convergence test's primary statistic: 0.8T, 0.9T, T."""
    return [round(f * T) for f in WINDOW]


def reference_steps(T: int) -> list[int]:
    """Next-token's: 1.6T, 1.8T, 2T."""
    return [round(2 * f * T) for f in WINDOW]


STEPS_LIMIT = 10 ** 7    # training steps of a study's runs (10**12 trained for ever)

BASE_CONFIG = "study_digits.yaml"
# method -> its objective section (fields of an ObjectiveConfig variant), set on the base config
METHODS = {
    "next-token": {"name": "ntp"},
    "mutor-1d": {"name": "mutor-1d", "d_min": 2, "d_max": 4},
    "mutor-2d-D3": {"name": "mutor-2d", "d_max": 3},
    "mutor-2d-D4": {"name": "mutor-2d", "d_max": 4},
    "mutor-2d-sparse": {"name": "mutor-2d", "d_max": 4, "placement": "sparse",
                        "num_registers": 19},  # 19 of 64 anchors ~ 30% (paper: 80 of 256)
    "mutor-1d-d1": {"name": "mutor-1d", "d_min": 1, "d_max": 4},   # the photos configs' (and the paper's) 1..4
    "mutor-2d-sparse80": {"name": "mutor-2d", "d_max": 4, "placement": "sparse", "num_registers": 80,
                          "edge": "geometric"},                    # the paper's 80 of 256 (16 x 16 grids)
    "multihead": {"name": "multihead", "layout": "2d", "d_max": 4},
    # the open questions as settings (docs/METHOD.md): D4 with one setting changed
    "mutor-2d-D4-earlier": {"name": "mutor-2d", "d_max": 4, "register_visibility": "earlier_registers"},
    "mutor-2d-D4-valid-anchors": {"name": "mutor-2d", "d_max": 4, "offset_distribution": "valid-anchors"},
    "mutor-2d-D4-linear": {"name": "mutor-2d", "d_max": 4, "reg_weight_schedule": "linear", "reg_weight_final": 0.0},
    "mutor-2d-D4-distill": {"name": "mutor-2d", "d_max": 4, "reg_target": "self_distill"},
}
COMPUTE_MATCHED = "next-token-cm"   # label of the compute-matched next-token runs


class StudyError(ValueError):
    """Bad study settings; one-line message."""


def fraction_label(method: str, fraction: float) -> str:
    """The label of ``method`` trained on a share ``fraction`` of the training images: METHOD@F."""
    return f"{method}@{fraction:g}"


def label_parts(label: str) -> tuple[str, float]:
    """(method, data fraction) of a label: METHOD@F, or a method (fraction 1)."""
    method, _, frac = label.partition("@")
    return method, float(frac) if frac else 1.0


def run_config(method: str, seed: int, steps: int, ckpt_every: int, overrides: list[str], base: str = BASE_CONFIG):
    if method not in METHODS and method != COMPUTE_MATCHED:
        raise StudyError(f"method {method!r}: expected one of {sorted(METHODS)}")
    objective = METHODS["next-token" if method == COMPUTE_MATCHED else method]
    return config_lib.load(base, [f"objective.{k}={v}" for k, v in objective.items()] + list(overrides) + [
        f"train.seed={seed}", f"train.max_steps={steps}", f"train.ckpt_every={ckpt_every}", "train.keep_ckpts=0"])


@dataclass
class Study:
    """The settings of a study (experiments/compare.py's flags; see its --help)."""
    out: Path
    methods: list[str]
    seeds: list[int]
    steps: int
    eval_steps: list[int]
    num: int
    cfg_scales: list[float]
    jobs: int = 1
    compute_matched: str = ""
    cm_max: float = 2.0
    cm_ratio: float | None = None
    floor_draws: int = 5
    overrides: list[str] = field(default_factory=list)
    plot: Path | None = None
    cache: Path = DEFAULT_CACHE
    report_only: bool = False
    base: str = BASE_CONFIG
    val_every: int = 0
    fractions: list[float] = field(default_factory=list)
    fraction_methods: list[str] = field(default_factory=list)
    fraction_plot: Path | None = None
    ntp_eval_steps: list[int] = field(default_factory=list)
    speedup: str = ""
    device: str = "cpu"          # where the runs sample and score (training: the engine's accelerator)

    def config(self, method: str = "next-token"):
        """The base config with the study's overrides, as ``method`` trains it."""
        return run_config(method, 0, self.steps, self.every, self.overrides, self.base)

    def check_flags(self) -> None:
        """One-line errors for settings that are bad without reading a config or data (no torch)."""
        if self.out.is_file():
            raise StudyError(f"--out {str(self.out)!r}: expected a study folder")
        if not self.seeds:
            raise StudyError("--seeds '': expected comma-separated training seeds")
        if not 1 <= self.steps <= STEPS_LIMIT:
            raise StudyError(f"--steps {self.steps}: expected 1..{STEPS_LIMIT}")
        if not 1 <= self.jobs <= WORKERS_LIMIT:
            raise StudyError(f"--jobs {self.jobs}: expected 1..{WORKERS_LIMIT}")
        bad = [c for c in self.cfg_scales if not math.isfinite(c) or c < 0]
        if bad or not self.cfg_scales:
            raise StudyError(f"--cfg {bad[0] if bad else ''!r}: expected comma-separated finite scales >= 0")
        for flag, value in (("--cm-max", self.cm_max), ("--cm-ratio", self.cm_ratio)):
            if value is not None and not math.isfinite(value):
                raise StudyError(f"{flag} {value}: expected a finite number")
        if bad := [m for m in self.methods if m not in METHODS]:
            raise StudyError(f"--methods: {bad[0]!r} is not a method (expected some of {', '.join(METHODS)})")
        if (not self.eval_steps or any(not 1 <= s <= self.steps for s in self.eval_steps)
                or self.steps % math.gcd(*self.eval_steps)):
            raise StudyError(f"--eval-steps {','.join(map(str, self.eval_steps))}: expected steps in [1, --steps "
                             f"{self.steps}] on a checkpoint grid that ends at --steps (their gcd divides it)")
        if self.val_every < 0 or (self.val_every and self.steps % self.val_every):
            raise StudyError(f"--val-every {self.val_every}: expected 0 (off) or a divisor of --steps {self.steps}")
        if bad := [f for f in self.fractions if not 0 < f < 1]:
            raise StudyError(f"--fractions {bad[0]:g}: expected shares in (0, 1) (the --methods runs use all images)")
        bad = [m for m in self.fraction_methods if m not in self.methods]
        if self.fractions and (bad or not self.fraction_methods):
            raise StudyError(f"--fraction-methods {','.join(self.fraction_methods)!r}: expected some of --methods")
        cm = self.compute_matched
        if cm and cm not in self.methods:
            raise StudyError(f"--compute-matched {cm!r}: not among --methods")
        if cm and "next-token" not in self.methods:
            raise StudyError("--compute-matched needs next-token among --methods (its speed is the unit)")
        if self.cm_max < 1:
            raise StudyError(f"--cm-max {self.cm_max}: expected >= 1")
        if self.cm_ratio is not None and not self.cm_ratio >= 1:
            raise StudyError(f"--cm-ratio {self.cm_ratio}: expected >= 1 (a method step costs at least a "
                             "next-token step)")
        for item in self.overrides:
            parse_override(item)
        if self.ntp_eval_steps and ("next-token" not in self.methods or min(self.ntp_eval_steps) < 1
                                    or max(self.ntp_eval_steps) > STEPS_LIMIT):
            raise StudyError(f"--ntp-eval-steps {','.join(map(str, self.ntp_eval_steps))}: expected steps in "
                             f"[1, {STEPS_LIMIT}] with next-token among --methods")
        if self.speedup:
            self.check_speedup()
        if self.device not in ("cpu", "cuda"):
            raise StudyError(f"--device {self.device!r}: expected cpu or cuda")

    def check_speedup(self) -> None:
        """The pre-registered test (mutor2d.evaluation.speedup) needs its method at 0.8T, 0.9T, T and
        next-token at 1.6T, 1.8T, 2T (T = --steps), on a constant lr."""
        if self.speedup not in self.methods or "next-token" not in self.methods:
            raise StudyError(f"--speedup {self.speedup!r}: expected one of --methods, with next-token among them")
        for flag, have, need in (("--eval-steps", self.eval_steps, method_steps(self.steps)),
                                 ("--ntp-eval-steps", self.ntp_eval_steps, reference_steps(self.steps))):
            if not set(need) <= set(have):
                raise StudyError(f"{flag} {','.join(map(str, have))}: --speedup needs steps "
                                 f"{','.join(map(str, need))} (--steps {self.steps})")

    def check(self) -> None:
        """One-line errors for bad settings, before any training: ``check_flags``, then those that need
        the base config and its data."""
        self.check_flags()
        base = self.config()
        if self.val_every and getattr(base.data, "val_fraction", 0) == 0:
            raise StudyError(f"--val-every {self.val_every}: needs a validation split (data.val_fraction > 0 in "
                             f"{self.base} or --set)")
        from ..data.tokens import build_dataset
        classes = build_dataset(base.data, "train").num_classes
        if self.num < classes or self.num % classes:
            raise StudyError(f"--num {self.num}: expected a positive multiple of the {classes} classes")
        for m in self.methods:
            self.config(m)                                 # each method's config is valid
        if self.compute_matched and not self.constant and self.cm_ratio is None:
            raise StudyError(f"--compute-matched with optim.schedule={base.optim.schedule!r} needs --cm-ratio: the "
                             "compute-matched run decays to its own end, so its length is fixed before training")

    @property
    def constant(self) -> bool:
        """A constant learning rate: a run's early checkpoints are shorter runs (protocol 1)."""
        return self.config().optim.schedule == "constant"

    @property
    def every(self) -> int:
        """Checkpoint spacing of the method runs."""
        return math.gcd(*self.eval_steps, self.val_every)

    @property
    def grain(self) -> int:
        """Checkpoint spacing of the next-token runs (the compute-matched step is picked among them)."""
        return math.gcd(self.every, max(1, self.steps // 10), *self.ntp_eval_steps)

    @property
    def cm_limit(self) -> int:
        """The longest compute-matched run: cm_max x steps, on the grain."""
        return round(self.steps * self.cm_max / self.grain) * self.grain

    @property
    def ntp_steps(self) -> int:
        """Next-token runs go on to cm_limit under a constant lr (their early checkpoints are the
        equal-step points; with a decaying lr the compute-matched runs are runs of their own), and to the
        last of ``ntp_eval_steps``."""
        return max([self.cm_limit if self.compute_matched and self.constant else self.steps, *self.ntp_eval_steps])

    def cm_step(self, ratio: float) -> int:
        """The compute-matched next-token step: steps x ratio on the grain, within [steps, cm_limit]."""
        return min(self.cm_limit, max(self.steps, round(self.steps * ratio / self.grain) * self.grain))

    def unit(self, label: str, seed: int, steps: int, eval_steps: list[int], ckpt_every: int,
             horizon: int | None = None, run_dir: str | None = None) -> dict:
        """One run to train and evaluate; its step is selected on validation among checkpoints <= horizon."""
        method, frac = label_parts(label)
        more = [f"data.train_fraction={frac:g}"] if frac < 1 else []
        return dict(method="next-token" if label == COMPUTE_MATCHED else method, label=label, seed=seed, steps=steps,
                    ckpt_every=ckpt_every, eval_steps=eval_steps, horizon=horizon or steps, val_every=self.val_every,
                    run_dir=run_dir or str(self.out / label / f"seed{seed}"), cfg=self.cfg_scales, num=self.num,
                    overrides=self.overrides + more, cache=str(self.cache), base=self.base,
                    device=self.device)

    def units(self) -> list[dict]:
        """The runs in training order, seed by seed within each group, so that a partial study holds the
        most informative runs: the --fraction-methods at full data, their data-fraction runs, the other
        methods, and (decaying lr) the compute-matched next-token runs of their own."""
        first = [m for m in self.methods if m in self.fraction_methods and self.fractions]
        groups = [first, [fraction_label(m, f) for f in sorted(self.fractions, reverse=True) for m in first],
                  [m for m in self.methods if m not in first]]
        out = []
        for labels in groups:
            for s in self.seeds:
                for label in labels:
                    ntp = label == "next-token"
                    evals = sorted(set(self.eval_steps) | set(self.ntp_eval_steps)) if ntp else self.eval_steps
                    out.append(self.unit(label, s, self.ntp_steps if ntp else self.steps, evals,
                                         self.grain if ntp else self.every, horizon=self.steps))
        if self.compute_matched and not self.constant:
            out += self.cm_units(self.cm_step(self.cm_ratio))
        return out

    def cm_units(self, step: int) -> list[dict]:
        """The compute-matched next-token runs at ``step``: the next-token runs' checkpoint under a constant
        lr, else runs of their own (OUT/next-token-cm/seedS) that decay to ``step``."""
        if self.constant:
            return [self.unit(COMPUTE_MATCHED, s, self.ntp_steps, [step], self.grain, horizon=step,
                              run_dir=str(self.out / "next-token" / f"seed{s}")) for s in self.seeds]
        every = math.gcd(step, self.val_every or step)
        return [self.unit(COMPUTE_MATCHED, s, step, [step], every) for s in self.seeds]
