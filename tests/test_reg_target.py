"""objective.reg_target: what a register, or head k at an anchor, learns about its target
body token x_j, for mutor-1d, mutor-2d and multihead, on the image GPT and on transformers LMs.

* token (default): today's loss, bit for bit (losses, logs, gradients, random draws), checked against
  today's code copied here (``todays_*``).
* self_distill: (1 - m) CE(q, x_j) + m KL(p || q), p the model's own next-token distribution for x_j
  (taken without a graph), q the register's (head's); checked against references written here with
  explicit loops: on the GPT, one plain causal run per register (the register slot appended after its
  anchor's past) and one per teacher (prefix + x_0..x_{j-1}); on text, the plain transformers model
  (tests/test_lm_objective.py's terms).
Also the settings' one-line errors, run labels, multihead's reg_weight schedule and short runs."""
import math

import pytest
import torch
import torch.nn.functional as F

from mutor2d.config import ConfigError, make
from mutor2d.engine.runlog import read_log
from mutor2d.engine.loop import train
from mutor2d.model.gpt import GPT
from mutor2d.objectives.base import Batch
from mutor2d.objectives.base import TargetRule, target_rule
from mutor2d.objectives.spec import RegisterSpec, first_anchor
from mutor2d.objectives.layout import make_layout, offset_targets, regular_position_ids
from mutor2d.registry import build
from test_lm import ragged_batch, tiny_llama
from test_lm_objective import drawn_registers, head_terms, ntp_terms, pooled, register_terms, samples
from test_training import tiny as tiny_run

from mutor2d.lm import hf  # noqa: E402  (after test_lm: transformers is there)
from mutor2d.lm.config import LMModelConfig, load  # noqa: E402
from mutor2d.lm.model import frame_batch  # noqa: E402
from mutor2d.lm.run import LMTrainModule  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

V, A, SEED = 16, 0.3, 3


def gpt(conditioning="class", rope="2d", sparse_logits=False):
    """A tiny GPT with a register embedding and a random (not zero) output layer."""
    torch.manual_seed(0)
    cfg = make("model", preset="tiny", vocab_size=V, num_classes=5, conditioning=conditioning, rope=rope,
               token_dropout=0, resid_dropout=0, ffn_dropout=0, class_dropout=0, attention="sdpa")
    model = GPT(cfg, register_token=True).eval()
    with torch.no_grad():
        model.output.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    if sparse_logits:
        model.sparse_logits = True
    return model


def grid_batch():
    g = torch.Generator().manual_seed(1)
    return Batch(torch.randint(0, V, (3, 16), generator=g), torch.arange(3), (4, 4))


def line_batch():
    g = torch.Generator().manual_seed(2)
    body = torch.randint(0, V, (3, 10), generator=g)
    return Batch(body, torch.randint(0, V, (3, 4), generator=g), (1, 10), torch.tensor([10, 7, 3]))


IMAGE = {  # case: (objective fields, model, batch)
    "2d-dense": ({"name": "mutor-2d", "d_max": 3, "per_register_offsets": True}, gpt, grid_batch),
    "2d-sparse": ({"name": "mutor-2d", "d_max": 3, "placement": "sparse", "num_registers": 5}, gpt, grid_batch),
    "2d-dense-sparse-logits": ({"name": "mutor-2d", "d_max": 4}, lambda: gpt(sparse_logits=True), grid_batch),
    "1d-line": ({"name": "mutor-1d", "d_max": 3}, lambda: gpt("prompt", "1d"), line_batch),
    "1d-grid-raster": ({"name": "mutor-1d", "d_min": 2, "d_max": 4, "edge": "raster"}, gpt, grid_batch),
    "multihead-2d": ({"name": "multihead", "d_max": 3}, gpt, grid_batch),
    "multihead-1d": ({"name": "multihead", "layout": "1d", "d_max": 3}, lambda: gpt("prompt", "1d"), line_batch),
}
TEXT = {"dense": {"name": "mutor-1d", "d_max": 3}, "sparse": {"name": "mutor-1d", "d_max": 4, "placement": "sparse",
                                                              "num_registers": 3},
        "multihead": {"name": "multihead", "d_max": 4}}


def grads(modules, loss) -> dict[str, torch.Tensor]:
    for m in modules:
        m.zero_grad(set_to_none=True)
    loss.backward()
    return {f"{i}.{n}": p.grad.clone() for i, m in enumerate(modules) for n, p in m.named_parameters()
            if p.grad is not None}


