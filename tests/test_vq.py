"""VQ tokenizer: LlamaGen key layout, numerics against an independent functional reference,
strict loading, LPIPS, and a short tokenizer-training run with resume."""
import argparse
import json
import os
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mutor2d.config import ConfigError
from mutor2d.tokenizer.lpips import LPIPS, load_lpips
from mutor2d.tokenizer.config import PRESETS, VQConfig, VQError, vq_config
from mutor2d.tokenizer.vq import VQTokenizer, config_from_state_dict, load_vq, load_vq_state
from mutor2d.tokenizer.vq_model import VQModel

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


ROOT = Path(__file__).resolve().parent.parent
SMALL = dict(codebook_size=32, codebook_embed_dim=4, ch=8, ch_mult=(1, 2), num_res_blocks=1, z_channels=8,
             norm_groups=4, image_size=8, usage_window=128)


def small_model(seed=0, **kw) -> VQModel:
    """A small VQ with every parameter randomised (GroupNorm affine and biases too)."""
    torch.manual_seed(seed)
    m = VQModel(vq_config("tiny", **{**SMALL, **kw}))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name != "quantize.embedding.weight":
                p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.1) + (1.0 if "norm" in name and
                                                                              name.endswith("weight") else 0.0))
    return m.eval()


# Written out by hand from LlamaGen's VQModel for ch_mult (1, 2), one res block per level.
def _res(prefix, shortcut=False):
    keys = [f"{prefix}.{n}.{p}" for n in ("norm1", "conv1", "norm2", "conv2") for p in ("weight", "bias")]
    return keys + ([f"{prefix}.nin_shortcut.weight", f"{prefix}.nin_shortcut.bias"] if shortcut else [])


def _attn(prefix):
    return [f"{prefix}.{n}.{p}" for n in ("norm", "q", "k", "v", "proj_out") for p in ("weight", "bias")]


def _wb(prefix):
    return [f"{prefix}.weight", f"{prefix}.bias"]


EXPECTED_SMALL_KEYS = sorted(
    _wb("encoder.conv_in") + _res("encoder.conv_blocks.0.res.0") + _wb("encoder.conv_blocks.0.downsample.conv")
    + _res("encoder.conv_blocks.1.res.0", shortcut=True) + _attn("encoder.conv_blocks.1.attn.0")
    + _res("encoder.mid.0") + _attn("encoder.mid.1") + _res("encoder.mid.2")
    + _wb("encoder.norm_out") + _wb("encoder.conv_out")
    + _wb("decoder.conv_in") + _res("decoder.mid.0") + _attn("decoder.mid.1") + _res("decoder.mid.2")
    + _res("decoder.conv_blocks.0.res.0") + _res("decoder.conv_blocks.0.res.1")
    + _attn("decoder.conv_blocks.0.attn.0") + _attn("decoder.conv_blocks.0.attn.1")
    + _wb("decoder.conv_blocks.0.upsample.conv")
    + _res("decoder.conv_blocks.1.res.0", shortcut=True) + _res("decoder.conv_blocks.1.res.1")
    + _wb("decoder.norm_out") + _wb("decoder.conv_out")
    + ["quantize.embedding.weight", "quantize.codebook_used"] + _wb("quant_conv") + _wb("post_quant_conv"))


def test_state_dict_has_llamagen_key_layout():
    assert sorted(small_model().state_dict()) == EXPECTED_SMALL_KEYS


def test_vq16_preset_matches_llamagen_sizes():
    with torch.device("meta"):
        m = VQModel(vq_config("vq16"))
    sd = m.state_dict()
    assert sd["quantize.embedding.weight"].shape == (16384, 8)
    assert sd["quantize.codebook_used"].shape == (65536,)
    assert sd["quant_conv.weight"].shape == (8, 256, 1, 1)
    assert sd["encoder.conv_blocks.4.res.0.conv1.weight"].shape == (512, 256, 3, 3)
    assert "encoder.conv_blocks.4.downsample.conv.weight" not in sd  # no downsampling after the last level
    assert "decoder.conv_blocks.4.upsample.conv.weight" not in sd
    assert len([k for k in sd if k.startswith("decoder.conv_blocks.0.res.") and k.endswith("conv1.weight")]) == 3
    n = sum(p.numel() for p in m.parameters())
    assert 71_000_000 < n < 73_000_000  # LlamaGen: ~72M
    assert m.config.grid == (16, 16) and m.config.commit_loss_beta == 0.25


