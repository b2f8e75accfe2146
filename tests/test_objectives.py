"""Objectives: the registry, the declared result, and the loss invariants (registers never change
what regular tokens compute; the mixture weights; counts; same draws for the same generator)."""
import pytest
import torch
import torch.nn.functional as F

from mutor2d import config as C
from mutor2d.model.gpt import GPT
from mutor2d.objectives.base import Batch, ObjectiveResult, masked_ce
from mutor2d.objectives.multihead import MultiHead
from mutor2d.objectives.token_prediction import TokenPrediction
from mutor2d.objectives.spec import RegisterSpec, RegisterSpec2D
from mutor2d.objectives.layout import make_layout
from mutor2d.registry import build, named

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

V, K = 16, 5


def tiny(prefix="class", rope="2d", register=True):
    torch.manual_seed(0)
    cfg = C.make("model", preset="tiny", vocab_size=V, num_classes=K, conditioning=prefix, rope=rope,
                        token_dropout=0, resid_dropout=0, ffn_dropout=0, class_dropout=0,
                        attention="sdpa")
    return GPT(cfg, register_token=register).eval()


def grid_batch(B=3, grid=(4, 4)):
    g = torch.Generator().manual_seed(1)
    return Batch(torch.randint(0, V, (B, grid[0] * grid[1]), generator=g), torch.arange(B) % K, grid)


def line_batch():
    g = torch.Generator().manual_seed(2)
    body = torch.randint(0, V, (3, 10), generator=g)
    return Batch(body, torch.randint(0, V, (3, 4), generator=g), (1, 10), torch.tensor([10, 7, 3]))


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_registry_and_registers_flag():
    assert set(named("objective")) >= {"ntp", "mutor-1d", "mutor-2d", "multihead"}
    model = tiny()
    for name, cls in [("ntp", TokenPrediction), ("mutor-1d", TokenPrediction),
                      ("mutor-2d", TokenPrediction), ("multihead", MultiHead)]:
        cfg = C.make("objective", name=name)
        assert type(build(cfg, model)) is cls
        assert cfg.uses_registers() == (name in ("mutor-1d", "mutor-2d"))


def test_result_declares_loss_logs_counts_tokens():
    model, batch = tiny(), grid_batch()
    out = build(C.make("objective", name="mutor-2d", d_max=3), model)(model, batch, gen())
    assert isinstance(out, ObjectiveResult)
    assert set(out.logs) == {"loss_ntp", "loss_reg"} and set(out.counts) == {"ntp", "reg"}
    lay = make_layout(3, (4, 4), 1, RegisterSpec2D(d_max=3), gen())
    assert int(out.counts["ntp"]) == 3 * 16 and int(out.counts["reg"]) == int(lay.reg_valid.sum())
    assert int(out.tokens) == 3 * (lay.num_regular + lay.num_registers)
    ntp = build(C.make("objective", name="ntp"), model)(model, batch, gen())
    assert set(ntp.logs) == {"loss_ntp"} and ntp.loss is ntp.logs["loss_ntp"] and int(ntp.tokens) == 3 * 16


@pytest.mark.parametrize("name,kw,make_batch,prefix,rope", [
    ("mutor-2d", dict(d_max=3), grid_batch, "class", "2d"),
    ("mutor-2d", dict(d_max=4, placement="sparse", num_registers=5), grid_batch, "class", "2d"),
    ("mutor-1d", dict(d_min=2, d_max=4), line_batch, "prompt", "1d"),
    ("mutor-1d", dict(d_min=1, d_max=3, placement="sparse", num_registers=2), line_batch, "prompt", "1d"),
])
def test_registers_never_change_the_next_token_loss(name, kw, make_batch, prefix, rope):
    """Regular tokens never see registers: the NTP term with registers equals plain NTP's, and the
    total is the declared mixture."""
    model, batch = tiny(prefix, rope), make_batch()
    cfg = C.make("objective", name=name, reg_weight=0.3, **kw)
    with torch.no_grad():
        out = build(cfg, model)(model, batch, gen())
        plain = build(C.make("objective", name="ntp"), model)(model, batch, gen())
    torch.testing.assert_close(out.logs["loss_ntp"], plain.loss, rtol=1e-5, atol=1e-6)
    assert torch.equal(out.counts["ntp"], plain.counts["ntp"])
    assert torch.equal(out.loss, 0.7 * out.logs["loss_ntp"] + 0.3 * out.logs["loss_reg"])


