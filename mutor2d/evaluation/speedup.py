"""The pre-registered convergence test (docs/RESULTS.md): per seed, D = mean log-FID of METHOD at
{0.8T, 0.9T, T} minus next-token's at {1.6T, 1.8T, 2T}; on D's mean and 95 % t-interval [lo, hi]:
confirmed if mean <= 0 and hi < +MARGIN, refuted if lo > 0, else not decided. Secondary: the
interpolated convergence ratio with a seed bootstrap; power of a paired t-test. No torch here."""
from __future__ import annotations

import math
import random
import statistics

from .plan import WINDOW, method_steps, reference_steps
from .records import markdown
from .study_tables import step_values, t95

MARGIN = 0.05              # confirmed needs the upper bound below +0.05 (5 % in FID)
GAP = 0.163                # the gap the study is sized for: 15 % in FID, log(1 / 0.85)


def window_log_fid(groups: dict, label: str, steps: list[int], cfg: float) -> dict:
    """{seed: mean log-FID of ``label`` over ``steps``} for the seeds scored at all of them."""
    per_step = [groups.get((label, s), {}).get("by_seed", {}).get(cfg, {}).get("fid", {}) for s in steps]
    seeds = set.intersection(*(set(p) for p in per_step)) if per_step else set()
    return {seed: statistics.fmean(math.log(p[seed]) for p in per_step) for seed in seeds}


def decide(diffs: list[float]) -> dict:
    """The decision rule on per-seed D values: {"n", "mean", "lo", "hi", "sd", "verdict"}."""
    m, h = t95(diffs)
    lo, hi = m - h, m + h
    verdict = ("not decided" if len(diffs) < 2 else "confirmed" if m <= 0 and hi < MARGIN else
               "refuted" if lo > 0 else "not decided")
    sd = statistics.stdev(diffs) if len(diffs) > 1 else float("nan")
    return {"n": len(diffs), "mean": m, "lo": lo, "hi": hi, "sd": sd, "verdict": verdict}


def speedup_test(groups: dict, cfg: float, method: str, T: int, reference: str = "next-token") -> dict:
    """The primary statistic, its decision, each seed's D and next-token's own gain from T to 2T."""
    mine = window_log_fid(groups, method, method_steps(T), cfg)
    ref = window_log_fid(groups, reference, reference_steps(T), cfg)
    early = window_log_fid(groups, reference, method_steps(T), cfg)
    per_seed = {seed: mine[seed] - ref[seed] for seed in sorted(mine, key=str) if seed in ref}
    gain = [early[seed] - ref[seed] for seed in sorted(early, key=str) if seed in ref]
    return {"method": method, "reference": reference, "T": T, "cfg": cfg, "per_seed": per_seed,
            **decide(list(per_seed.values())),
            "reference_gain": {k: v for k, v in decide(gain).items() if k != "verdict"} if gain else None}


def crossing(curve: list[tuple[int, float]], level: float) -> float | None:
    """The first step a piecewise-linear curve [(step, value)] is at or below ``level``, else None."""
    for (s0, v0), (s1, v1) in zip([(None, None)] + curve[:-1], curve):
        if v1 <= level:
            return s1 if s0 is None or v0 == v1 else s0 + (s1 - s0) * (v0 - level) / (v0 - v1)
    return None


def _ratios(groups: dict, cfg: float, method: str, T: int, reference: str, seeds: list) -> tuple[float, float]:
    """(method's ratio, reference's self-ratio) over the given seeds (repeats allowed)."""
    fids = step_values(groups, reference, cfg, "fid")
    curve = [(s, statistics.fmean(math.log(fids[s][seed]) for seed in seeds))
             for s in sorted(fids) if all(seed in fids[s] for seed in seeds)]
    centre, ratios = WINDOW[1] * T, []
    for label in (method, reference):
        late = window_log_fid(groups, label, method_steps(T), cfg)
        step = crossing(curve, statistics.fmean(late[s] for s in seeds))
        ratios.append(centre / (step if step is not None else curve[-1][0]))   # never reached: at most this
    return ratios[0], ratios[1]