def assert_same_grads(got, want, exact):
    assert got.keys() == want.keys() and want
    for n in want:
        if exact:
            assert torch.equal(got[n], want[n]), n
        else:
            torch.testing.assert_close(got[n], want[n], atol=1e-5, rtol=1e-4, msg=n)


# ----------------------------------------------------------------------------- today's loss, verbatim

def todays_masked_ce(logits, targets, valid=None):
    if valid is None:
        valid = torch.ones(targets.shape, dtype=torch.bool, device=targets.device)
    n = valid.sum()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="none")
    return (ce * valid.reshape(-1)).sum() / n.clamp(min=1), n


def todays_token_ce(model, h, targets, valid):
    if model.sparse_logits:
        return todays_masked_ce(model.logits(h[valid]), targets[valid])
    return todays_masked_ce(model.logits(h), targets, valid)


def todays_register_loss(cfg, model, batch, generator):
    """TokenPrediction.forward before reg_target: (loss, logs)."""
    P = model.prefix_len(batch.prefix)
    lay = make_layout(batch.body.shape[0], batch.grid, P, cfg.register_spec(), generator, batch.lengths,
                      batch.body.device)
    T, R = lay.num_regular, lay.num_registers
    h = model.hidden(model.embed(batch.body[:, :T - P], batch.prefix, R), lay.position_ids, lay.visibility,
                     prefix_len=P)
    ntp_t, reg_t = lay.gather_targets(batch.body)
    ntp = todays_token_ce(model, h[:, P - 1:T], ntp_t[:, P - 1:], lay.ntp_valid[:, P - 1:])
    reg = todays_token_ce(model, h[:, T:], reg_t, lay.reg_valid)
    return (1 - cfg.reg_weight) * ntp[0] + cfg.reg_weight * reg[0], {"loss_ntp": ntp[0], "loss_reg": reg[0]}


def todays_multihead_loss(cfg, obj, model, batch):
    """MultiHead.forward before reg_target: (loss, logs)."""
    B, N = batch.body.shape
    P = model.prefix_len(batch.prefix)
    T = P + N - 1
    pos = regular_position_ids(batch.grid, P).expand(B, T, 2)
    h, head_h = model.hidden_with_heads(model.embed(batch.body[:, :N - 1], batch.prefix), pos, obj.heads,
                                        prefix_len=P)
    lay = make_layout(B, batch.grid, P, RegisterSpec(), None, batch.lengths, batch.body.device)
    ntp_t, _ = lay.gather_targets(batch.body)
    ntp = todays_token_ce(model, h[:, P - 1:], ntp_t[:, P - 1:], lay.ntp_valid[:, P - 1:])
    a0 = first_anchor(obj.kind)
    anchors = torch.arange(a0, N - 1)
    losses = []
    for hk, off in zip(head_h, obj.offsets):
        target, valid = offset_targets(batch.grid, anchors.expand(B, -1), off, obj.edge, batch.lengths)
        losses.append(todays_token_ce(model, hk[:, P + a0:], batch.body.gather(1, target), valid)[0])
    heads = torch.stack(losses).mean()
    return (1 - cfg.reg_weight) * ntp[0] + cfg.reg_weight * heads, {"loss_ntp": ntp[0], "loss_heads": heads}


def todays_loss(cfg, obj, model, batch, generator):
    if cfg.name == "multihead":
        return todays_multihead_loss(cfg, obj, model, batch)
    return todays_register_loss(cfg, model, batch, generator)


def check_bit_identical(cfg, obj, model, batch, modules):
    """The built objective ``obj`` of ``cfg`` against today's code: same loss, logs, gradients (of
    ``modules``' parameters), random draws."""
    assert cfg.reg_target == "token" and target_rule(cfg) == TargetRule()
    before = torch.get_rng_state()
    g_new, g_old = torch.Generator().manual_seed(SEED), torch.Generator().manual_seed(SEED)
    got = obj(model, batch, g_new)
    torch.set_rng_state(before)
    want, want_logs = todays_loss(cfg, obj, model, batch, g_old)
    assert torch.equal(g_new.get_state(), g_old.get_state()) and torch.equal(torch.get_rng_state(), before)
    assert torch.equal(got.loss, want) and got.logs.keys() == want_logs.keys()
    assert all(torch.equal(got.logs[k], want_logs[k]) for k in want_logs)
    assert_same_grads(grads(modules, got.loss), grads(modules, want), exact=True)


