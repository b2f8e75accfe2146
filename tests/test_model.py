"""Model invariants: registers never change regular outputs; registers are blind to what they must
not see; backends agree; KV-cache decoding; GPT-B size; LlamaGen interop; overfitting."""
import argparse
import math

import pytest
import torch
import torch.nn.functional as F

from mutor2d.model.attention import NEVER, Visibility
from mutor2d.config import make
from mutor2d.model.config import ModelConfig
from mutor2d.model.gpt import GPT
from mutor2d.model.config import model_shape
from mutor2d.model.llamagen import load_llamagen
from mutor2d.objectives.base import Batch
from mutor2d.objectives.spec import RegisterSpec1D, RegisterSpec2D
from mutor2d.objectives.layout import make_layout, regular_position_ids
from mutor2d.registry import build

V, C = 24, 5


def tiny(prefix="class", rope="2d", register=True, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = ModelConfig(preset="tiny", vocab_size=V, num_classes=C, conditioning=prefix, rope=rope,
                      token_dropout=0, resid_dropout=0, ffn_dropout=0, class_dropout=0, **kw)
    m = GPT(cfg, register_token=register).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.2)
    return m


def set_backend(m, name):
    for layer in m.layers:
        layer.attention.backend = name


CASES = [  # name, grid, prefix kind, spec, padded
    ("2d-dense", (4, 4), "class", RegisterSpec2D(d_max=3), False),
    ("2d-sparse", (4, 5), "class", RegisterSpec2D(d_max=4, placement="sparse", num_registers=6), False),
    ("2d-per-reg", (3, 4), "class", RegisterSpec2D(d_max=3, per_register_offsets=True), False),
    ("1d-on-grid", (4, 4), "class", RegisterSpec1D(d_min=1, d_max=4, edge="raster"), False),
    ("1d-dense-pad", (1, 12), "prompt", RegisterSpec1D(d_min=2, d_max=4), True),
    ("1d-sparse-pad", (1, 12), "prompt", RegisterSpec1D(d_min=2, d_max=4, placement="sparse", num_registers=4), True),
]


def inputs(case, B=4, seed=0):
    name, grid, prefix_kind, spec, padded = case
    gen = torch.Generator().manual_seed(seed)
    N = grid[0] * grid[1]
    body = torch.randint(0, V, (B, N), generator=gen)
    prefix = torch.randint(0, C, (B,), generator=gen) if prefix_kind == "class" else torch.randint(0, V, (B, 3), generator=gen)
    P = 1 if prefix_kind == "class" else 3
    lengths = torch.tensor([N, N - 3, N - 5, N - 1][:B]) if padded else None
    lay = make_layout(B, grid, P, spec, torch.Generator().manual_seed(seed + 1), lengths)
    return body, prefix, lay


