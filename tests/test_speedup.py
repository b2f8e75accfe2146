"""The pre-registered convergence test (mutor2d.evaluation.speedup): the primary statistic and its decision
rule by hand, the interpolated convergence ratio and next-token's self-ratio, the power calculation against
a textbook value, and the study settings it needs (next-token trained to 2T and scored in its window)."""
import math
import statistics

import pytest

from mutor2d.evaluation import plan, speedup


def curve_groups(ntp: dict, method: dict, label: str = "mutor-2d-D4") -> dict:
    """groups as study_tables.summarise makes them: {(label, step): {"by_seed": {1.0: {"fid": {seed: v}}}}}."""
    out = {}
    for name, table in (("next-token", ntp), (label, method)):
        for step, fids in table.items():
            out[(name, step)] = {"by_seed": {1.0: {"fid": dict(enumerate(fids))}}}
    return out


def test_window_steps_are_the_protocol():
    assert speedup.method_steps(1000) == [800, 900, 1000]
    assert speedup.reference_steps(1000) == [1600, 1800, 2000]


def test_primary_statistic_and_decision_by_hand():
    ntp = {1600: [20.0, 30.0, 25.0], 1800: [18.0, 28.0, 24.0], 2000: [17.0, 27.0, 23.0]}
    mine = {800: [16.0, 26.0, 22.0], 900: [15.0, 27.0, 21.0], 1000: [15.0, 25.0, 20.0]}
    test = speedup.speedup_test(curve_groups(ntp, mine), 1.0, "mutor-2d-D4", 1000)
    by_hand = [statistics.fmean(math.log(mine[s][i]) for s in mine) - statistics.fmean(math.log(ntp[s][i]) for s in ntp)
               for i in range(3)]
    assert test["per_seed"] == pytest.approx(dict(enumerate(by_hand)))
    half = 4.302653 * statistics.stdev(by_hand) / 3 ** 0.5
    assert test["mean"] == pytest.approx(statistics.fmean(by_hand))
    assert (test["lo"], test["hi"]) == pytest.approx((test["mean"] - half, test["mean"] + half), rel=1e-5)
    assert test["verdict"] == ("confirmed" if test["mean"] <= 0 and test["hi"] < 0.05 else
                               "refuted" if test["lo"] > 0 else "not decided")
    assert test["reference_gain"] is None                       # next-token not scored at 0.8T..T here
    ntp.update({800: [30.0, 40.0, 35.0], 900: [28.0, 38.0, 33.0], 1000: [26.0, 36.0, 31.0]})
    gain = speedup.speedup_test(curve_groups(ntp, mine), 1.0, "mutor-2d-D4", 1000)["reference_gain"]
    assert gain["mean"] == pytest.approx(statistics.fmean(
        statistics.fmean(math.log(ntp[s][i]) for s in (800, 900, 1000)) -
        statistics.fmean(math.log(ntp[s][i]) for s in (1600, 1800, 2000)) for i in range(3)))
    assert "own gain from T to 2T" in speedup.report(speedup.speedup_test(curve_groups(ntp, mine), 1.0,
                                                                          "mutor-2d-D4", 1000), {})
    assert speedup.decide([-0.10, -0.12, -0.11, -0.09])["verdict"] == "confirmed"
    assert speedup.decide([0.10, 0.12, 0.11, 0.09])["verdict"] == "refuted"
    assert speedup.decide([-0.3, 0.3, -0.2, 0.25])["verdict"] == "not decided"
    assert speedup.decide([-0.02, 0.02, -0.01, 0.03])["verdict"] == "not decided"    # mean > 0, bound holds 0
    assert speedup.decide([-0.10, 0.08, -0.06, 0.05])["verdict"] == "not decided"    # mean <= 0, upper bound >= 0.05
    assert speedup.decide([-0.04, 0.02, -0.03, 0.01])["verdict"] == "confirmed"      # mean <= 0, upper bound 0.035
    assert speedup.decide([-0.2])["verdict"] == "not decided"                         # one seed decides nothing