@pytest.mark.parametrize("case", sorted(IMAGE))
def test_token_default_is_todays_loss_on_the_gpt(case):
    fields, model_fn, batch_fn = IMAGE[case]
    cfg, model = make("objective", **fields, reg_weight=A), model_fn()
    obj = build(cfg, model)
    check_bit_identical(cfg, obj, model, batch_fn(), [model, *([obj] if list(obj.parameters()) else [])])


def lm_setup(objective: dict):
    """(config, MutorLM with a random register embedding) of a tiny Llama built from a config."""
    cfg = load({"model": {"hf": "x"}, "data": {"path": "d"}, "objective": {**objective, "reg_weight": A}})
    model = hf.build(tiny_llama(), LMModelConfig(hf="x", finetune="full"), cfg.objective)
    if model.has_registers:
        with torch.no_grad():
            model.register_embedding.normal_(generator=torch.Generator().manual_seed(5))
    return cfg, model


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("case", sorted(TEXT))
def test_token_default_is_todays_loss_on_a_transformers_lm(case, side):
    """The run's objective on the batch's canonical frame and the FramedLM, as LMTrainModule calls it."""
    cfg, model = lm_setup(TEXT[case])
    obj = LMTrainModule(model, cfg.objective, side).objective
    view, canon = frame_batch(model, ragged_batch(), cfg.objective.register_spec(), side, "cpu")
    check_bit_identical(cfg.objective, obj, view, canon, [model])


# ----------------------------------------------------------------------------- self_distill on the GPT

def plain_logits(model, prefix, tokens, grid, extra_at=None):
    """Logits (V,) of the last slot of a plain causal run of one sample on prefix + tokens, with one
    register slot appended at the position id of regular slot ``extra_at`` when given."""
    P = model.prefix_len(prefix)
    L = P + tokens.shape[1]
    pos = regular_position_ids(grid, P, length=max(L, extra_at + 1 if extra_at is not None else 0))
    ids = pos[:L] if extra_at is None else torch.cat([pos[:L], pos[extra_at:extra_at + 1]])
    h = model.hidden(model.embed(tokens, prefix, int(extra_at is not None)), ids[None], None, prefix_len=P)
    return model.logits(h[0, -1]).float()


def kl_ce(q_logits, p_logits, target):
    """(KL(p || q), CE(q, target)) of one row, p taken without a graph."""
    logq = F.log_softmax(q_logits, -1)
    with torch.no_grad():
        logp = F.log_softmax(p_logits, -1)
    return (logp.exp() * (logp - logq)).sum(), -logq[target]


def plain_ntp(model, batch):
    """Mean CE of the plain causal model over the valid next-token targets (pooled)."""
    P = model.prefix_len(batch.prefix)
    terms = []
    for b in range(batch.body.shape[0]):
        N = int(batch.lengths[b]) if batch.lengths is not None else batch.body.shape[1]
        for j in range(N):
            terms.append(F.cross_entropy(plain_logits(model, batch.prefix[b:b + 1], batch.body[b:b + 1, :j],
                                                      batch.grid), batch.body[b, j]))
    return torch.stack(terms).mean()


def teacher_slot(lay, b, j):
    """The regular slot whose next-token target is x_j (found in the layout, not by formula)."""
    hits = ((lay.ntp_target[b] == j) & lay.ntp_valid[b]).nonzero().flatten().tolist()
    assert len(hits) == 1
    return hits[0]


def reference_registers(model, batch, cfg, seed):
    """(mean KL, mean CE) over the valid registers of the layout the objective draws from ``seed``,
    one register at a time: q from a plain causal run of prefix + x_0..x_t + the register slot, p
    from one of prefix + x_0..x_{j-1} (the input of the slot that predicts x_j)."""
    P = model.prefix_len(batch.prefix)
    lay = make_layout(batch.body.shape[0], batch.grid, P, cfg.register_spec(), torch.Generator().manual_seed(seed),
                      batch.lengths)
    kls, ces, edges = [], [], set()
    for b, r in lay.reg_valid.nonzero().tolist():
        t, j = int(lay.reg_anchor[b, r]), int(lay.reg_target[b, r])
        slot = teacher_slot(lay, b, j)
        assert slot == P - 1 + j                # the predictor of x_j: regular slot P - 1 + j
        pre = batch.prefix[b:b + 1]
        q = plain_logits(model, pre, batch.body[b:b + 1, :t + 1], batch.grid, extra_at=slot)
        p = plain_logits(model, pre, batch.body[b:b + 1, :j], batch.grid)
        kl, ce = kl_ce(q, p, batch.body[b, j])
        kls.append(kl)
        ces.append(ce)
        edges |= edge_names(batch.grid, j, t)
    return torch.stack(kls).mean(), torch.stack(ces).mean(), edges


