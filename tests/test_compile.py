"""torch.compile of the training step (the ``train.compile`` path: each transformer block compiled
on its own): no graph breaks, and one graph per block over several steps, also when the number of
register slots R changes from batch to batch (dense registers draw one offset per sequence)."""
import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from mutor2d.config import ModelConfig, ObjectiveConfig
from mutor2d.model import GPT
from mutor2d.objectives import Batch, build_objective

CASES = {
    "ntp": ObjectiveConfig(name="ntp"),
    "mutor-2d-dense": ObjectiveConfig(name="mutor-2d", d_max=3, reg_weight=0.5, placement="dense"),
    "mutor-2d-sparse": ObjectiveConfig(name="mutor-2d", d_max=3, reg_weight=0.5, placement="sparse",
                                       num_registers=5),
    "mutor-1d-dense": ObjectiveConfig(name="mutor-1d", d_min=1, d_max=4, reg_weight=0.5, placement="dense"),
}


def _model(registers: bool) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(preset="custom", n_layer=2, n_head=2, dim=32, vocab_size=17, num_classes=10,
                      attention="sdpa")        # FlexAttention has no backward on CPU
    return GPT(cfg, register_token=registers).train()


def _steps(model, objective, n: int) -> tuple[list[float], list[int]]:
    """n training steps (forward, backward, AdamW) on fresh random batches: losses, tokens."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    losses, tokens = [], []
    for _ in range(n):
        body = torch.randint(0, 17, (3, 16), generator=gen)
        out = objective(model, Batch(body, torch.randint(0, 10, (3,), generator=gen), (4, 4)), gen)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
        tokens.append(int(out.tokens))
    return losses, tokens


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_blocks_one_graph_no_breaks(case):
    cfg = CASES[case]
    eager = _model(cfg.name != "ntp")
    eager_losses, tokens = _steps(eager, build_objective(cfg, eager), 4)
    if case.endswith("dense"):
        assert len(set(tokens)) > 1, "the batches should change R (the test would prove nothing)"
    torch._dynamo.reset()
    counters.clear()
    model = _model(cfg.name != "ntp")
    for block in model.layers:                 # as engine.setup does with train.compile
        block.compile(backend="aot_eager")     # dynamo's counts do not depend on the backend
    losses, _ = _steps(model, build_objective(cfg, model), 4)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert losses == pytest.approx(eager_losses, rel=1e-5)


def _decode_all(model, rows: int, grid=(4, 4)) -> torch.Tensor:
    """Cached decoding of every position (no sampling): logits (rows, N, vocab)."""
    from mutor2d.registers import regular_position_ids
    N = grid[0] * grid[1]
    pos = regular_position_ids(grid, 1, N).expand(rows, N, 2)
    tok = torch.zeros(rows, 1, dtype=torch.long)
    model.setup_cache(rows, N)
    out = [model.decode(None, pos[:, :1], 0, prefix=torch.arange(rows) % 10)]
    out += [model.decode(tok, pos[:, t:t + 1], t) for t in range(1, N)]
    return torch.cat(out, 1)


@torch.no_grad()
def test_compiled_blocks_decode_graphs_bounded():
    """Decoding through the compiled blocks (the training-time sample grid): a bounded number of
    graphs, whatever the batch size: first step (ints 0/1 specialised), the rest, the full cache."""
    eager = _model(False).eval()
    want = [_decode_all(eager, rows) for rows in (4, 2)]
    torch._dynamo.reset()
    counters.clear()
    model = _model(False).eval()
    for block in model.layers:
        block.compile(backend="aot_eager")
    got = [_decode_all(model, rows) for rows in (4, 2)]
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] <= 3, dict(counters["stats"])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
