"""bf16, the dtype a GPU run takes first: a training step under autocast and sampling with bf16
weights run on CPU through the same code (RoPE, register masks, KV cache, logits, losses)."""
import pytest
import torch

from mutor2d import config as C
from mutor2d.model.gpt import GPT
from mutor2d.objectives.base import Batch
from mutor2d.registry import build
from mutor2d.sampling.decoding import generate

pytestmark = pytest.mark.usefixtures("one_thread")

GRID = (4, 4)


def tiny_model(objective: str, **obj):
    torch.manual_seed(0)
    cfg = C.from_dict({"model": {"preset": "custom", "n_layer": 2, "n_head": 2, "dim": 32, "vocab_size": 11,
                                 "num_classes": 3, "attention": "sdpa", "token_dropout": 0.0,
                                 "resid_dropout": 0.0, "ffn_dropout": 0.0, "class_dropout": 0.0,
                                 "init_std": 0.2},
                       "objective": {"name": objective, **obj}})
    model = GPT(cfg.model, register_token=objective != "ntp")
    torch.nn.init.normal_(model.output.weight, 0, 0.2)       # not the zero init: logits must vary
    return model, build(cfg.objective, model)


def batch(B=4):
    g = torch.Generator().manual_seed(1)
    return Batch(torch.randint(0, 11, (B, 16), generator=g), torch.randint(0, 3, (B,), generator=g), GRID)


@pytest.mark.parametrize("objective,obj", [("ntp", {}), ("mutor-2d", {"d_max": 3}),
                                           ("mutor-2d", {"d_max": 3, "placement": "sparse", "num_registers": 5}),
                                           ("mutor-1d", {"d_max": 3})])
def test_bf16_autocast_step_matches_fp32_within_bf16_tolerance(objective, obj):
    model, loss_fn = tiny_model(objective, **obj)
    b = batch()
    full = loss_fn(model, b, torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = loss_fn(model, b, torch.Generator().manual_seed(2))
    assert half.loss.dtype == torch.float32                   # logits and losses are float32
    assert abs(half.loss.item() - full.loss.item()) < 2e-2 * full.loss.item()
    half.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_bf16_weights_sample_like_fp32_greedy():
    model, _ = tiny_model("mutor-2d", d_max=3)
    model.eval()
    labels = torch.tensor([0, 1, 2])
    ref = generate(model, labels, GRID, cfg_scale=2.0, temperature=0.0)
    low = generate(model.to(torch.bfloat16), labels, GRID, cfg_scale=2.0, temperature=0.0)
    assert low.shape == ref.shape and low.dtype == torch.long
    assert (low == ref).float().mean() > 0.7                   # bf16 rounding may flip near-ties only
    g = torch.Generator().manual_seed(0)
    drawn = generate(model, labels, GRID, cfg_scale=2.0, temperature=1.0, top_k=5, top_p=0.9, generator=g)
    assert drawn.min() >= 0 and drawn.max() < 11