def convergence_ratio(groups: dict, cfg: float, method: str, T: int, reference: str = "next-token",
                      draws: int = 2000, seed: int = 0) -> dict:
    """Convergence ratio (0.9T over the step next-token's curve reaches the method's late level) and
    next-token's self-ratio, each with a 95 % seed-bootstrap percentile interval."""
    seeds = sorted(set(window_log_fid(groups, method, method_steps(T), cfg))
                   & set(window_log_fid(groups, reference, method_steps(T), cfg)), key=str)
    if not seeds:
        return {}
    ratio, self_ratio = _ratios(groups, cfg, method, T, reference, seeds)
    rng = random.Random(seed)
    boot = sorted(_ratios(groups, cfg, method, T, reference, rng.choices(seeds, k=len(seeds))) for _ in range(draws))
    mine, own = sorted(b[0] for b in boot), sorted(b[1] for b in boot)
    q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))]          # noqa: E731  (a percentile)
    return {"method": method, "seeds": len(seeds), "ratio": ratio, "ratio_ci": (q(mine, 0.025), q(mine, 0.975)),
            "self_ratio": self_ratio, "self_ratio_ci": (q(own, 0.025), q(own, 0.975)), "draws": draws}


def _power(gap: float, sd: float, n: int, alpha: float = 0.05) -> float:
    from scipy.stats import nct, t
    df, nc = n - 1, gap * math.sqrt(n) / sd
    crit = t.ppf(1 - alpha / 2, df)
    wrong_side = nct.cdf(-crit, df, nc)                    # nan far out in the tail, where it is 0
    return float(nct.sf(crit, df, nc) + (0.0 if math.isnan(wrong_side) else wrong_side))


def seeds_needed(sd: float, gap: float = GAP, power: float = 0.8, most: int = 200) -> int | None:
    """The fewest seeds (2..most) for a paired t-test on D (sd ``sd``) to detect ``gap`` with ``power``."""

    return next((n for n in range(2, most + 1) if _power(gap, sd, n) >= power), None)


def resolvable_gap(sd: float, n: int, power: float = 0.8) -> float:
    """The smallest log-FID gap ``n`` seeds detect with probability ``power`` (bisection)."""
    lo, hi = 0.0, 20 * sd
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _power(mid, sd, n) >= power else (mid, hi)
    return hi


def report(test: dict, ratio: dict) -> str:
    """Markdown: the primary statistic with its verdict, each seed's D, then the secondary ratio."""
    T, m = test["T"], test["method"]
    lines = [f"**Primary statistic** ({m} at {', '.join(map(str, method_steps(T)))} vs {test['reference']} at "
             f"{', '.join(map(str, reference_steps(T)))}; cfg {test['cfg']:g}; {test['n']} seeds): D = "
             f"{test['mean']:+.3f} [{test['lo']:+.3f}, {test['hi']:+.3f}] (sd {test['sd']:.3f}) -> "
             f"**{test['verdict']}** (confirmed if D <= 0 and its upper bound < +{MARGIN}; refuted if its lower "
             "bound > 0)", "",
             markdown(["seed", "D (log-FID)"], [[str(s), f"{d:+.3f}"] for s, d in test["per_seed"].items()])]
    if g := test["reference_gain"]:
        lines += ["", f"{test['reference']}'s own gain from T to 2T (its window at T minus its window at 2T, "
                  f"log-FID): {g['mean']:+.3f} [{g['lo']:+.3f}, {g['hi']:+.3f}] over {g['n']} seeds"]
    if ratio:
        lines += ["", f"Secondary: convergence ratio {ratio['ratio']:.2f} [{ratio['ratio_ci'][0]:.2f}, "
                  f"{ratio['ratio_ci'][1]:.2f}]; {test['reference']}'s self-ratio {ratio['self_ratio']:.2f} "
                  f"[{ratio['self_ratio_ci'][0]:.2f}, {ratio['self_ratio_ci'][1]:.2f}] (seed bootstrap, "
                  f"{ratio['draws']} draws; 0.5 = twice as fast)"]
    return "\n".join(lines)
