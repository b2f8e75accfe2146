"""GPU paths: the MFU peak of the card (CPU, with a stand-in device name), and on CUDA the training
sample grid decoded on the device (bench/gpu.sh runs the tests named ``cuda``)."""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mutor2d import config
from mutor2d import checkpoint
from mutor2d.checkpoint import locate
from mutor2d.sampling import images as generation
from mutor2d.engine import speed

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


# Datasheet dense bf16 peaks (no sparsity) of the names torch.cuda.get_device_name reports.
DATASHEET = {"NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100 PCIe": 756e12, "NVIDIA H100 NVL": 835e12,
             "NVIDIA H200": 989e12, "NVIDIA A100-SXM4-80GB": 312e12, "NVIDIA A100-PCIE-40GB": 312e12,
             "NVIDIA L40S": 362e12}


def test_peak_flops_per_card_and_from_the_environment(monkeypatch):
    monkeypatch.delenv("MUTOR2D_PEAK_TFLOPS", raising=False)
    cuda = torch.device("cuda")
    for name, peak in DATASHEET.items():
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, n=name: n)
        assert speed.peak_flops(cuda) == peak, name
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce GTX 1080")
    assert speed.peak_flops(cuda) is None and speed.peak_flops(torch.device("cpu")) is None
    monkeypatch.setenv("MUTOR2D_PEAK_TFLOPS", "123.5")             # the user's peak wins, on any device
    assert speed.peak_flops(cuda) == speed.peak_flops(torch.device("cpu")) == 123.5e12
    for bad in ("fast", "0", "-3", "nan", "inf"):
        monkeypatch.setenv("MUTOR2D_PEAK_TFLOPS", bad)
        with pytest.raises(ValueError, match=rf"^MUTOR2D_PEAK_TFLOPS='{bad}': expected a positive number of TFLOP/s"):
            speed.peak_flops(cuda)


# ----------------------------------------------------------------------------- CUDA

CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))


@pytest.mark.parametrize("device", ["cpu", CUDA])   # on the CPU too, so CI sees the hook's interface move
def test_sample_grid_hook_decodes_on_the_device_like_sample_py(tmp_path, device):
    """A VQ tokenizer built on the CPU (as the engine's loop.Hooks does) decodes the training grid on the run's
    device, and the grid is sample.py's on the same checkpoint and device, byte for byte."""
    from mutor2d.data.tokens import build_tokenizer
    from mutor2d.engine.hooks import StepStatus
    from mutor2d.image.hooks import SampleGrids
    from mutor2d.model.gpt import GPT
    from mutor2d.tokenizer.config import vq_config
    from mutor2d.tokenizer.vq_model import VQModel
    torch.manual_seed(0)
    vq = VQModel(vq_config("tiny", codebook_size=17, codebook_embed_dim=4, ch=8, ch_mult=(1, 2), num_res_blocks=1,
                           z_channels=8, norm_groups=4, image_size=8, usage_window=0))
    vq_path = tmp_path / "vq.pt"
    torch.save({"model": vq.state_dict(), "ema": None, "config": {"task": "vq", "model": vq.config.to_dict()}}, vq_path)
    cfg = config.load(None, ["data.name=digits", f"data.tokenizer={vq_path}", "model.preset=tiny",
                             "model.vocab_size=17", "model.num_classes=10", "sample.per_class=2",
                             "sample.classes=[1,4]"])
    checkpoint.save_atomic({"model": GPT(cfg.model).state_dict(), "ema": None, "objective": {}, "step": 5,
                            "config": cfg.to_dict(), "grid": [4, 4]}, checkpoint.checkpoint_path(tmp_path / "run", 5))
    src = generation.open_checkpoint(locate.resolve(tmp_path / "run"), device=device)
    tokenizer = build_tokenizer(cfg.data)
    assert tokenizer.device.type == "cpu"
    run = SimpleNamespace(cfg=src.cfg, sample_model=src.model, sampling_model=lambda: src.model, grid=src.grid,
                          device=torch.device(device),
                          run_dir=tmp_path, main=True, acc=SimpleNamespace(wait_for_everyone=lambda: None))
    SampleGrids(tokenizer, [1, 4])(run, StepStatus(5, True))
    assert tokenizer.device.type == device
    spec = importlib.util.spec_from_file_location("sample_cli", ROOT / "sample.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    cli.main(["--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "cli.png"), "--device", device])
    assert (tmp_path / "samples" / "step_00000005.png").read_bytes() == (tmp_path / "cli.png").read_bytes()
