"""The objectives package trains transformers LMs: NTP, MuToR-1D (dense, sparse) and the multi-head
baseline on a padded batch (either padding side) give the loss and gradients of a reference written
here, sample by sample with no padding, through the plain transformers model (Llama, GPT-2, Qwen2;
the sliding-window families, whose window the plain model counts in slots, not position ids, are
checked against the plain model in tests/test_lm.py):

* NTP: the model on prompt + a_0..a_{N-2}; the last prompt token and each answer input predict the
  next answer token.
* a register anchored at a_t (t = -1: the last prompt token) with offset d: the model on
  prompt + a_0..a_t followed by the register embedding at position id P + t + d - 1 (under plain
  causal attention the register sees exactly its anchor's past and itself); it predicts a_{t+d}.
* head k (offset d): the model with its last layer swapped for head k's layer; the input at a_t
  predicts a_{t+d}.
Each term is a mean over its targets pooled over the batch; loss = (1 - a) CE_ntp + a CE_aux (for
heads CE_aux = the plain mean of the heads' terms)."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
pytest.importorskip("peft")

from test_lm import ragged_batch, tiny_gpt2, tiny_llama, tiny_qwen2  # noqa: E402

from mutor2d.lm import hf  # noqa: E402
from mutor2d.lm.config import LMModelConfig, load  # noqa: E402
from mutor2d.lm.model import LAYERS, decoder_part, frame_batch  # noqa: E402
from mutor2d.lm.run import LMTrainModule  # noqa: E402
from mutor2d.objectives.layout import make_layout  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

A = 0.3
OBJECTIVES = {"ntp": {"name": "ntp"},
              "dense": {"name": "mutor-1d", "d_max": 3, "reg_weight": A},
              "sparse": {"name": "mutor-1d", "d_max": 4, "reg_weight": A, "placement": "sparse", "num_registers": 3},
              "multihead": {"name": "multihead", "d_max": 4, "reg_weight": A}}


def samples(batch):
    """[(prompt ids, answer ids)] without padding."""
    return [(batch.prompt[b, :int(P)], batch.answer[b, :int(N)])
            for b, (P, N) in enumerate(zip(batch.prompt_len, batch.answer_len))]


def pooled(terms: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Mean CE over every (logits (n, V), targets (n,)) pair's rows together."""
    logits = torch.cat([lg for lg, _ in terms])
    return F.cross_entropy(logits.float(), torch.cat([t for _, t in terms]))


def ntp_terms(lm, batch):
    terms = []
    for p, a in samples(batch):
        logits = lm(input_ids=torch.cat([p, a[:-1]])[None]).logits[0]
        terms.append((logits[len(p) - 1:], a))
    return terms


def register_terms(lm, model, batch, registers):
    """registers: [(sample, anchor t, offset d)]."""
    embed, terms = lm.get_input_embeddings(), []
    pairs = samples(batch)
    for b, t, d in registers:
        p, a = pairs[b]
        ids = torch.cat([p, a[:t + 1]])
        h = torch.cat([embed(ids), model.register_embedding[None]])[None]
        pos = torch.cat([torch.arange(len(ids)), torch.tensor([len(p) + t + d - 1])])[None]
        out = lm.get_decoder()(inputs_embeds=h, position_ids=pos).last_hidden_state
        terms.append((lm.get_output_embeddings()(out[0, -1:]), a[t + d:t + d + 1]))
    return terms


def head_terms(lm, head, d, batch):
    """Head ``head`` at offset d: the model with its last layer swapped for the head's layer."""
    layers = decoder_part(lm, LAYERS)
    last, layers[-1] = layers[-1], head
    try:
        terms = []
        for p, a in samples(batch):
            logits = lm(input_ids=torch.cat([p, a[:-1]])[None]).logits[0]
            anchors = torch.arange(-1, max(len(a) - d, -1))        # t with a_{t+d} in the answer
            terms.append((logits[len(p) + anchors], a[anchors + d]))
        return terms
    finally:
        layers[-1] = last


def drawn_registers(cfg, batch, seed):
    """[(sample, anchor, offset d)] of the layout the objective draws from ``seed``; dense anchors are
    checked against the hand rule (every t >= -1 with a_{t+d} in the answer)."""
    spec = cfg.objective.register_spec()
    _, canon = frame_batch(None, batch, spec, "right", "cpu")
    lay = make_layout(len(batch.prompt_len), canon.grid, canon.prefix.shape[1], spec,
                      torch.Generator().manual_seed(seed), canon.lengths)
    out = []
    for b, N in enumerate(batch.answer_len.tolist()):
        valid = lay.reg_valid[b]
        anchors, ds = lay.reg_anchor[b][valid].tolist(), lay.reg_offset[b][valid][:, 1].tolist()
        assert all(t + d < N for t, d in zip(anchors, ds))
        if spec.placement == "dense":                             # one offset per sequence, every slot
            assert anchors == list(range(-1, N - int(lay.reg_offset[b, 0, 1])))
        out += [(b, t, d) for t, d in zip(anchors, ds)]
    return out


def reference_loss(lm, model, cfg, batch, seed):
    ntp = pooled(ntp_terms(lm, batch))
    o = cfg.objective
    if o.name == "ntp":
        return ntp
    if o.name == "multihead":
        offsets = o.register_spec().offsets()[:, 1].tolist()
        aux = torch.stack([pooled(head_terms(lm, head, d, batch)) for head, d in zip(model.heads, offsets)]).mean()
    else:
        aux = pooled(register_terms(lm, model, batch, drawn_registers(cfg, batch, seed)))
    return (1 - A) * ntp + A * aux


def grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2"])      # sliding-window models: test_lm.py
@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_lm_losses_and_gradients_equal_the_reference(family, objective):
    cfg = load({"model": {"hf": "x"}, "data": {"path": "d"}, "objective": OBJECTIVES[objective]})
    lm = {"llama": tiny_llama, "gpt2": tiny_gpt2, "qwen2": tiny_qwen2}[family]()
    model = hf.build(lm, LMModelConfig(hf="x", finetune="full"), cfg.objective)
    if model.has_registers:
        with torch.no_grad():
            model.register_embedding.normal_(generator=torch.Generator().manual_seed(5))
    batch, seed = ragged_batch(), 3
    want = reference_loss(model.lm, model, cfg, batch, seed)
    want_grads = grads(model, want)
    for side in ("left", "right"):
        got = LMTrainModule(model, cfg.objective, side)(batch, torch.Generator().manual_seed(seed)).loss
        assert abs(float(got.detach() - want.detach())) <= 1e-6, (side, float(got), float(want))
        got_grads = grads(model, got)
        assert got_grads.keys() == want_grads.keys()
        for n in want_grads:
            torch.testing.assert_close(got_grads[n], want_grads[n], atol=1e-6, rtol=1e-5, msg=n)