def edge_names(grid, j, t):
    """Which grid edges a (anchor t, target j) pair touches."""
    H, W = grid
    names = {"last row" if j // W == H - 1 else "", "last column" if j % W == W - 1 else "",
             "first column" if j % W == 0 else "", "prefix anchor" if t < 0 else ""}
    return names - {""}


def reference_heads(model, obj, batch):
    """(mean over heads of mean KL, of mean CE): head k's hidden state at anchor x_t against the plain
    model's distribution for its target cell (row(t) + dr, col(t) + dc), found by explicit row/column
    arithmetic (geometric edge: off the grid is no target)."""
    B, N = batch.body.shape
    H, W = batch.grid
    P = model.prefix_len(batch.prefix)
    T = P + N - 1
    pos = regular_position_ids(batch.grid, P).expand(B, T, 2)
    _, head_h = model.hidden_with_heads(model.embed(batch.body[:, :N - 1], batch.prefix), pos, obj.heads,
                                        prefix_len=P)
    kls, ces = [], []
    for hk, (dr, dc) in zip(head_h, obj.offsets.tolist()):
        kl_k, ce_k = [], []
        for b in range(B):
            length = int(batch.lengths[b]) if batch.lengths is not None else N
            for t in range(first_anchor(obj.kind), N - 1):
                row, col = (0, -1) if t < 0 else divmod(t, W)
                if not (row + dr < H and 0 <= col + dc < W):
                    continue
                j = (row + dr) * W + col + dc
                if j >= length:
                    continue
                p = plain_logits(model, batch.prefix[b:b + 1], batch.body[b:b + 1, :j], batch.grid)
                kl, ce = kl_ce(model.logits(hk[b, P + t]).float(), p, batch.body[b, j])
                kl_k.append(kl)
                ce_k.append(ce)
        kls.append(torch.stack(kl_k).mean())
        ces.append(torch.stack(ce_k).mean())
    return torch.stack(kls).mean(), torch.stack(ces).mean()


@pytest.mark.parametrize("mix", [1.0, 0.4])
@pytest.mark.parametrize("case", sorted(IMAGE))
def test_self_distill_equals_the_reference_on_the_gpt(case, mix):
    fields, model_fn, batch_fn = IMAGE[case]
    model, batch = model_fn(), batch_fn()
    cfg = make("objective", **fields, reg_weight=A, reg_target="self_distill", reg_distill_mix=mix)
    obj = build(cfg, model)
    got = obj(model, batch, torch.Generator().manual_seed(SEED))
    aux = "heads" if cfg.name == "multihead" else "reg"
    if cfg.name == "multihead":
        kl, ce = reference_heads(model, obj, batch)
    else:
        kl, ce, edges = reference_registers(model, batch, cfg, SEED)
        if cfg.placement == "dense":
            assert edges >= ({"last row", "last column", "first column"} if batch.grid[0] > 1 else {"prefix anchor"})
    term = (1 - mix) * ce + mix * kl
    for name, want in ((f"loss_{aux}_kl", kl), (f"loss_{aux}_ce", ce), (f"loss_{aux}", term)):
        torch.testing.assert_close(got.logs[name], want, atol=1e-5, rtol=1e-5, msg=name)
    want = (1 - A) * plain_ntp(model, batch) + A * term
    torch.testing.assert_close(got.loss, want, atol=1e-5, rtol=1e-5)
    modules = [model, *([obj] if list(obj.parameters()) else [])]
    assert_same_grads(grads(modules, got.loss), grads(modules, want), exact=False)


def test_self_distill_keeps_the_draws_and_the_next_token_term():
    fields, model_fn, batch_fn = IMAGE["2d-sparse"]
    model, batch = model_fn(), batch_fn()
    results, states = [], []
    for target in ("token", "self_distill"):
        g = torch.Generator().manual_seed(SEED)
        with torch.no_grad():
            results.append(build(make("objective", **fields, reg_target=target), model)(model, batch, g))
        states.append(g.get_state())
    assert torch.equal(*states) and torch.equal(results[0].logs["loss_ntp"], results[1].logs["loss_ntp"])
    assert torch.equal(results[0].counts["reg"], results[1].counts["reg"])
    torch.testing.assert_close(results[0].logs["loss_reg"], results[1].logs["loss_reg_ce"])