def run(m, body, prefix, lay, vis="split", h=None):
    T, R = lay.num_regular, lay.num_registers
    if vis == "split":
        vis = lay.visibility
    elif vis == "dense":
        vis = Visibility(lay.key_rank, lay.query_limit)
    h = m.embed(body[:, : T - lay.prefix_len], prefix, R) if h is None else h
    return m.logits(m.hidden(h, lay.position_ids, vis))


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@torch.no_grad()
def test_regular_logits_unchanged_by_registers(case, backend):
    m = tiny(prefix=case[2], rope="2d" if case[1][0] > 1 else "1d")
    set_backend(m, backend)
    body, prefix, lay = inputs(case)
    T = lay.num_regular
    assert lay.num_registers > 0
    with_regs = run(m, body, prefix, lay)
    without = m(body[:, : T - lay.prefix_len], lay.position_ids[:, :T], prefix)
    torch.testing.assert_close(with_regs[:, :T], without, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@torch.no_grad()
def test_register_blind_to_future_and_other_registers(case):
    m = tiny(prefix=case[2], rope="2d" if case[1][0] > 1 else "1d")
    body, prefix, lay = inputs(case)
    T, R, P = lay.num_regular, lay.num_registers, lay.prefix_len
    base_h = m.embed(body[:, : T - P], prefix, R)
    base = run(m, body, prefix, lay, h=base_h)
    gen = torch.Generator().manual_seed(7)
    checked = 0
    for b in range(body.shape[0]):
        for r in torch.nonzero(lay.reg_valid[b]).flatten().tolist()[:4]:
            a = P + int(lay.reg_anchor[b, r])               # last regular index it may see
            h = base_h.clone()
            h[b, a + 1:T] += torch.randn(h[b, a + 1:T].shape, generator=gen)   # later regular tokens
            others = [T + j for j in range(R) if j != r]
            h[b, others] += torch.randn(h[b, others].shape, generator=gen)    # other registers
            out = run(m, body, prefix, lay, h=h)
            torch.testing.assert_close(out[b, T + r], base[b, T + r], rtol=1e-5, atol=1e-5)
            # and it does see its anchor
            h2 = base_h.clone()
            h2[b, a] += 1.0
            assert not torch.allclose(run(m, body, prefix, lay, h=h2)[b, T + r], base[b, T + r])
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@torch.no_grad()
def test_backends_and_layouts_agree(case):
    m = tiny(prefix=case[2])
    body, prefix, lay = inputs(case)
    ref = run(m, body, prefix, lay, vis="dense")           # SDPA with a dense boolean mask
    split = run(m, body, prefix, lay, vis="split")         # causal block + register block
    torch.testing.assert_close(split, ref, rtol=1e-5, atol=1e-5)
    set_backend(m, "flex")
    torch.testing.assert_close(run(m, body, prefix, lay), ref, rtol=1e-5, atol=1e-5)
    set_backend(m, "sdpa")
    # interleaved physical order (each register right after its anchor) gives the same outputs
    order = lay.interleaved_order()
    h = m.embed(body[:, : lay.num_regular - lay.prefix_len], prefix, lay.num_registers)
    h_perm = h.gather(1, order[..., None].expand(-1, -1, h.shape[-1]))
    pos_perm = lay.position_ids.gather(1, order[..., None].expand(-1, -1, 2))
    vis = Visibility(lay.key_rank, lay.query_limit).permute(order)
    out = m.logits(m.hidden(h_perm, pos_perm, vis))
    torch.testing.assert_close(out, ref.gather(1, order[..., None].expand(-1, -1, ref.shape[-1])),
                               rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_kv_cache_decoding_matches_full_forward():
    m = tiny(register=False)
    grid, B = (3, 4), 3
    body = torch.randint(0, V, (B, 12))
    labels = torch.randint(0, C, (B,))
    pos = regular_position_ids(grid, 1).expand(B, -1, -1)
    full = m(body[:, :-1], pos, labels)
    m.setup_cache(B, 12)
    step = [m.decode(None, pos[:, :1], 0, prefix=labels)]
    for t in range(11):
        step.append(m.decode(body[:, t:t + 1], pos[:, t + 1:t + 2], t + 1))
    torch.testing.assert_close(torch.cat(step, 1), full, rtol=1e-5, atol=1e-5)
    # chunked prefill (prompt of several tokens) matches too
    m.setup_cache(B, 12)
    pre = m.decode(body[:, :4], pos[:, :5], 0, prefix=labels)
    torch.testing.assert_close(pre, full[:, :5], rtol=1e-5, atol=1e-5)
    m.clear_cache()


def test_gpt_b_parameter_count():
    m = GPT(ModelConfig(preset="B"))
    n = m.num_params()
    assert abs(n - 111e6) / 111e6 < 0.01, n
    assert model_shape(ModelConfig(preset="B")).ffn_dim == 2048
    assert model_shape(ModelConfig(preset="L")).ffn_dim == 2816
    assert model_shape(ModelConfig(preset="XL")).ffn_dim == 3584


# ---------------------------------------------------------------- LlamaGen interop

def llamagen_state_dict(n_layer, dim, n_head, vocab, classes, seed=0):
    """A state dict in LlamaGen's c2i GPT key layout, random values."""
    g = torch.Generator().manual_seed(seed)
    hidden = -(-int(2 * 4 * dim / 3) // 256) * 256
    r = lambda *s: torch.randn(*s, generator=g) * 0.1
    sd = {"tok_embeddings.weight": r(vocab, dim), "cls_embedding.embedding_table.weight": r(classes + 1, dim),
          "norm.weight": 1 + r(dim), "output.weight": r(vocab, dim)}
    for i in range(n_layer):
        p = f"layers.{i}."
        sd.update({p + "attention.wqkv.weight": r(3 * dim, dim), p + "attention.wo.weight": r(dim, dim),
                   p + "feed_forward.w1.weight": r(hidden, dim), p + "feed_forward.w3.weight": r(hidden, dim),
                   p + "feed_forward.w2.weight": r(dim, hidden), p + "attention_norm.weight": 1 + r(dim),
                   p + "ffn_norm.weight": 1 + r(dim)})
    return sd


def llamagen_reference_logits(sd, n_layer, n_head, labels, idx, grid_size, eps=1e-5):
    """LlamaGen's c2i training forward written out from its published rules: a (cls + grid) table of
    (cos, sin) per head-dim pair, class rows all zero, row frequencies on the first half of pairs."""
    dim = sd["norm.weight"].numel()
    hd = dim // n_head
    half = hd // 2
    freqs = 1.0 / (10000 ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    t = torch.arange(grid_size).float()
    f = torch.outer(t, freqs)
    grid = torch.cat([f[:, None, :].expand(-1, grid_size, -1), f[None, :, :].expand(grid_size, -1, -1)], -1)
    table = torch.stack([grid.cos(), grid.sin()], -1).flatten(0, 1)
    table = torch.cat([torch.zeros(1, hd // 2, 2), table])

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rot(x, fc):
        xs = x.reshape(*x.shape[:-1], -1, 2)
        fc = fc.view(1, xs.shape[1], 1, xs.shape[3], 2)
        return torch.stack([xs[..., 0] * fc[..., 0] - xs[..., 1] * fc[..., 1],
                            xs[..., 1] * fc[..., 0] + xs[..., 0] * fc[..., 1]], -1).flatten(3)

    h = torch.cat([sd["cls_embedding.embedding_table.weight"][labels][:, None], sd["tok_embeddings.weight"][idx]], 1)
    B, L, _ = h.shape
    fc = table[:L]
    for i in range(n_layer):
        p = f"layers.{i}."
        x = norm(h, sd[p + "attention_norm.weight"])
        q, k, v = (x @ sd[p + "attention.wqkv.weight"].T).split(dim, -1)
        q, k, v = (z.view(B, L, n_head, hd) for z in (q, k, v))
        q, k = rot(q, fc), rot(k, fc)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        h = h + a.transpose(1, 2).reshape(B, L, dim) @ sd[p + "attention.wo.weight"].T
        x = norm(h, sd[p + "ffn_norm.weight"])
        ff = (F.silu(x @ sd[p + "feed_forward.w1.weight"].T) * (x @ sd[p + "feed_forward.w3.weight"].T))
        h = h + ff @ sd[p + "feed_forward.w2.weight"].T
    return norm(h, sd["norm.weight"]) @ sd["output.weight"].T


@pytest.mark.parametrize("wrap", ["model", "ema", "bare"])
@torch.no_grad()
def test_llamagen_checkpoint_loads_and_matches(wrap, tmp_path):
    n_layer, dim, n_head, vocab, classes, gs = 2, 64, 4, 40, 7, 4
    sd = llamagen_state_dict(n_layer, dim, n_head, vocab, classes)
    # LlamaGen's train_c2i.py also pickles its argparse arguments next to the weights
    obj = sd if wrap == "bare" else {wrap: sd, "steps": 10, "args": argparse.Namespace(gpt_model="GPT-B")}
    path = tmp_path / "c2i.pt"
    torch.save(obj, path)
    cfg = ModelConfig(preset="custom", n_layer=n_layer, n_head=n_head, dim=dim, vocab_size=vocab,
                      num_classes=classes, cls_rope="zeros", token_dropout=0, resid_dropout=0,
                      ffn_dropout=0, class_dropout=0)
    model = GPT(cfg, register_token=True).eval()
    load_llamagen(model, path)
    labels = torch.tensor([0, 3, 6])
    idx = torch.randint(0, vocab, (3, gs * gs - 1))
    pos = regular_position_ids((gs, gs), 1).expand(3, -1, -1)
    ours = model(idx, pos, labels)
    ref = llamagen_reference_logits(sd, n_layer, n_head, labels, idx, gs)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    # identity rotation on the class token is a different (new-model) default
    model.rotary.cls_rope = "identity"
    assert not torch.allclose(model(idx, pos, labels), ref, atol=1e-4)


def test_llamagen_mismatch_is_clear():
    sd = llamagen_state_dict(2, 64, 4, 40, 7)
    cfg = ModelConfig(preset="custom", n_layer=3, n_head=4, dim=64, vocab_size=40, num_classes=7)
    with pytest.raises(ValueError, match=r"missing \['layers.2"):
        load_llamagen(GPT(cfg), {"model": sd})
    sd2 = dict(sd, extra_thing=torch.zeros(1))
    cfg = ModelConfig(preset="custom", n_layer=2, n_head=4, dim=64, vocab_size=40, num_classes=7)
    with pytest.raises(ValueError, match="unexpected \\['extra_thing'\\]"):
        load_llamagen(GPT(cfg), sd2)
    cfg = ModelConfig(preset="custom", n_layer=2, n_head=4, dim=64, vocab_size=50, num_classes=7)
    with pytest.raises(ValueError, match="shapes differ: tok_embeddings.weight"):
        load_llamagen(GPT(cfg), sd)


# ---------------------------------------------------------------- overfitting

@pytest.mark.parametrize("objective", [
    make("objective", name="ntp"),
    make("objective", name="mutor-2d", d_max=3, reg_weight=0.5),
    make("objective", name="mutor-2d", d_max=3, placement="sparse", num_registers=4),
    make("objective", name="mutor-1d", d_min=1, d_max=3),
    make("objective", name="multihead", d_max=2),
], ids=["ntp", "mutor2d", "mutor2d-sparse", "mutor1d", "multihead"])
def test_tiny_model_overfits(objective):
    torch.manual_seed(0)
    cfg = ModelConfig(preset="tiny", vocab_size=8, num_classes=4, token_dropout=0, resid_dropout=0,
                      ffn_dropout=0, class_dropout=0)
    model = GPT(cfg, register_token=objective.uses_registers())
    loss_fn = build(objective, model)
    batch = Batch(torch.randint(0, 8, (4, 16)), torch.arange(4), (4, 4))
    opt = torch.optim.AdamW(list(model.parameters()) + list(loss_fn.parameters()), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(300):
        out = loss_fn(model.train(), batch, gen)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append((out.loss.item(), out.logs["loss_ntp"].item()))
    assert losses[0][0] > 0.9 * math.log(8)
    # offsets (and sparse anchors) are redrawn every step: compare smoothed tails
    tail, tail_ntp = (sum(x[i] for x in losses[-30:]) / 30 for i in (0, 1))
    assert tail < 0.5 * losses[0][0], tail
    assert tail_ntp < 0.25 * losses[0][1], tail_ntp


# ---------------------------------------------------------------- decoding with extra tokens

@torch.no_grad()
def test_decode_with_extra_tokens_matches_full_forward_and_never_writes_the_cache():
    """A cached step with registers gives the full forward's logits under the same rule; the
    registers leave the cache as a step without them does; per-row starts change nothing."""
    m = tiny()
    grid, B, P, T = (3, 4), 2, 1, 12
    gen = torch.Generator().manual_seed(3)
    body, labels = torch.randint(0, V, (B, T - P), generator=gen), torch.tensor([1, 4])
    pos = regular_position_ids(grid, P).expand(B, -1, -1)
    extra_pos = pos[:, torch.tensor([5, 9, 11, 2])]                  # any position ids
    extra_limit = torch.tensor([[3, 8, 11, -1], [11, 10, 7, 6]])     # last regular index read
    E = extra_limit.shape[1]
    rank = torch.cat([torch.arange(T).expand(B, T), torch.full((B, E), NEVER)], 1)
    vis = Visibility(rank, torch.cat([torch.arange(T).expand(B, T), extra_limit], 1), T)
    full = m.logits(m.hidden(m.embed(body, labels, E), torch.cat([pos, extra_pos], 1), vis))

    def cached(start, extras):
        m.setup_cache(B, T)
        m.decode(body[:, :6], pos[:, :7], 0, prefix=labels)
        kw = dict(extra_positions=extra_pos, extra_limit=extra_limit) if extras else {}
        out = m.decode(body[:, 6:], pos[:, 7:], start, **kw)
        return out, [t.clone() for layer in m.layers for t in layer.attention.cache]

    out, cache = cached(7, True)
    torch.testing.assert_close(out, full[:, 7:], rtol=1e-5, atol=1e-5)
    plain, plain_cache = cached(7, False)
    torch.testing.assert_close(out[:, :T - 7], plain, rtol=1e-5, atol=1e-5)
    for a, b in zip(cache, plain_cache):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    per_row, _ = cached(torch.tensor([7, 7]), True)
    torch.testing.assert_close(per_row, out, rtol=1e-5, atol=1e-5)
    m.clear_cache()


def test_backend_registry_and_auto():
    from mutor2d.model.attention import BACKENDS, resolve_backend
    assert set(BACKENDS) >= {"sdpa", "flex"}
    assert resolve_backend("auto", torch.device("cpu")) == "sdpa"
    assert resolve_backend("auto", torch.device("cuda")) == "flex"
    with pytest.raises(ValueError, match="attention backend 'nope'"):
        resolve_backend("nope", torch.device("cpu"))


@torch.no_grad()
def test_llamagen_384_checkpoint_layout_loads_and_matches(tmp_path):
    """A shape-reduced fake of LlamaGen's 384-px GPT checkpoints (XXL / 3B are the same key layout at
    other sizes): a 24x24 grid, with the precomputed ``freqs_cis`` table of 577 positions and the KV-cache
    buffers their models hold, which load_llamagen drops; logits equal LlamaGen's forward on the grid."""
    n_layer, dim, n_head, vocab, classes, gs = 2, 64, 4, 40, 7, 24
    sd = llamagen_state_dict(n_layer, dim, n_head, vocab, classes, seed=1)
    stored = {**sd, "freqs_cis": torch.zeros(gs * gs + 1, dim // n_head // 2, 2),
              "layers.0.attention.kv_cache.k_cache": torch.zeros(1, n_head, gs * gs + 1, dim // n_head)}
    torch.save({"model": stored, "args": argparse.Namespace(gpt_model="GPT-XXL", image_size=384)}, tmp_path / "c.pt")
    cfg = ModelConfig(preset="custom", n_layer=n_layer, n_head=n_head, dim=dim, vocab_size=vocab,
                      num_classes=classes, cls_rope="zeros", token_dropout=0, resid_dropout=0,
                      ffn_dropout=0, class_dropout=0)
    model = GPT(cfg).eval()
    load_llamagen(model, tmp_path / "c.pt")
    labels, idx = torch.tensor([2, 5]), torch.randint(0, vocab, (2, gs * gs - 1))
    pos = regular_position_ids((gs, gs), 1).expand(2, -1, -1)
    ref = llamagen_reference_logits(sd, n_layer, n_head, labels, idx, gs)
    torch.testing.assert_close(model(idx, pos, labels), ref, rtol=1e-4, atol=1e-4)