# ----------------------------------------------------------------------------- independent reference

def _gn(x, sd, p):
    return F.group_norm(x, SMALL["norm_groups"], sd[p + ".weight"], sd[p + ".bias"], eps=1e-6)


def _conv(x, sd, p, **kw):
    return F.conv2d(x, sd[p + ".weight"], sd[p + ".bias"], **kw)


def _ref_res(x, sd, p):
    h = _conv(F.silu(_gn(x, sd, p + ".norm1")), sd, p + ".conv1", padding=1)
    h = _conv(F.silu(_gn(h, sd, p + ".norm2")), sd, p + ".conv2", padding=1)
    if p + ".nin_shortcut.weight" in sd:
        x = _conv(x, sd, p + ".nin_shortcut")
    return x + h


def _ref_attn(x, sd, p):
    b, c, hh, ww = x.shape
    h = _gn(x, sd, p + ".norm")
    q, k, v = (_conv(h, sd, f"{p}.{n}").reshape(b, c, hh * ww) for n in "qkv")
    w = torch.softmax(torch.einsum("bci,bcj->bij", q, k) / math.sqrt(c), dim=2)
    out = torch.einsum("bcj,bij->bci", v, w).reshape(b, c, hh, ww)
    return x + _conv(out, sd, p + ".proj_out")


def ref_encode(x, sd):
    """LlamaGen encoder + quant_conv + quantiser, written from the state dict (ch_mult (1, 2))."""
    h = _conv(x, sd, "encoder.conv_in", padding=1)
    h = _ref_res(h, sd, "encoder.conv_blocks.0.res.0")
    h = _conv(F.pad(h, (0, 1, 0, 1)), sd, "encoder.conv_blocks.0.downsample.conv", stride=2)
    h = _ref_attn(_ref_res(h, sd, "encoder.conv_blocks.1.res.0"), sd, "encoder.conv_blocks.1.attn.0")
    h = _ref_res(_ref_attn(_ref_res(h, sd, "encoder.mid.0"), sd, "encoder.mid.1"), sd, "encoder.mid.2")
    h = _conv(F.silu(_gn(h, sd, "encoder.norm_out")), sd, "encoder.conv_out", padding=1)
    z = _conv(h, sd, "quant_conv")
    z = F.normalize(z, dim=1)
    e = F.normalize(sd["quantize.embedding.weight"], dim=1)
    return torch.einsum("bchw,nc->bhwn", z, e).argmax(-1)  # nearest unit vector = largest cosine


def ref_decode(codes, sd):
    e = F.normalize(sd["quantize.embedding.weight"], dim=1)
    h = _conv(e[codes].permute(0, 3, 1, 2), sd, "post_quant_conv")
    h = _conv(h, sd, "decoder.conv_in", padding=1)
    h = _ref_res(_ref_attn(_ref_res(h, sd, "decoder.mid.0"), sd, "decoder.mid.1"), sd, "decoder.mid.2")
    for i in range(2):
        h = _ref_attn(_ref_res(h, sd, f"decoder.conv_blocks.0.res.{i}"), sd, f"decoder.conv_blocks.0.attn.{i}")
    h = _conv(F.interpolate(h, scale_factor=2, mode="nearest"), sd, "decoder.conv_blocks.0.upsample.conv", padding=1)
    for i in range(2):
        h = _ref_res(h, sd, f"decoder.conv_blocks.1.res.{i}")
    return _conv(F.silu(_gn(h, sd, "decoder.norm_out")), sd, "decoder.conv_out", padding=1)


def test_encode_decode_match_independent_reference():
    m = small_model(seed=1)
    sd = m.state_dict()
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        z_q, codes, losses = m.encode(x)
        ref_codes = ref_encode(x, sd)
        assert codes.shape == (3, 4, 4) and codes.dtype == torch.long
        assert torch.equal(codes, ref_codes)
        assert len(codes.unique()) > 3  # a non-trivial assignment
        # the decoder sees the normalised code vectors: encode->decode == decode_codes(codes)
        assert torch.allclose(z_q, F.normalize(sd["quantize.embedding.weight"], dim=1)[codes].permute(0, 3, 1, 2))
        assert torch.allclose(m.decode(z_q), m.decode_codes(codes), atol=1e-5)
        img = m.decode_codes(codes)
        assert img.shape == (3, 3, 8, 8)
        assert torch.allclose(img, ref_decode(codes, sd), atol=1e-4, rtol=1e-4)
    assert float(losses["codebook"]) == 0.0  # eval mode: no losses


