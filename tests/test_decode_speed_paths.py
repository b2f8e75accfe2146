"""The compiled decode step (``sampling.compile_decoder``, what ``sample.py --compile`` runs): on
the CPU inductor freezes the weights and prepacks them for its own GEMM; the KV cache goes in as
arguments. Its logits equal eager decoding up to float rounding, over two batch sizes and a fresh
cache per call, in a bounded number of graphs (no recompile per step or per cache)."""
import pytest
import torch

from mutor2d.model.config import ModelConfig
from mutor2d.model.gpt import GPT
from mutor2d.objectives.layout import regular_position_ids
from mutor2d.sampling.decoding import compile_decoder, generate

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


def tiny_model(seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(preset="custom", n_layer=1, n_head=2, dim=32, vocab_size=17, num_classes=10)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


@torch.no_grad()
def decode_logits(model, rows, grid, tokens):
    """Logits of every decode step (prefix step, then one token per step) -> (N, rows, V)."""
    N = grid[0] * grid[1]
    pos = regular_position_ids(grid, 1, N).expand(rows, N, 2)
    labels = torch.arange(rows) % 10
    model.setup_cache(rows, N)
    out = [model.decode(None, pos[:, :1], 0, prefix=labels)[:, -1]]
    for t in range(1, N):
        out.append(model.decode(tokens[:rows, t - 1:t], pos[:, t:t + 1], t)[:, -1])
    model.clear_cache()
    return torch.stack(out)


def test_compiled_decoder_matches_eager():
    eager, compiled = tiny_model(), tiny_model()
    # freezing as on the CPU by default, without max_autotune's kernel search (seconds per shape,
    # too slow for CI): the plumbing under test (cache as arguments, frozen constants) is the same
    compile_decoder(compiled, inductor={"freezing": True})
    grid = (3, 3)
    tokens = torch.randint(0, 17, (4, 9), generator=torch.Generator().manual_seed(1))
    counters = torch._dynamo.utils.counters
    counters.clear()
    for rows in (4, 2, 4):                     # a fresh cache each call; two batch sizes
        want, got = decode_logits(eager, rows, grid, tokens), decode_logits(compiled, rows, grid, tokens)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the prefix step, the steps in between, the step that fills the cache: not one graph per
    # step or per cache (before: each step recompiled until dynamo's limit, then ran eager)
    assert counters["stats"]["unique_graphs"] <= 3, dict(counters["stats"])
    assert not counters["recompile_limit"]
    # greedy sampling with CFG through generate(): the tokens eager decoding gives
    labels = torch.tensor([1, 7])
    want = generate(eager, labels, grid, cfg_scale=2.0, temperature=0)
    assert torch.equal(generate(compiled, labels, grid, cfg_scale=2.0, temperature=0), want)
    # generate() passes the prefix by position, decode_logits by keyword: GPT.decode passes every
    # argument by position to the compiled step, so no new graph (before: one more)
    assert counters["stats"]["unique_graphs"] <= 3, dict(counters["stats"])
    assert compiled.decode_step is not None and "decode" not in vars(compiled)      # no method replaced
