"""The method's open questions as objective settings: each default is the paper's
rule, bit-identical to the code path without the setting; each rule holds for images and text."""
import dataclasses
from dataclasses import replace
import json
import math

import pytest
import torch

from mutor2d import config as C
from mutor2d.config import ConfigError, make
from mutor2d.engine.runlog import read_log
from mutor2d.engine.loop import train
from mutor2d.objectives.base import Batch
from mutor2d.objectives.token_prediction import TokenPrediction
from mutor2d.objectives.config import WeightSchedule
from mutor2d.registry import build
from test_lm import framed, ragged_batch, tiny_llama
from test_training import tiny

from mutor2d.lm.model import MutorLM  # noqa: E402  (after test_lm: transformers is there)

GRID = (4, 4)


def image_model():
    """A tiny GPT with a register embedding (weights from seed 0)."""
    torch.manual_seed(0)
    return build(tiny().model, register_token=True).eval()


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
    """Default: no schedule, no step hook; the loss is the one of TokenPrediction(spec, a)."""
    cfg = objective()
    assert cfg.weight_schedule() is None and build(cfg, None).schedule is None
    model, batch = image_model(), image_batch()
    plain = TokenPrediction(cfg.register_spec(), 0.5)
    assert torch.equal(loss_of(build(cfg, model), model, batch).loss, loss_of(plain, model, batch).loss)


@pytest.mark.parametrize("kind", ["image", "text"])
def test_scheduled_weight_mixes_the_two_losses(kind):
    name = "mutor-2d" if kind == "image" else "mutor-1d"
    cfg = objective(name, reg_weight=0.1, reg_weight_schedule="linear", reg_weight_final=0.5, reg_weight_steps=4)
    if kind == "image":
        model, batch = image_model(), image_batch()
    else:
        lm = MutorLM(tiny_llama()).eval()
        model, batch, _ = framed(lm, ragged_batch(), cfg.register_spec(), "left")
    obj = build(cfg, model)
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


# ----------------------------------------------------------------------------- offset_distribution

from mutor2d.objectives.spec import RegisterSpec1D, RegisterSpec2D  # noqa: E402
from mutor2d.objectives.layout import make_layout  # noqa: E402


def drawn_offsets(lay) -> list[tuple[int, int]]:
    """The offset of each sample (one per sequence): that of its first valid register."""
    first = lay.reg_valid.float().argmax(1)
    return [tuple(lay.reg_offset[b, first[b]].tolist()) for b in range(lay.reg_offset.shape[0])]


@pytest.mark.parametrize("spec, grid", [(RegisterSpec2D(3), GRID),
                                        (RegisterSpec1D(1, 4, per_register_offsets=True), (1, 9))])
def test_uniform_default_is_todays_draw(spec, grid):
    """The default draws exactly today's randint: the same offsets from the same generator."""
    assert spec.offset_distribution == "uniform"
    lay = make_layout(6, grid, 1, spec, torch.Generator().manual_seed(3))
    A = grid[0] * grid[1] - 1 + (spec.kind == "mutor-1d")
    shape = (6, A) if spec.per_register_offsets else (6, 1)
    pick = torch.randint(len(spec.offsets()), shape, generator=torch.Generator().manual_seed(3)).expand(6, A)
    off = spec.offsets()[pick]                                               # (B, A, 2), anchor order
    anchor = lay.reg_anchor - (-1 if spec.kind == "mutor-1d" else 0)
    got = lay.reg_offset[lay.reg_valid]
    assert torch.equal(got, off.gather(1, anchor[..., None].expand(-1, -1, 2))[lay.reg_valid])