def test_quantizer_losses_and_straight_through():
    m = small_model(seed=2).train()
    x = (torch.rand(2, 3, 8, 8) * 2 - 1).requires_grad_()
    z = F.normalize(m.quant_conv(m.encoder(x)), dim=1).detach()
    rec, codes, losses = m(x)
    e = F.normalize(m.quantize.embedding.weight, dim=1)[codes].permute(0, 3, 1, 2).detach()
    assert torch.allclose(losses["codebook"], ((e - z) ** 2).mean(), atol=1e-6)
    assert torch.allclose(losses["commitment"], 0.25 * ((e - z) ** 2).mean(), atol=1e-6)
    (rec.mean() + losses["codebook"]).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0  # straight-through reaches the encoder input
    assert m.quantize.embedding.weight.grad.abs().sum() > 0
    assert 0 < m.quantize.usage() <= 1


def test_tokenizer_shapes_and_code_range():
    tok = VQTokenizer(small_model(seed=3))
    images = torch.rand(5, 3, 8, 8)
    codes = tok.encode(images)
    assert codes.shape == (5, 4, 4) and tok.grid == (4, 4)
    assert codes.min() >= 0 and codes.max() < tok.vocab_size == 32
    out = tok.decode(codes)
    assert out.shape == (5, 3, 8, 8) and out.min() >= 0 and out.max() <= 1
    with pytest.raises(VQError, match="codes out of range"):
        tok.decode(torch.full((1, 4, 4), 32))
    with pytest.raises(VQError, match="VQ input"):
        tok.encode(torch.rand(1, 3, 7, 7))
    for name in PRESETS:
        cfg = vq_config(name)
        assert cfg.image_size % cfg.downsample == 0


# ----------------------------------------------------------------------------- loading

def test_llamagen_checkpoint_loads_strictly(tmp_path):
    m = small_model(seed=4)
    path = tmp_path / "vq_llamagen_layout.pt"
    args = argparse.Namespace(vq_model="VQ-16", codebook_size=32)   # LlamaGen stores its argparse args
    torch.save({"model": m.state_dict(), "optimizer": {}, "steps": 7, "args": args}, path)  # LlamaGen's layout
    loaded = load_vq(path, config=vq_config("tiny", **SMALL))
    for k, v in m.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    inferred = config_from_state_dict(m.state_dict(), image_size=8)
    assert (inferred.ch, inferred.ch_mult, inferred.num_res_blocks, inferred.z_channels,
            inferred.codebook_size, inferred.codebook_embed_dim, inferred.usage_window) == (8, (1, 2), 1, 8, 32, 4, 128)
    # weights under "ema" win over "model"
    other = small_model(seed=5)
    torch.save({"model": other.state_dict(), "ema": m.state_dict()}, path)
    x = torch.rand(2, 3, 8, 8) * 2 - 1
    loaded = load_vq(path, config=vq_config("tiny", **SMALL))
    assert torch.equal(loaded.encode(x)[1], m.encode(x)[1])