# ----------------------------------------------------------------------------- the teacher carries no gradient

class Linear:
    """A TokenModel's logits only: h (..., D) -> h @ W (..., V)."""
    sparse_logits = False

    def __init__(self, weight):
        self.weight = weight

    def logits(self, h):
        return h @ self.weight


@pytest.mark.parametrize("sparse", [False, True])
def test_teacher_is_detached(sparse):
    """d(loss)/d(regular hidden states) = 0; the register side's gradient is the one of a reference
    whose teacher is a constant; a register that reads its teacher's hidden state has KL 0."""
    g = torch.Generator().manual_seed(0)
    model = Linear(torch.randn(8, V, generator=g))
    model.sparse_logits = sparse
    regular = torch.randn(2, 6, 8, generator=g, requires_grad=True)
    h = torch.randn(2, 4, 8, generator=g, requires_grad=True)
    targets, slots = torch.randint(0, V, (2, 4), generator=g), torch.randint(0, 6, (2, 4), generator=g)
    valid = torch.tensor([[True, True, False, True], [False, True, True, True]])
    (loss, n), parts = TargetRule("self_distill", 1.0).loss(model, h, targets, valid, regular, slots)
    loss.backward()
    assert regular.grad is None and int(n) == 6 and torch.equal(loss, parts["kl"])
    teacher = torch.stack([regular[b, slots[b]] for b in range(2)]).detach()
    ref_h = h.detach().clone().requires_grad_(True)
    ref = torch.stack([kl_ce(model.logits(ref_h[b, r]), model.logits(teacher[b, r]), targets[b, r])[0]
                       for b, r in valid.nonzero().tolist()]).mean()
    ref.backward()
    torch.testing.assert_close(h.grad, ref_h.grad)
    with torch.no_grad():
        same = torch.stack([regular[b, slots[b]] for b in range(2)])
        (zero, _), _ = TargetRule("self_distill", 1.0).loss(model, same, targets, valid, regular, slots)
    assert abs(float(zero)) < 1e-6


# ----------------------------------------------------------------------------- self_distill on text

def text_reference(model, cfg, batch, mix):
    """(1 - mix) CE + mix KL through the plain transformers model, sample by sample: registers as
    tests/test_lm_objective.py runs them, the teacher of a_j the plain model's row predicting a_j."""
    lm, o = model.lm, cfg.objective
    with torch.no_grad():
        teacher = [logits for logits, _ in ntp_terms(lm, batch)]          # row j predicts a_j
    pairs = samples(batch)
    if o.name == "multihead":
        terms = []
        for head, d in zip(model.heads, o.register_spec().offsets()[:, 1].tolist()):
            rows = []
            for b, (logits, targets) in enumerate(head_terms(lm, head, d, batch)):
                anchors = torch.arange(-1, max(len(pairs[b][1]) - d, -1))
                rows += [kl_ce(q, teacher[b][t + d], y) for q, t, y in zip(logits, anchors.tolist(), targets)]
            terms.append(torch.stack([(1 - mix) * ce + mix * kl for kl, ce in rows]).mean())
        return torch.stack(terms).mean()
    registers = drawn_registers(cfg, batch, SEED)
    rows = [kl_ce(q[0], teacher[b][t + d], y[0])
            for (b, t, d), (q, y) in zip(registers, register_terms(lm, model, batch, registers))]
    return torch.stack([(1 - mix) * ce + mix * kl for kl, ce in rows]).mean()


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("case", sorted(TEXT))
def test_self_distill_equals_the_reference_on_text(case, side):
    mix = 0.7
    cfg, model = lm_setup({**TEXT[case], "reg_target": "self_distill", "reg_distill_mix": mix})
    batch = ragged_batch()
    got = LMTrainModule(model, cfg.objective, side)(batch, torch.Generator().manual_seed(SEED))
    aux = text_reference(model, cfg, batch, mix)
    torch.testing.assert_close(got.logs["loss_heads" if case == "multihead" else "loss_reg"], aux,
                               atol=1e-5, rtol=1e-5)
    want = (1 - A) * pooled(ntp_terms(model.lm, batch)) + A * aux
    torch.testing.assert_close(got.loss, want, atol=1e-5, rtol=1e-5)
    assert_same_grads(grads([model], got.loss), grads([model], want), exact=False)


# ----------------------------------------------------------------------------- settings