def test_crossing_interpolates_and_says_never():
    curve = [(100, 3.0), (200, 2.0), (300, 1.5)]
    assert speedup.crossing(curve, 2.5) == pytest.approx(150)
    assert speedup.crossing(curve, 3.5) == 100                      # at or below from the start
    assert speedup.crossing(curve, 1.5) == 300
    assert speedup.crossing(curve, 1.0) is None


def test_convergence_ratio_and_self_ratio():
    # next-token's log-FID falls linearly with step; the method is at next-token's step-1800 level at 0.9T.
    steps = [800, 900, 1000, 1200, 1400, 1600, 1800, 2000]
    level = {s: math.exp(4 - s / 1000) for s in steps}
    ntp = {s: [level[s]] * 3 for s in steps}
    mine = {s: [level[1800]] * 3 for s in (800, 900, 1000)}
    r = speedup.convergence_ratio(curve_groups(ntp, mine), 1.0, "mutor-2d-D4", 1000, draws=50)
    assert r["ratio"] == pytest.approx(900 / 1800) and r["ratio_ci"] == pytest.approx((0.5, 0.5))
    assert r["self_ratio"] == pytest.approx(1.0)                    # the rule reads a clean curve without bias
    never = {s: [math.exp(4 - 3.0)] * 3 for s in (800, 900, 1000)}   # below anything next-token reaches
    assert speedup.convergence_ratio(curve_groups(ntp, never), 1.0, "mutor-2d-D4", 1000, draws=10)["ratio"] == \
        pytest.approx(900 / 2000)                                   # an upper bound: its last scored step


def test_power_matches_the_textbook_paired_t_test():
    # effect size gap / sd = 1 at alpha 0.05 two-sided, power 0.8: 10 pairs (Cohen's tables)
    assert speedup.seeds_needed(sd=0.163, gap=0.163) == 10
    assert speedup.seeds_needed(sd=0.0815, gap=0.163) < 10 < speedup.seeds_needed(sd=0.326, gap=0.163)
    gap = speedup.resolvable_gap(0.163, 10)
    assert gap <= 0.163 and speedup.seeds_needed(0.163, gap=gap) == 10


def test_the_study_settings_of_the_test(tmp_path):
    s = plan.Study(out=tmp_path, methods=["next-token", "mutor-2d-D4"], seeds=[0], steps=1000,
                   eval_steps=[400, 800, 900, 1000], num=10, cfg_scales=[1.0],
                   ntp_eval_steps=[1200, 1600, 1800, 2000], speedup="mutor-2d-D4")
    s.check_flags()
    ntp, mine = s.units()
    assert ntp["steps"] == 2000 and ntp["eval_steps"] == [400, 800, 900, 1000, 1200, 1600, 1800, 2000]
    assert 2000 % ntp["ckpt_every"] == 0 and all(e % ntp["ckpt_every"] == 0 for e in ntp["eval_steps"])
    assert mine["steps"] == 1000 and mine["eval_steps"] == [400, 800, 900, 1000]
    with pytest.raises(plan.StudyError, match="--ntp-eval-steps 1200,1600,2000: --speedup needs steps 1600,1800,2000"):
        plan.Study(**{**vars(s), "ntp_eval_steps": [1200, 1600, 2000]}).check_flags()
    with pytest.raises(plan.StudyError, match="--eval-steps 1000: --speedup needs steps 800,900,1000"):
        plan.Study(**{**vars(s), "eval_steps": [1000]}).check_flags()
    with pytest.raises(plan.StudyError, match="--speedup 'mutor-1d'"):
        plan.Study(**{**vars(s), "speedup": "mutor-1d"}).check_flags()
    with pytest.raises(plan.StudyError, match="--ntp-eval-steps"):
        plan.Study(**{**vars(s), "methods": ["mutor-2d-D4"], "speedup": ""}).check_flags()
