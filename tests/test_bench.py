"""Benchmarks and the fast attention path: each benchmark's --quick mode prints one JSON object
with the expected keys on its last line; the benchmark's no-cache sampler draws what the KV-cache
sampler draws; the split SDPA register path is exact (outputs and gradients, float64) against the
dense-mask reference, including registers that see only themselves and multi-block lengths."""
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mutor2d.model.attention import BACKENDS, Visibility
from mutor2d.model.config import ModelConfig
from mutor2d.model.gpt import GPT
from mutor2d.objectives.spec import RegisterSpec1D, RegisterSpec2D
from mutor2d.objectives.layout import make_layout
from mutor2d.registry import build
from mutor2d.sampling.decoding import generate
from timeouts import limit

ROOT = Path(__file__).resolve().parent.parent


def run_bench(script: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, f"bench/{script}", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=limit(300))
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    return json.loads(last)


def finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_train_step_quick_json():
    out = run_bench("train_step.py", "--quick", "--profile", "2")
    assert out["bench"] == "train_step"
    assert {"date", "nproc", "cpu", "torch"} <= set(out["machine"])
    s = out["settings"]
    assert s["T"] == 256 and s["registers_sparse"] == 80 and 80 < s["registers_dense"] <= 255
    assert "sdpa" in out["backends"] and "sdpa-mask" in out["backends"]
    assert "flex" in out["skipped"]                      # no FlexAttention backward on CPU
    for b in out["backends"]:
        for case in ("ntp", "sparse", "dense"):
            assert finite_positive(out["time_s"][f"{b}/{case}"])
        r = out["ratios"][b]
        for key in ("sparse_time", "dense_time", "sparse_time_vs_ideal", "dense_time_vs_ideal"):
            assert finite_positive(r[key]), (b, key)
        assert r["sparse_ideal"] == pytest.approx((256 + 80) / 256, rel=1e-3)
    main = out["main_backend"]
    assert main == "sdpa"
    assert finite_positive(out["ratios"][main]["dense_mem"])
    assert all(finite_positive(v) for v in out["step_peak_mb"][main].values())
    mfu = out["mfu"]
    assert 0 < mfu["fraction_of_matmul"] < 2 and finite_positive(mfu["matmul_flops_per_s"])
    assert {"sparse_time_le_1.35", "dense_time_le_2.05", "sparse_mem_le_1.35", "mfu_ge_0.7"} <= set(out["targets"])
    assert all(isinstance(v, bool) for v in out["targets"].values())
    for name, prof in out["profile"].items():           # one profiled step per case, slowest operators first
        assert name in {f"{b}/{c}" for b in out["backends"] for c in ("ntp", "sparse", "dense")}
        top = [op["self_ms"] for op in prof["top"]]
        assert len(top) == 2 and top == sorted(top, reverse=True) and 0 < sum(top) <= prof["self_ms"]


def test_sample_quick_json():
    out = run_bench("sample.py", "--quick")
    assert out["bench"] == "sample"
    for case in ("kv", "kv_cfg", "recompute"):
        t = out["throughput"][case]
        assert finite_positive(t["images_per_s"]) and finite_positive(t["tokens_per_s"])
        assert t["tokens_per_s"] == pytest.approx(t["images_per_s"] * out["settings"]["tokens"], rel=1e-2)
    assert finite_positive(out["ratios"]["kv_speedup"]) and finite_positive(out["ratios"]["cfg_cost"])
    step = out["decode_step"]
    assert step["batch"] == 4 and finite_positive(step["floor_s"]) and finite_positive(step["step_vs_floor"])
    assert {"kv_speedup_ge_10", "cfg_cost_le_2.1", "step_vs_floor_le_2"} <= set(out["targets"])


def test_register_attention_json_and_the_two_ways_agree():
    """Both ways of the registers' attention give the same outputs and gradients (the JSON's max |diff|)."""
    out = run_bench("register_attention.py", "--batch", "2", "--dim", "32", "--heads", "2", "--tokens", "24",
                    "--sparse", "5", "--reps", "1", "--threads", "1")
    assert out["bench"] == "register_attention" and set(out["cases"]) == {"dense", "sparse"}
    for case, E in zip(("dense", "sparse"), (24, 5)):
        c = out["cases"][case]
        assert c["registers"] == E and float(c["max_abs_diff_split_vs_lse"]) < 1e-5
        assert all(finite_positive(c["time_s"][k]) for k in ("ntp", "split", "lse"))


