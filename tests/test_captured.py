"""The captured decode step (mutor2d.sampling.captured) on the CPU, with a stand-in for CUDA graphs that
has their semantics: ``capture`` runs the function once, and a replay recomputes it from the static
buffers only, into the same output buffer. Plain decoding through it gives eager's logits at every
index, greedy eager's tokens, plain sampling's exact distribution (with and without CFG, a prompt
prefix), one capture per batch; bad use is one line."""
import pytest
import torch

from mutor2d.config import make
from mutor2d.objectives.layout import regular_position_ids
from mutor2d.sampling.captured import CapturedStep, capture_decoder
from mutor2d.sampling.decoding import run_decoder
from mutor2d.sampling.rules import SamplingRules as Rules

from test_speculative import chi_square_p, exact_distribution, tiny

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


class EagerGraphs:
    """CUDA graph semantics on the CPU: a replay reruns the captured function into its output buffer."""

    def __init__(self):
        self.captures = self.replays = 0

    def capture(self, fn):
        out, graphs = fn(), self

        class Graph:
            def replay(self):
                graphs.replays += 1
                out.copy_(fn())
        self.captures += 1
        return Graph(), out

    def summary(self) -> str:
        return f"stand-in: {self.captures} capture(s)"


def plain(m, prefix, grid, rules, seed=0):
    mode = make("sample.decode", name="plain")
    return run_decoder(m, prefix, grid, rules, mode, None, torch.Generator(device=prefix.device).manual_seed(seed))


def test_the_fixed_step_gives_eager_logits_at_every_index():
    """fixed_decode over the whole cache, masked, equals eager_decode over its first index + 1 entries,
    and a replay after other indices reads only its inputs' buffers (no stale input)."""
    m, grid, B = tiny(V=5, small=True, layers=2), (3, 3), 4
    prefix = torch.tensor([0, 1, 1, 0])
    tokens = torch.randint(0, 5, (B, 9), generator=torch.Generator().manual_seed(1))
    pos = regular_position_ids(grid, 1, 10).expand(B, -1, -1)
    with torch.no_grad():
        m.setup_cache(B, 10)
        m.eager_decode(None, pos[:, :1], 0, prefix)
        eager = [m.eager_decode(tokens[:, i:i + 1], pos[:, i + 1:i + 2], i + 1) for i in range(8)]
        m.setup_cache(B, 10)
        m.eager_decode(None, pos[:, :1], 0, prefix)
        step = CapturedStep(m, B, EagerGraphs())
        fixed = [step(tokens[:, i:i + 1].clone(), pos[:, i + 1:i + 2].clone(), i + 1) for i in range(8)]
    for i, (a, b) in enumerate(zip(eager, fixed)):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5, msg=f"index {i + 1}")
    assert step.graphs.captures == 1 and step.graphs.replays == 8


@pytest.mark.parametrize("rules", [Rules(temperature=0.0), Rules(temperature=0.0, cfg_scale=3.0, guided=True)],
                         ids=["greedy", "greedy-cfg"])
def test_greedy_tokens_are_eager_greedy_tokens_and_each_batch_captures_once(rules):
    m, grid = tiny(V=7), (4, 4)
    prefix = torch.tensor([0, 1, 1, 0, 1, 0])
    with torch.no_grad():
        eager = plain(m, prefix, grid, rules)
        graphs = EagerGraphs()
        capture_decoder(m, graphs)
        captured = [plain(m, prefix, grid, rules) for _ in range(2)]
        m.decode_graphs = None
    assert all(torch.equal(c, eager) for c in captured)
    assert graphs.captures == 2 and graphs.replays == 2 * (grid[0] * grid[1] - 1)


CASES = [("temp", "class", Rules(temperature=1.3)),
         ("cfg-topk", "class", Rules(cfg_scale=2.0, temperature=0.9, top_k=2, guided=True)),
         ("prompt-topp", "prompt", Rules(temperature=1.1, top_p=0.8))]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_captured_plain_sampling_follows_the_exact_distribution(case):
    _, kind, rules = case
    m, grid = tiny(V=3, prefix=kind, rope="2d", small=True), (2, 2)
    prefix = torch.tensor([2, 0]) if kind == "prompt" else torch.tensor(1)
    capture_decoder(m, EagerGraphs())
    with torch.no_grad():
        out = plain(m, prefix.expand(6000, *prefix.shape), grid, rules, seed=3)
    m.decode_graphs = None
    assert chi_square_p(out, exact_distribution(m, prefix, grid, rules)) > 1e-3


def test_registers_and_jacobi_rounds_stay_eager_under_capture():
    """Speculative rounds (K > 0) are not the fixed step: nothing is captured, the tokens are eager's."""
    m, grid, rules = tiny(V=5), (3, 3), Rules(temperature=0.0)
    prefix = torch.tensor([0, 1])
    mode = make("sample.decode", name="jacobi", window=2)
    with torch.no_grad():
        eager = run_decoder(m, prefix, grid, rules, mode)
        graphs = EagerGraphs()
        capture_decoder(m, graphs)
        captured = run_decoder(m, prefix, grid, rules, mode)
        m.decode_graphs = None
    assert torch.equal(captured, eager) and graphs.captures == 0


def test_capturing_a_cpu_model_without_a_stand_in_is_one_line():
    with pytest.raises(ValueError, match="CUDA graphs need the model on a CUDA device"):
        capture_decoder(tiny(V=3, small=True))


def test_sample_py_captures_on_request_and_writes_the_eager_grid(tiny_digits_run, tmp_path, monkeypatch, capsys):
    """sample.py --capture (the CUDA default) through the stand-in on the CPU: the same PNG bytes as
    --no-capture, and the capture said once; on the CPU without a stand-in, one line, exit 2."""
    from mutor2d.sampling import captured
    from test_reliability_v2 import exit_line, script
    sample = script("sample")
    args = ["--ckpt", str(tiny_digits_run), "--device", "cpu", "--decode", "plain", "--seed", "3"]
    code, line = exit_line(sample, [*args, "--capture", "--out", str(tmp_path / "x.png")])
    assert code == 2 and line.startswith("error: ") and "CUDA graphs need the model on a CUDA device" in line
    graphs = EagerGraphs()
    real = captured.capture_decoder
    monkeypatch.setattr(captured, "capture_decoder", lambda model: real(model, graphs))
    capsys.readouterr()
    sample([*args, "--capture", "--out", str(tmp_path / "a.png")])
    out = capsys.readouterr().out
    sample([*args, "--no-capture", "--out", str(tmp_path / "b.png")])
    assert graphs.captures >= 1 and out.count("stand-in: ") == 1
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (bench/gpu.sh runs it)")
@pytest.mark.parametrize("guided", [False, True], ids=["plain", "cfg"])
def test_cuda_graph_decoding_gives_eager_greedy_tokens_cuda(guided):
    """The real CUDA graph (CudaGraphs): greedy tokens equal eager greedy's, two batches, one capture each."""
    m = tiny(V=7).cuda()
    rules = Rules(temperature=0.0, cfg_scale=3.0, guided=True) if guided else Rules(temperature=0.0)
    prefix = torch.tensor([0, 1, 1, 0], device="cuda")
    with torch.no_grad():
        eager = plain(m, prefix, (4, 4), rules)
        capture_decoder(m)
        captured = [plain(m, prefix, (4, 4), rules) for _ in range(2)]
    assert all(torch.equal(c, eager) for c in captured) and m.decode_graphs.captures == 2