def test_padded_lines_count_only_real_targets():
    model, batch = tiny("prompt", "1d"), line_batch()
    out = build(C.make("objective", name="ntp"), model)(model, batch)
    assert int(out.counts["ntp"]) == 10 + 7 + 3


def test_next_token_loss_by_hand():
    """NTP = mean CE of the logits after the class token and x_0..x_{N-2} against x_0..x_{N-1}."""
    model, batch = tiny(register=False), grid_batch(B=2, grid=(2, 3))
    with torch.no_grad():
        out = build(C.make("objective", name="ntp"), model)(model, batch)
        lay = make_layout(2, (2, 3), 1, RegisterSpec())
        h = model.hidden(model.embed(batch.body[:, :5], batch.prefix, 0), lay.position_ids, None)
        ref = F.cross_entropy(model.logits(h).reshape(-1, V), batch.body.reshape(-1))
    torch.testing.assert_close(out.loss, ref)


def test_same_generator_same_layout_draws_and_loss():
    model, batch = tiny(), grid_batch()
    obj = build(C.make("objective", name="mutor-2d", d_max=4, per_register_offsets=True), model)
    a, b = obj(model, batch, gen(5)), obj(model, batch, gen(5))
    assert torch.equal(a.loss, b.loss)
    g = gen(5)
    lay = obj.layout(batch, 1, g)
    ref = make_layout(3, (4, 4), 1, RegisterSpec2D(d_max=4, per_register_offsets=True), gen(5))
    assert torch.equal(lay.reg_offset, ref.reg_offset) and torch.equal(lay.reg_anchor, ref.reg_anchor)


@pytest.mark.parametrize("layout,grid,heads", [("2d", (4, 4), 3), ("1d", (1, 10), 3)])
def test_multihead_owns_blocks_and_logs_loss_heads(layout, grid, heads):
    prefix, rope = ("class", "2d") if layout == "2d" else ("prompt", "1d")
    model = tiny(prefix, rope, register=False)
    batch = grid_batch(grid=grid) if layout == "2d" else line_batch()
    cfg = C.make("objective", name="multihead", layout=layout, d_min=2, d_max=2 if layout == "2d" else 4)
    obj = build(cfg, model)
    assert len(obj.blocks()) == heads and all(b in list(obj.heads) for b in obj.blocks())
    out = obj(model, batch)
    assert set(out.logs) == {"loss_ntp", "loss_heads"}
    with torch.no_grad():
        plain = build(C.make("objective", name="ntp"), model)(model, batch)
    torch.testing.assert_close(out.logs["loss_ntp"], plain.loss, rtol=1e-5, atol=1e-6)
    assert torch.equal(out.loss, 0.5 * out.logs["loss_ntp"] + 0.5 * out.logs["loss_heads"])
    out.loss.backward()
    assert all(p.grad is not None for p in obj.parameters())


def test_multihead_num_heads_keeps_the_first_offsets():
    model = tiny(register=False)
    obj = build(C.make("objective", name="multihead", d_max=3, num_heads=2), model)
    assert obj.offsets.tolist() == [[0, 1], [0, 2]] and len(obj.blocks()) == 2
    assert build(C.make("objective", name="ntp"), model).blocks() == []


def test_masked_ce_empty_is_zero():
    loss, n = masked_ce(torch.randn(2, 3, V), torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.bool))
    assert float(loss) == 0.0 and int(n) == 0


def test_unregistered_objective_is_a_config_error():
    with pytest.raises(C.ConfigError, match="objective.name: expected one of .* got 'nope'"):
        C.make("objective", name="nope")