def _load_bench(name: str):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_bench_bad_argument_is_one_line(capsys):
    """In this process (the script itself runs in test_train_step_quick_json): argparse's exit."""
    with pytest.raises(SystemExit) as stop:
        _load_bench("train_step").main(["--grid", "16"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert "--grid '16': expected HxW" in err and "Traceback" not in err
    for name, argv, message in (("train_step", ["--backends", "bogus"], "unknown backend 'bogus'"),
                                ("sample", ["--dim", "10", "--heads", "3"], "--dim 10 is not divisible by --heads 3")):
        with pytest.raises(SystemExit) as stop:                      # the checks after parsing: one line too
            _load_bench(name).parse(argv)
        assert stop.value.code == 2 and message in capsys.readouterr().err


def test_recompute_sampler_draws_what_kv_cache_draws():
    bench = _load_bench("sample")
    torch.manual_seed(0)
    cfg = ModelConfig(preset="tiny", vocab_size=32, num_classes=5)
    model = GPT(cfg).eval()
    with torch.no_grad():
        model.output.weight.normal_(0, 0.5)
    labels = torch.tensor([0, 3, 4])
    kv = generate(model, labels, (3, 4), generator=torch.Generator().manual_seed(5))
    full = bench.recompute(model, labels, (3, 4), torch.Generator().manual_seed(5))
    assert torch.equal(kv, full)
    assert len(set(kv.flatten().tolist())) > 3            # a real draw, not a constant


def test_step_flops_counts_every_matmul_weight():
    bench = _load_bench("train_step")
    model = GPT(ModelConfig(preset="B"))
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    T, B = 256, 4
    attn = model.shape.n_layer * 2 * B * T ** 2 * model.shape.dim
    assert bench.step_flops(model, B, T) == 3 * (2 * linear * B * T + attn)


SPLIT_CASES = [
    ("2d-dense-16x16", (16, 16), 1, RegisterSpec2D(d_max=4), None),
    ("2d-sparse", (16, 16), 1, RegisterSpec2D(placement="sparse", num_registers=80), None),
    ("1d-padded", (1, 40), 3, RegisterSpec1D(d_min=2, d_max=4), torch.tensor([40, 9, 3])),
]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_split_attention_is_exact_with_gradients(case):
    _, grid, P, spec, lengths = case
    B, heads, hd = 3, 2, 16
    lay = make_layout(B, grid, P, spec, torch.Generator().manual_seed(0), lengths)
    T, R = lay.num_regular, lay.num_registers
    if lengths is not None:                               # some registers see only themselves
        assert (~lay.reg_valid).any()
    vis = lay.visibility
    assert vis.num_regular == T
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, heads, T + R, hd, generator=g, dtype=torch.float64).requires_grad_()
               for _ in range(3))
    w = torch.randn(B, heads, T + R, hd, generator=g, dtype=torch.float64)

    def run(fn):
        out = fn()
        return (out, *torch.autograd.grad((out * w).sum(), (q, k, v)))

    fast = run(lambda: BACKENDS["sdpa"].attend(q, k, v, vis))
    ref = run(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=Visibility(lay.key_rank, lay.query_limit).dense_mask()))
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert vis.extra_mask().shape == (B, 1, R, T + R)     # no (L x L) mask on the fast path
    assert "extra_mask" in vis._cache                      # built once, reused by every layer


# ---------------------------------------------------------------- CUDA (run by bench/gpu.sh)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _cuda_model(register=True):
    torch.manual_seed(0)
    cfg = ModelConfig(preset="custom", n_layer=2, n_head=4, dim=128, vocab_size=64, num_classes=10,
                      token_dropout=0, resid_dropout=0, ffn_dropout=0, class_dropout=0)
    model = GPT(cfg, register_token=register).cuda()
    with torch.no_grad():
        model.output.weight.normal_(0, 0.05)
    return model


def _set_backend(model, name):
    for layer in model.layers:
        layer.attention.backend = name


