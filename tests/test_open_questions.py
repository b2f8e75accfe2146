"""The method's open questions as objective settings (issue 40, item 1): each default is the paper's
rule, bit-identical to the code path without the setting; each rule holds for images and text."""
import json
import math

import pytest
import torch

from mutor2d import config as C
from mutor2d.config import ConfigError, make
from mutor2d.engine import read_log, train
from mutor2d.objectives import Batch, RegisterObjective
from mutor2d.objectives.base import WeightSchedule
from test_lm import framed, ragged_batch, tiny_llama
from test_training import tiny

from mutor2d.lm.model import MutorLM  # noqa: E402  (after test_lm: transformers is there)

GRID = (4, 4)


def image_model():
    """A tiny GPT with a register embedding (weights from seed 0)."""
    torch.manual_seed(0)
    return tiny().model.build(register_token=True).eval()


def image_batch(B=3):
    g = torch.Generator().manual_seed(5)
    return Batch(torch.randint(0, 16, (B, GRID[0] * GRID[1]), generator=g), torch.arange(B), GRID)


def objective(name="mutor-2d", **fields):
    return make("objective", name=name, **fields)


def loss_of(obj, model, batch, seed=1):
    with torch.no_grad():
        return obj(model, batch, torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- reg_weight_schedule

def test_schedule_values():
    lin = WeightSchedule("linear", 0.0, 0.5, 10)
    assert [lin.at(s, 99) for s in (0, 5, 10, 20)] == [0.0, 0.25, 0.5, 0.5]
    assert WeightSchedule("linear", 0.5, 0.1, 0).at(50, 100) == pytest.approx(0.3)   # steps 0: the run
    cos = WeightSchedule("cosine", 0.5, 0.1, 8)
    assert cos.at(0, 1) == 0.5 and cos.at(8, 1) == pytest.approx(0.1) and cos.at(4, 1) == pytest.approx(0.3)
    assert cos.at(2, 1) == pytest.approx(0.1 + 0.4 * (1 + math.cos(math.pi / 4)) / 2)
    assert WeightSchedule("constant", 0.3).at(7, 10) == 0.3


@pytest.mark.parametrize("fields, key", [
    ({"reg_weight_schedule": "exp"}, "objective.reg_weight_schedule"),
    ({"reg_weight_schedule": "linear", "reg_weight_final": 1.5}, "objective.reg_weight_final"),
    ({"reg_weight_schedule": "cosine", "reg_weight_steps": -1}, "objective.reg_weight_steps"),
    ({"reg_weight_final": 0.2}, "objective.reg_weight_final"),
    ({"reg_weight_steps": 10}, "objective.reg_weight_steps"),
])
def test_schedule_errors_are_one_line(fields, key):
    with pytest.raises(ConfigError) as e:
        objective(**fields)
    assert str(e.value).startswith(key) and "\n" not in str(e.value)


def test_constant_schedule_is_the_plain_objective():
    """Default: no schedule, no step hook; the loss is the one of RegisterObjective(spec, a)."""
    cfg = objective()
    assert cfg.weight_schedule() is None and cfg.build(None).schedule is None
    model, batch = image_model(), image_batch()
    plain = RegisterObjective(cfg.register_spec(), 0.5)
    assert torch.equal(loss_of(cfg.build(model), model, batch).loss, loss_of(plain, model, batch).loss)


@pytest.mark.parametrize("kind", ["image", "text"])
def test_scheduled_weight_mixes_the_two_losses(kind):
    name = "mutor-2d" if kind == "image" else "mutor-1d"
    cfg = objective(name, reg_weight=0.1, reg_weight_schedule="linear", reg_weight_final=0.5, reg_weight_steps=4)
    if kind == "image":
        model, batch = image_model(), image_batch()
    else:
        lm = MutorLM(tiny_llama()).eval()
        model, batch, _ = framed(lm, ragged_batch(), cfg.register_spec(), "left")
    obj = cfg.build(model)
    for step, a in ((0, 0.1), (2, 0.3), (9, 0.5)):
        obj.set_step(step, 10)
        res = loss_of(obj, model, batch)
        expect = (1 - a) * res.logs["loss_ntp"] + a * res.logs["loss_reg"]
        torch.testing.assert_close(res.loss, expect, rtol=1e-6, atol=1e-6)


def test_run_logs_the_current_weight(tmp_path):
    over = ["train.max_steps=3", "train.sample_every=100", "objective.reg_weight=0.0",
            "objective.reg_weight_schedule=linear", "objective.reg_weight_final=0.4", "objective.reg_weight_steps=2"]
    train(tiny(*over), tmp_path / "s")
    assert [r["reg_weight"] for r in read_log(tmp_path / "s")] == pytest.approx([0.0, 0.2, 0.4])