class Payload:
    """Unpickling this runs code: it writes ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def test_payload_checkpoints_are_refused_and_never_run(tmp_path):
    marker = tmp_path / "marker"
    m = small_model(seed=4)
    path = tmp_path / "evil.pt"
    torch.save({"model": m.state_dict(), "config": Payload(marker)}, path)
    with pytest.raises(VQError) as e:
        load_vq(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "builtins.exec" in msg and "refused" in msg
    with pytest.raises(VQError, match="refused"):
        VQTokenizer.from_checkpoint(path)
    torch.save({k: (Payload(marker) if k.startswith("lin0") else torch.zeros(1)) for k in ("lin0.x",)},
               tmp_path / "lpips.pth")
    with pytest.raises(ValueError, match="perceptual weights .*lpips.pth.* refused"):
        load_lpips([tmp_path / "lpips.pth"])
    # in a run folder: the payload (newest) is skipped with a warning, the older valid file is used
    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    torch.save({"model": m.state_dict(), "config": {"task": "vq", "model": m.config.to_dict()}},
               run / "step_00000001.pt")
    os.replace(path, run / "step_00000002.pt")
    with pytest.warns(UserWarning, match="step_00000002.pt.*refused"):
        tok = VQTokenizer.from_checkpoint(tmp_path / "run")
    assert tok.vocab_size == 32
    assert not marker.exists()


def test_mismatched_checkpoint_is_a_clear_error(tmp_path):
    sd = small_model().state_dict()
    bad = dict(sd)
    del bad["encoder.conv_in.weight"]
    bad["encoder.extra.weight"] = torch.zeros(1)
    path = tmp_path / "bad.pt"
    torch.save({"model": bad}, path)
    with pytest.raises(VQError) as e:
        load_vq(path, config=vq_config("tiny", **SMALL))
    msg = str(e.value)
    assert "\n" not in msg and "missing keys [encoder.conv_in.weight]" in msg
    assert "unexpected keys [encoder.extra.weight]" in msg
    partial = {k: v for k, v in sd.items() if k != "decoder.conv_out.bias"}
    torch.save({"state_dict": partial}, path)  # architecture inferred from the weights, then strict
    with pytest.raises(VQError, match=r"missing keys \[decoder.conv_out.bias\]"):
        load_vq(path)
    with pytest.raises(VQError, match="shape mismatches.*quantize.embedding.weight"):
        load_vq_state(VQModel(vq_config("tiny", **{**SMALL, "codebook_size": 16})), sd)
    torch.save({"model": {"tok_embeddings.weight": torch.zeros(2, 2)}}, path)
    with pytest.raises(VQError, match="not a LlamaGen-layout VQ state dict"):
        load_vq(path)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(VQError, match="unreadable"):
        load_vq(tmp_path / "junk.pt")
    with pytest.raises(VQError, match="does not exist"):
        load_vq(tmp_path / "missing.pt")
    with pytest.raises(VQError, match="norm_groups"):
        vq_config("tiny", norm_groups=3)
    with pytest.raises(VQError, match="unknown vq config key"):
        vq_config("tiny", channels=3)


# ----------------------------------------------------------------------------- perceptual loss

def test_lpips_from_local_files(tmp_path):
    torch.manual_seed(0)
    ref = LPIPS()
    with torch.no_grad():
        for n, p in ref.named_parameters():
            p.copy_(p.abs() if n.startswith("lin") else p)  # LPIPS lin weights are non-negative
    sd = ref.state_dict()
    vgg = {k: v for k, v in sd.items() if k.startswith("features.")}
    vgg["classifier.0.weight"] = torch.zeros(2, 2)  # torchvision's file has a classifier: ignored
    torch.save(vgg, tmp_path / "vgg16.pth")
    torch.save({k: v for k, v in sd.items() if k.startswith("lin")}, tmp_path / "lpips_vgg.pth")
    lp = load_lpips([tmp_path / "vgg16.pth", tmp_path / "lpips_vgg.pth"])
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    y = (x + 0.3 * torch.randn_like(x)).requires_grad_()
    assert torch.allclose(lp(x, x), torch.zeros(2), atol=1e-6)
    d = lp(x, y)
    assert d.shape == (2,) and (d > 0).all()
    d.sum().backward()
    assert y.grad.abs().sum() > 0 and not any(p.requires_grad for p in lp.parameters())
    with pytest.raises(ValueError, match="missing keys.*lin0.model.1.weight"):
        load_lpips([tmp_path / "vgg16.pth"])


def test_dead_code_restart_moves_exactly_the_unused_codes():
    from mutor2d.tokenizer.vq_model import VectorQuantizer
    q = VectorQuantizer(8, 4, 0.25, l2_norm=True, usage_window=6).train()
    g = torch.Generator().manual_seed(0)
    z = F.normalize(torch.randn(20, 4), dim=-1)
    before = q.embedding.weight.detach().clone()
    q.codebook_used.copy_(torch.tensor([0, 1, 2, 2, -1, -1.0]))
    assert q.restart_dead(z, g) == 0 and torch.equal(q.embedding.weight, before)    # window not yet full
    q.codebook_used.copy_(torch.tensor([0, 1, 2, 2, 5, 1.0]))
    assert q.restart_dead(z.masked_fill(torch.eye(20, 4, dtype=torch.bool), float("nan")), g) == 0
    assert torch.equal(q.embedding.weight, before)                                  # a non-finite batch moves nothing
    assert q.restart_dead(z, g) == 4                                                # codes 3, 4, 6, 7 are unused
    w = q.embedding.weight.detach()
    alive, dead = [0, 1, 2, 5], [3, 4, 6, 7]
    assert torch.equal(w[alive], before[alive])
    hits = [(w[c] - z).norm(dim=-1).min().item() for c in dead]                     # each onto a batch row ...
    rows = {int((w[c] - z).norm(dim=-1).argmin()) for c in dead}
    assert max(hits) < 1e-6 and len(rows) == len(dead)                              # ... a distinct one


def test_restart_dead_codes_in_training():
    from mutor2d.tokenizer.vq_model import VectorQuantizer
    q = VectorQuantizer(64, 4, 0.25, l2_norm=True, usage_window=32).train()
    z = torch.randn(2, 4, 4, 4) * 0.01 + torch.tensor([1.0, 0, 0, 0]).view(1, 4, 1, 1)  # one tight cluster
    q(z)                                                                                 # fills the window
    before = q.embedding.weight.detach().clone()
    _, codes, _ = q(z, restart=torch.Generator().manual_seed(0))
    assert not torch.equal(q.embedding.weight, before) and codes.unique().numel() > 1
    q.eval()
    frozen = q.embedding.weight.detach().clone()
    q(z, restart=torch.Generator().manual_seed(0))                                       # eval: never
    assert torch.equal(q.embedding.weight, frozen)


# ----------------------------------------------------------------------------- training

def test_train_vq_runs_checkpoints_and_resumes(tmp_path, capsys):
    from mutor2d.vq.config import load_config
    from mutor2d.vq.run import train
    out = tmp_path / "run"
    sets = ["model.preset=tiny", "data.eval_images=16", "train.batch_size=4", "train.max_steps=3", "train.log_every=1",
            "train.ckpt_every=2", "train.eval_every=0", "optim.lr=1e-3", f"train.out_dir={out}"]
    cfg = load_config("vq_digits", sets)
    assert cfg.optim.lr == 1e-3 and cfg.objective.rec_loss == "l2"
    metrics = train(cfg)
    assert set(metrics) >= {"l1", "mse", "psnr", "usage", "perplexity"} and 0 < metrics["usage"] <= 1
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000002.pt", "step_00000003.pt"]
    log = [json.loads(s) for s in (out / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log if "loss" in e] == [1, 2, 3]
    assert {"loss_rec", "loss_codebook", "loss_commitment", "usage_window"} <= set(log[0])
    tok = VQTokenizer.from_checkpoint(out)  # the run folder resolves to its newest checkpoint
    assert tok.grid == (4, 4) and tok.vocab_size == PRESETS["tiny"]["codebook_size"]
    capsys.readouterr()
    train(load_config("vq_digits", sets[:-2] + ["train.max_steps=4", f"train.out_dir={out}"]), resume="auto")
    assert "resuming from step 3" in capsys.readouterr().out
    assert [e["step"] for e in map(json.loads, (out / "log.jsonl").read_text().splitlines())
            if "loss" in e] == [1, 2, 3, 4]
    saved = torch.load(out / "checkpoints" / "step_00000004.pt", weights_only=True)  # no allow-list needed
    assert saved["step"] == 4 and saved["config"]["task"] == "vq"
    with pytest.raises(ConfigError, match="model.codebook_size=16 differs from the checkpoint's"):
        train(load_config("vq_digits", sets[:-1] + ["model.codebook_size=16", f"train.out_dir={out}"]), resume="auto")


def test_vq_config_errors():
    from mutor2d.vq.config import load_config
    with pytest.raises(ConfigError, match="model.channels"):
        load_config("vq_digits", ["model.channels=3"])
    with pytest.raises(ConfigError, match="objective.rec_loss"):
        load_config("vq_digits", ["objective.rec_loss=l3"])
    with pytest.raises(ConfigError, match="data.path"):
        load_config("vq_digits", ["data.name=folder"])
    with pytest.raises(ConfigError, match="model.preset: expected a vq preset"):
        load_config("vq_digits", ["model.preset=huge"])
    with pytest.raises(ConfigError, match="optim.lr"):
        load_config("vq_digits", ["optim.lr=.nan"])
    with pytest.raises(ConfigError, match="data.crop_range"):
        load_config("vq_digits", ["data.crop_range=0.5"])
    with pytest.raises(ConfigError, match="model.usage_window: expected > 0 with objective.restart_dead_codes"):
        load_config("vq_digits", ["objective.restart_dead_codes=true", "model.usage_window=0"])
    with pytest.raises(ConfigError, match="objective.restart_dead_codes: expected false with train.sharding=fsdp"):
        load_config("vq_digits", ["objective.restart_dead_codes=true", "train.sharding=fsdp"])
    assert isinstance(load_config("vq_digits").model, VQConfig)


def test_train_vq_on_an_image_folder(tmp_path, capsys):
    import numpy as np
    from PIL import Image
    from mutor2d.vq.config import load_config
    from mutor2d.vq.run import FolderImages, train
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        (tmp_path / "imgs" / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (30, 22, 3), dtype=np.uint8)).save(tmp_path / "imgs" / c / f"{i}.png")
    (tmp_path / "imgs" / "dog" / "bad.png").write_bytes(b"broken")
    ds = FolderImages(tmp_path / "imgs", 16, train=True, crop_range=1.25, flip=True)
    assert len(ds) == 7
    views = torch.stack([ds[i] for i in range(len(ds))])
    assert views.shape == (7, 3, 16, 16) and 0 <= views.min() and views.max() <= 1
    assert "bad.png" in capsys.readouterr().out  # reported, and the next image used instead
    ev = FolderImages(tmp_path / "imgs", 16, train=False, crop_range=1.25, flip=True)
    assert torch.equal(ev[0], ev[0])  # evaluation views are the deterministic centre crop
    out = tmp_path / "run"
    cfg = load_config("vq_digits", ["model.preset=tiny", "data.name=folder", f"data.path={tmp_path / 'imgs'}",
                                    "data.eval_images=4", "train.batch_size=4", "train.max_steps=2",
                                    "train.eval_every=0", f"train.out_dir={out}"])
    metrics = train(cfg)
    assert 0 <= metrics["l1"] <= 1 and (out / "checkpoints" / "step_00000002.pt").is_file()


def test_train_vq_script_reports_bad_config_in_one_line(capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_vq_script", ROOT / "tokenizers" / "train_vq.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.raises(SystemExit) as exit_info:
        script.main(["vq_digits", "--set", "model.channels=3"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown config key 'model.channels'") and len(err.strip().splitlines()) == 1


def test_vq_run_stops_on_sigterm_and_resumes_exactly(tmp_path):
    """A VQ run is an engine run: SIGTERM -> checkpoint, exit 75 -> --resume auto gives the losses and
    final weights of an uninterrupted run of the same steps (the stopped run is a process of its own)."""
    from mutor2d.vq.config import load_config
    from mutor2d.vq.run import train

    from test_training import PY, losses, losses_so_far, stop_after
    sets = ["--set", "model.preset=tiny", "--set", "data.eval_images=4", "--set", "train.batch_size=4",
            "--set", "train.log_every=1", "--set", "train.ckpt_every=0", "--set", "train.eval_every=0"]
    run, straight = tmp_path / "run", tmp_path / "straight"
    rc, err = stop_after([PY, "train.py", "--config", "vq_digits.yaml", "--out", str(run), "--max-steps", "100000",
                          *sets], run, 2)
    assert rc == 75, err[-2000:]
    k = max(losses_so_far(run))
    cfg = load_config("vq_digits", [s for s in sets if s != "--set"] + [f"train.max_steps={k + 2}"])
    train(cfg, run, resume="auto")
    train(cfg, straight, resume=None)
    assert losses(run) == losses(straight) and len(losses(run)) == k + 2
    a, b = (torch.load(ckpt, weights_only=True)["model"] for ckpt in
            (run / "checkpoints" / f"step_{k + 2:08d}.pt", straight / "checkpoints" / f"step_{k + 2:08d}.pt"))
    assert all(torch.equal(a[key], b[key]) for key in a)
