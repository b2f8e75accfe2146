"""The paired differences at equal compute: each register arm at step 250 minus next-token at step 325
(--cm-ratio 1.31, sparse MuToR-2D's), 475 (--cm-ratio 1.94, dense MuToR-2D's) and 500 (the driver's
cap), per seed, with a 95% t-interval. Run in the study
folder (runs/study_photos); its output is compute_matched_pairs.txt."""
import json
import math
import statistics

from scipy.stats import t


def rec(method, seed, step, cm=False):
    name = f"eval_{'cm_' if cm else ''}step{step:08d}_cfg1__photos-train__mutor2d-photos.json"
    return json.load(open(f"{method}/seed{seed}/eval/{name}"))["metrics"]


def ci(d, digits=2, better=-1):
    m, h = statistics.fmean(d), t.ppf(0.975, len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
    return (f"{m:+.{digits}f} [{m - h:+.{digits}f}, {m + h:+.{digits}f}] "
            f"wins/losses {sum(x * better > 0 for x in d)}/{sum(x * better < 0 for x in d)}")


for arm in ["mutor-2d-D4", "mutor-1d-d1", "mutor-2d-sparse80"]:
    for cm in (325, 475, 500):
        pairs = [(rec(arm, s, 250), rec("next-token", s, cm, True)) for s in range(4)]
        d = {k: [m[k] - c[k] for m, c in pairs] for k in ("fid", "accuracy", "nll_test")}
        print(f"{arm}@250 minus next-token@{cm}: FID {ci(d['fid'])}; accuracy {ci(d['accuracy'], 3, 1)}; "
              f"NLL {ci(d['nll_test'], 4)}")
for arm in ["next-token", "mutor-1d-d1", "mutor-2d-D4", "mutor-2d-sparse80"]:
    print(arm, [[round(rec(arm, s, st)["fid"], 1) for st in (50, 100, 150, 200, 250)] for s in range(4)])
print("next-token 325/475/500", [[round(rec("next-token", s, st, True)["fid"], 1) for st in (325, 475, 500)] for s in range(4)])