@pytest.mark.parametrize("kind, grid", [("mutor-2d", GRID), ("mutor-1d", (1, 9))])
def test_explicit_weights(kind, grid):
    offsets = RegisterSpec2D(3) if kind == "mutor-2d" else RegisterSpec1D(1, 3)
    C = len(offsets.offsets())
    one_hot = tuple(1.0 if c == 2 else 0.0 for c in range(C))
    spec = replace(offsets, offset_distribution=one_hot)
    lay = make_layout(50, grid, 1, spec, torch.Generator().manual_seed(0))
    assert set(drawn_offsets(lay)) == {tuple(spec.offsets()[2].tolist())}
    weights = tuple(float(c + 1) for c in range(C))                          # frequencies follow them
    lay = make_layout(6000, grid, 1, replace(offsets, offset_distribution=weights),
                      torch.Generator().manual_seed(0))
    counts = torch.tensor([drawn_offsets(lay).count(tuple(o)) for o in spec.offsets().tolist()]).float()
    torch.testing.assert_close(counts / 6000, torch.tensor(weights) / sum(weights), atol=0.02, rtol=0)


def test_valid_anchors_rule_follows_the_length():
    """1D, d = 1..4 with anchors -1..: a sample of length 2 has 2 valid anchors under d = 1, 1 under
    d = 2, none under d >= 3, so it draws d = 1 twice as often as d = 2 and never d >= 3; a full
    sample of 9 has 9, 8, 7, 6."""
    spec = RegisterSpec1D(1, 4, offset_distribution="valid-anchors")
    B = 4000
    lengths = torch.tensor([2, 9]).repeat(B // 2)
    lay = make_layout(B, (1, 9), 1, spec, torch.Generator().manual_seed(0), lengths)
    d = torch.tensor([o[1] for o in drawn_offsets(lay)])
    short, full = d[0::2], d[1::2]
    assert set(short.tolist()) <= {1, 2}
    assert (short == 1).float().mean().item() == pytest.approx(2 / 3, abs=0.03)
    for k, w in zip((1, 2, 3, 4), (9, 8, 7, 6)):
        assert (full == k).float().mean().item() == pytest.approx(w / 30, abs=0.03)


@pytest.mark.parametrize("value, why", [([1.0, 2.0], "expected 'uniform', 'valid-anchors' or 8 "),
                                        ([0.0] * 8, "not all 0"), ([-1.0] + [1.0] * 7, "non-negative"),
                                        ("gauss", "objective.offset_distribution")])
def test_offset_distribution_errors_are_one_line(value, why):
    with pytest.raises(ConfigError) as e:
        objective("mutor-2d", d_max=3, offset_distribution=value)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_offset_weights_on_text():
    """An LM batch in its frame: a one-hot weight list gives every register the same offset."""
    cfg = objective("mutor-1d", d_min=1, d_max=4, offset_distribution=[0, 0, 1, 0])
    _, _, lay = framed(MutorLM(tiny_llama()).eval(), ragged_batch(), cfg.register_spec(), "right")
    assert set(lay.reg_offset[lay.reg_valid][:, 1].tolist()) == {3}


# ----------------------------------------------------------------------------- register_visibility

from mutor2d.sampling.config import useful_draft  # noqa: E402
from test_lm import run_layout  # noqa: E402

EARLIER = RegisterSpec2D(3, register_visibility="earlier_registers")


def test_isolated_default_has_no_second_pair():
    lay = make_layout(2, GRID, 1, RegisterSpec2D(3), torch.Generator().manual_seed(0))
    assert lay.extra_rank is None and lay.visibility.extra_rank is None


@pytest.mark.parametrize("spec, grid", [(EARLIER, GRID), (RegisterSpec1D(1, 3, placement="sparse",
                                         num_registers=4, register_visibility="earlier_registers"), (1, 9))])
def test_earlier_registers_mask(spec, grid):
    """Regular rows as under isolated; a register row also holds the registers anchored strictly earlier;
    the SDPA split rows and the FlexAttention mask_mod give the same matrix."""
    from torch.nn.attention.flex_attention import create_mask
    lay = make_layout(3, grid, 1, spec, torch.Generator().manual_seed(2))
    iso = make_layout(3, grid, 1, dataclasses.replace(spec, register_visibility="isolated"),
                      torch.Generator().manual_seed(2))
    T, m = lay.num_regular, lay.dense_mask()
    assert torch.equal(m[:, :T], iso.dense_mask()[:, :T]) and torch.equal(m[:, T:, :T], iso.dense_mask()[:, T:, :T])
    a, v = lay.reg_anchor, lay.reg_valid
    earlier = v[:, :, None] & v[:, None, :] & (a[:, None, :] < a[:, :, None])
    assert torch.equal(m[:, T:, T:], earlier | torch.eye(lay.num_registers, dtype=torch.bool))
    vis = lay.visibility
    assert torch.equal(vis.extra_mask()[:, 0], m[:, T:])
    B, L = lay.key_rank.shape
    assert torch.equal(create_mask(vis.mask_mod(), B, None, L, L, device="cpu")[:, 0], m)


def changed_rows(run, h, T, r):
    """Which rows of ``run(h)`` (B, L, D) change when register slot r's input embedding changes."""
    with torch.no_grad():
        before = run(h)
        bumped = h.clone()
        bumped[:, T + r] += 1.0
        return (run(bumped) - before).abs().amax(-1) > 1e-6


def check_register_influence(lay, changed, r):
    """Rows changed by bumping register r: the registers anchored after it (and itself), nothing else."""
    T, a, v = lay.num_regular, lay.reg_anchor, lay.reg_valid
    later = v & (a > a[:, r:r + 1])
    later[:, r] = True
    for b in range(a.shape[0]):
        if not v[b, r]:
            continue
        assert not changed[b, :T].any()
        assert changed[b, T:].tolist() == later[b].tolist()


@pytest.mark.parametrize("attention", ["sdpa-split", "dense"])
def test_earlier_registers_image_influence(attention):
    model, batch = image_model(), image_batch(2)
    lay = make_layout(2, GRID, 1, EARLIER, torch.Generator().manual_seed(4))
    iso = make_layout(2, GRID, 1, dataclasses.replace(EARLIER, register_visibility="isolated"),
                      torch.Generator().manual_seed(4))
    T, R = lay.num_regular, lay.num_registers
    h = model.embed(batch.body[:, :T - 1], batch.prefix, R)

    def run(x, layout=lay):
        vis = layout.visibility
        if attention == "dense":
            vis.num_regular = None                                  # no split fast path: the dense mask
        return model.hidden(x, layout.position_ids, vis, prefix_len=1)
    with torch.no_grad():
        assert torch.equal(run(h)[:, :T], run(h, iso)[:, :T])      # regular outputs as under isolated
    r = 5
    check_register_influence(lay, changed_rows(run, h, T, r), r)


def test_earlier_registers_text_influence():
    model = MutorLM(tiny_llama()).eval()
    spec = RegisterSpec1D(1, 3, register_visibility="earlier_registers")
    view, canon, lay = framed(model, ragged_batch(), spec, "left")
    _, _, iso = framed(model, ragged_batch(), dataclasses.replace(spec, register_visibility="isolated"), "left")
    P, T, R = canon.prefix.shape[1], lay.num_regular, lay.num_registers
    h = view.embed(canon.body[:, :T - P], canon.prefix, R)

    def run(x, layout=lay):                                         # canonical padding slots come back 0
        return view.hidden(x, layout.position_ids, layout.visibility)
    with torch.no_grad():
        torch.testing.assert_close(run(h)[:, :T], run(h, iso)[:, :T], atol=1e-6, rtol=1e-6)
    check_register_influence(lay, changed_rows(run, h, T, 1), 1)


def test_earlier_registers_errors_and_refused_drafts():
    with pytest.raises(ConfigError) as e:
        objective(register_visibility="all")
    assert str(e.value).startswith("objective.register_visibility") and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="register_visibility=earlier_registers") as e:
        useful_draft(objective(register_visibility="earlier_registers"), None)
    assert "\n" not in str(e.value)
    from mutor2d.sampling.auto import can_draft
    assert can_draft(objective()) and not can_draft(objective(register_visibility="earlier_registers"))