@pytest.mark.parametrize("name", ["mutor-1d", "mutor-2d", "multihead"])
@pytest.mark.parametrize("fields, key, value", [
    ({"reg_target": "self_distill", "reg_distill_mix": 1.5}, "objective.reg_distill_mix", "1.5"),
    ({"reg_target": "self_distill", "reg_distill_mix": -0.1}, "objective.reg_distill_mix", "-0.1"),
    ({"reg_distill_mix": 0.5}, "objective.reg_distill_mix=0.5", "only with objective.reg_target self_distill"),
    ({"reg_target": "kl"}, "objective.reg_target", "'kl'"),
    ({"reg_weight_final": 0.2}, "objective.reg_weight_final=0.2", "linear or cosine"),
    ({"reg_weight_schedule": "linear", "reg_weight_steps": -1}, "objective.reg_weight_steps", "-1"),
])
def test_errors_are_one_line_and_name_the_value(name, fields, key, value):
    with pytest.raises(ConfigError) as e:
        make("objective", name=name, **fields)
    msg = str(e.value)
    assert msg.startswith(key) and value in msg and "\n" not in msg


def test_run_labels_show_the_setting():
    assert make("objective", name="mutor-2d").describe() == "a=0.5, D=4, dense"
    assert make("objective", name="mutor-2d", reg_target="self_distill").describe() == "a=0.5, self_distill, D=4, dense"
    assert (make("objective", name="mutor-1d", reg_target="self_distill", reg_distill_mix=0.5).describe()
            == "a=0.5, self_distill mix=0.5, d=1..4, dense")
    assert make("objective", name="multihead").describe() == "a=0.5, heads=all, 2d D=4"
    assert (make("objective", name="multihead", reg_weight_schedule="cosine", reg_target="self_distill").describe()
            == "a=0.5->0.0 cosine, self_distill, heads=all, 2d D=4")


def test_multihead_schedule_mixes_the_two_losses():
    cfg = make("objective", name="multihead", d_max=3, reg_weight=0.1, reg_weight_schedule="linear",
               reg_weight_final=0.5, reg_weight_steps=4)
    model, batch = gpt(), grid_batch()
    obj = build(cfg, model)
    assert build(make("objective", name="multihead"), model).schedule is None
    for step, a in ((0, 0.1), (2, 0.3), (9, 0.5)):
        obj.set_step(step, 10)
        with torch.no_grad():
            res = obj(model, batch)
        torch.testing.assert_close(res.loss, (1 - a) * res.logs["loss_ntp"] + a * res.logs["loss_heads"])


@pytest.mark.parametrize("name", ["mutor-2d", "multihead"])
def test_self_distill_trains_end_to_end(tmp_path, name):
    aux = "heads" if name == "multihead" else "reg"
    over = ["train.max_steps=3", "train.sample_every=100", f"objective.name={name}", "objective.reg_weight=0.0",
            "objective.reg_weight_schedule=linear", "objective.reg_weight_final=0.4", "objective.reg_weight_steps=2",
            "objective.reg_target=self_distill", "objective.reg_distill_mix=0.5"]
    train(tiny_run(*over), tmp_path / "s")
    rows = read_log(tmp_path / "s")
    assert [r["reg_weight"] for r in rows] == pytest.approx([0.0, 0.2, 0.4])
    for r in rows:
        assert r[f"loss_{aux}"] == pytest.approx(0.5 * r[f"loss_{aux}_ce"] + 0.5 * r[f"loss_{aux}_kl"], rel=1e-5)
        assert r[f"loss_{aux}_kl"] >= 0 and math.isfinite(r["loss"]) and math.isfinite(r[f"loss_{aux}"])


NEW_FIELDS = [(name, field) for name in ("mutor-1d", "mutor-2d", "multihead")
              for field in ("reg_target", "reg_distill_mix", "reg_weight_schedule", "reg_weight_final",
                            "reg_weight_steps")]


@pytest.mark.parametrize("name, field", NEW_FIELDS)
def test_new_fields_pass_the_config_fuzz(name, field):
    """tests/test_config_fuzz.py's rule on every odd value it draws from: loads or names the field."""
    import test_config_fuzz as fuzz
    for value in [0, -1, 1, 2, 0.5, -0.5, 1.5, 1e300, 2 ** 63, "nan", "inf", "", "x", "token", "self_distill",
                  "linear", [], [1, 2], {}, None, True]:
        fuzz.test_any_value_loads_or_names_the_field.hypothesis.inner_test(target=("objective", name, field),
                                                                           value=value)
