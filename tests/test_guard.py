"""The blow-up guard's rule (mutor2d/engine/health.py), on values and on real runs: non-finite values
always skip, a gradient spike only against a history that takes in what it judged (so a healthy run
that changes level trains on), exploded weights stop the run; the loss is judged for finiteness only,
so the rule is the same whatever the objective's loss level. Rows of docs/RELIABILITY.md."""
import math

import pytest
import torch

from mutor2d.engine.runlog import read_log
from mutor2d.engine.health import Health

from test_resume_and_startup import arith_data, tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")
T = torch.tensor


def feed(guard: Health, grads, weight=30.0, loss=1.0) -> list:
    return [guard.judge(T(loss), T(g), weight_norm=T(weight)) for g in grads]


def test_non_finite_values_always_skip_and_count_towards_the_stop():
    guard = Health(10.0, 50, clip=1.0)
    for bad in ((math.nan, 1.0, 30.0), (1.0, math.inf, 30.0), (1.0, 1.0, math.nan)):
        assert guard.judge(T(bad[0]), T(bad[1]), weight_norm=T(bad[2])) == "nonfinite" and guard.fatal
    assert Health(0.0, 50).judge(T(math.nan), T(1.0)) == "nonfinite"        # factor 0: finite rules off only


def test_a_loss_jump_with_a_normal_gradient_is_never_a_blowup():
    """Near-perfect fits (1e-5 nats) and jumps of 1e4 x in the loss alone: the loss has no scale of danger."""
    guard = Health(10.0, 50, clip=1.0)
    assert feed(guard, [1e-4] * 10, loss=1e-5) == [None] * 10
    assert guard.judge(T(0.1), T(1e-4), weight_norm=T(30.0)) is None
    assert guard.judge(T(1e-3), T(1e-2), weight_norm=T(30.0)) is None       # 100 x the median, under the clip


def test_a_gradient_spike_is_judged_against_its_90th_percentile_and_the_clip():
    history = [0.5, 2.0, 0.4, 0.6, 0.5, 0.4, 0.5, 0.6, 0.5, 0.4]
    for value, verdict in ((9.9, None), (10.5, "blowup")):
        guard = Health(10.0, 50, clip=1.0)
        feed(guard, history)
        assert guard.limits()["grad_norm"] == pytest.approx(10 * 1.0)       # 90th percentile 0.6 < clip 1
        assert feed(guard, [value]) == [verdict] and not guard.fatal
    assert guard.judged["quantity"] == "grad_norm" and guard.judged["values"]["grad_norm"] == 10.5
    feed(guard, [2.0])
    assert guard.limits()["grad_norm"] == pytest.approx(20.0)               # the judged 10.5 is history now
    unclipped = Health(10.0, 50, clip=0.0)
    feed(unclipped, [0.5] * 10)
    assert feed(unclipped, [4.9, 5.1]) == [None, "blowup"]


def test_a_gradient_level_the_run_stays_at_trains_again():
    """The reported LoRA run: the model reaches a state where every batch's gradient is 20 x the old
    level. Skipped values enter the history, so after a tenth of the window the level is the scale."""
    guard = Health(10.0, 50, clip=0.1)
    feed(guard, [0.3] * 50)
    verdicts = feed(guard, [7.0] * 20)
    assert verdicts[:6] == ["blowup"] * 6 and verdicts[6:] == [None] * 14 and not guard.fatal


def test_exploded_weights_are_a_divergence_whatever_the_loss_and_gradient():
    guard = Health(10.0, 50, clip=1.0)
    feed(guard, [0.5] * 10, weight=30.0)
    assert guard.judge(T(3.6), T(0.0), weight_norm=T(3e4)) == "blowup" and guard.fatal
    assert guard.judged["quantity"] == "weight_norm"
    assert feed(guard, [0.0] * 30, weight=3e4) == ["blowup"] * 30       # skipped weights never become the scale
    assert feed(guard, [0.5], weight=31.0) == [None]                    # the applied history is the old one


def test_the_guard_history_is_a_checkpoint_part():
    guard = Health(10.0, 50, clip=1.0)
    feed(guard, [0.5] * 6 + [50.0])
    again = Health(10.0, 50, clip=1.0)
    again.load_state_dict(guard.state_dict())
    assert again.limits() == guard.limits() and again.state_dict()["grad_norm"][-1] == 50.0
    again.load_state_dict({"loss": [1.0] * 8, "grad_norm": [0.5] * 8})   # a checkpoint of the old rule
    assert again.state_dict()["weight_norm"] == [] and len(again.state_dict()["grad_norm"]) == 8


def test_the_issue_lora_run_trains_to_its_end(tmp_path):
    """The reported run: LoRA r 16 on every projection of the README's tiny Llama, MuToR-1D, lr 1e-2.
    The old guard skipped every update from step 11 and stopped the run at step 31."""
    import mutor2d.lm as lm_pkg
    cfg = {"task": "lm",
           "model": {"hf": str(tiny_llama(tmp_path / "base")), "finetune": "lora", "lora_r": 16, "lora_alpha": 32,
                     "lora_dropout": 0.05, "dtype": "float32",
                     "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]},
           "data": {"name": "gsm8k", "path": str(arith_data(tmp_path / "train.jsonl", 200))},
           "objective": {"name": "mutor-1d", "reg_weight": 0.5, "d_min": 1, "d_max": 4},
           "optim": {"lr": 1e-2, "betas": [0.9, 0.999], "weight_decay": 0, "warmup_steps": 5, "grad_clip": 1.0},
           "train": {"batch_size": 8, "max_steps": 45, "log_every": 1, "ckpt_every": 0, "tracker": "none",
                     "mixed_precision": "no"}}
    run = tmp_path / "run"
    lm_pkg.train(cfg, run)
    log = read_log(run)
    assert log[-1]["step"] == 45 and sum(r.get("skipped_blowup", 0) for r in log) <= 2


def test_the_skip_table_groups_seeds_into_arms_and_counts_updates_and_skips(tmp_path):
    """mutor2d.engine.runlog's table (the false-positive table of docs/RELIABILITY.md): seeds of an arm
    pooled, skips of steps redone after a resume dropped."""
    import json
    from mutor2d.engine.runlog import skip_table

    def run(name, lines):
        folder = tmp_path / name
        folder.mkdir(parents=True)
        (folder / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        return folder
    a0 = run("ntp_s0", [{"step": 10, "loss": 1.0}, {"event": "skip", "step": 4, "reason": "blowup"},
                        {"event": "skip", "step": 12, "reason": "nonfinite"}, {"event": "resume", "step": 10},
                        {"step": 20, "loss": 1.0}])
    a1 = run("ntp_s1", [{"step": 20, "loss": 1.0}])
    b0 = run("mutor_s0", [{"step": 20, "loss": 1.0}, {"event": "skip", "step": 3, "reason": "blowup"}])
    rows = skip_table([a0, a1, b0]).splitlines()[2:]
    assert rows == [f"| {tmp_path / 'ntp'} | 2 | 40 | 1 (1 blowup) | 2.50% |",
                    f"| {tmp_path / 'mutor'} | 1 | 20 | 1 (1 blowup) | 5.00% |"]