def _forward_backward(model, backend, lay, body, labels, dtype):
    _set_backend(model, backend)
    model.zero_grad(set_to_none=True)
    T, R = lay.num_regular, lay.num_registers
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        h = model.embed(body[:, : T - 1], labels, R)
        logits = model.logits(model.hidden(h, lay.position_ids, lay.visibility))
    logits.square().mean().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return logits.detach(), grads


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("spec", [RegisterSpec2D(d_max=4),
                                  RegisterSpec2D(placement="sparse", num_registers=80)],
                         ids=["dense", "sparse"])
def test_cuda_flex_compiled_matches_sdpa_split(spec, dtype):
    model = _cuda_model()
    B, grid = 4, (16, 16)
    body = torch.randint(0, 64, (B, 256), device="cuda")
    labels = torch.randint(0, 10, (B,), device="cuda")
    lay = make_layout(B, grid, 1, spec, torch.Generator().manual_seed(0), device="cuda")
    flex = _forward_backward(model, "flex", lay, body, labels, dtype)
    sdpa = _forward_backward(model, "sdpa", lay, body, labels, dtype)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(flex[0], sdpa[0], rtol=tol, atol=tol)
    assert ((flex[1] - sdpa[1]).norm() / sdpa[1].norm()).item() < tol      # gradients
    # registers never change the regular tokens' logits, on the compiled kernel too
    _set_backend(model, "flex")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        T = lay.num_regular
        plain = model.logits(model.hidden(model.embed(body[:, : T - 1], labels), lay.position_ids[:, :T]))
    torch.testing.assert_close(flex[0][:, :T], plain, rtol=tol, atol=tol)


@cuda
def test_cuda_bf16_training_step_and_kv_decoding():
    from mutor2d.config import make
    from mutor2d.objectives.base import Batch
    from mutor2d.objectives.layout import regular_position_ids
    model = _cuda_model()
    _set_backend(model, "auto")
    obj = build(make("objective", name="mutor-2d", placement="sparse", num_registers=80), model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    batch = Batch(torch.randint(0, 64, (4, 256), device="cuda"), torch.arange(4, device="cuda"), (16, 16))
    losses = []
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = obj(model.train(), batch, torch.Generator(device="cuda").manual_seed(0))
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    model.eval()
    pos = regular_position_ids((16, 16), 1).cuda().expand(2, -1, -1)
    body, labels = batch.body[:2], batch.prefix[:2]
    with torch.no_grad():
        full = model(body[:, :-1], pos, labels)
        model.setup_cache(2, 256)
        steps = [model.decode(None, pos[:, :1], 0, prefix=labels)]
        steps += [model.decode(body[:, t:t + 1], pos[:, t + 1:t + 2], t + 1) for t in range(255)]
        model.clear_cache()
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-4)


def test_scaling_table_covers_the_largest_presets_and_8b_fine_tuning(capsys):
    """bench/scaling.py: XXL / 3B at 384 px (FSDP2 divides the states by the GPU count) and Llama-3-8B
    (full fine-tuning fits only under FSDP2), computed on the meta device."""
    spec = importlib.util.spec_from_file_location("scaling", ROOT / "bench" / "scaling.py")
    scaling = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scaling)
    scaling.main(["--presets", "XXL,3B", "--grid", "24", "--batch", "256"])
    rows = json.loads(capsys.readouterr().out.splitlines()[-1])["rows"]
    xxl = next(r for r in rows if r["preset"] == "XXL" and r["objective"] == "ntp")
    assert 1400 < xxl["params_M"] < 1420 and xxl["tokens_per_seq"] == 576
    assert xxl["total_GiB_fsdp"] < xxl["total_GiB_ddp"]
    scaling.main(["--lm"])
    lm = {r["finetune"]: r for r in json.loads(capsys.readouterr().out.splitlines()[-1])["rows"]}
    assert 8.0 < lm["full, DDP"]["params_B"] < 8.1
    assert lm["full, FSDP2"]["states_GiB_per_gpu"] == pytest.approx(lm["full, DDP"]["states_GiB_per_gpu"] / 8, abs=0.1)
    assert lm["full, DDP"]["total_GiB_per_gpu"] > 80 > lm["full, FSDP2"]["total_GiB_per_gpu"]
