"""LPIPS perceptual distance (VGG16 variant), built from local weight files only.

distance(x, y) = sum over the VGG16 taps relu1_2, relu2_2, relu3_3, relu4_3, relu5_3 of
spatial_mean(lin_l((f_l(x) - f_l(y))^2)), where f_l is channel-normalised (unit L2 norm per
position) and lin_l is a learned non-negative 1x1 conv to one channel. Inputs in [-1, 1] are first
shifted/scaled by LPIPS's fixed ImageNet constants.

Weights: torchvision's VGG16 file (keys ``features.N.weight``/``bias``; ``classifier.*`` is ignored)
plus the LPIPS linear-layer file (``lin0.model.1.weight`` ... ``lin4.model.1.weight``, as in the
lpips package's / taming's ``vgg.pth``). Give both paths (or one file holding both). Nothing is
downloaded; files are read with ``weights_only=True`` (mutor2d.io.read_torch_file).
"""
from __future__ import annotations

import os

import torch
from torch import Tensor, nn

from ..io import read_torch_file

VGG16_LAYERS = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512]
TAPS = (3, 8, 15, 22, 29)            # indices in vgg16.features after relu1_2 ... relu5_3
TAP_CHANNELS = (64, 128, 256, 512, 512)


class NetLin(nn.Module):
    """LPIPS's linear layer: dropout then a 1x1 conv without bias (key ``model.1.weight``)."""

    def __init__(self, channels: int):
        super().__init__()
        self.model = nn.Sequential(nn.Dropout(), nn.Conv2d(channels, 1, 1, bias=False))

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)


class LPIPS(nn.Module):
    """x, y (B, 3, H, W) in [-1, 1] -> distance (B,). Frozen: no parameter requires grad."""

    def __init__(self):
        super().__init__()
        layers, cin = [], 3
        for v in VGG16_LAYERS:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU(inplace=False)]
                cin = v
        self.features = nn.Sequential(*layers[:TAPS[-1] + 1])
        for i, c in enumerate(TAP_CHANNELS):
            self.add_module(f"lin{i}", NetLin(c))
        self.register_buffer("shift", torch.tensor([-0.030, -0.088, -0.188]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("scale", torch.tensor([0.458, 0.448, 0.450]).view(1, 3, 1, 1), persistent=False)
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True):  # always eval: dropout off
        return super().train(False)

    def _taps(self, x: Tensor) -> list[Tensor]:
        out, h = [], (x - self.shift) / self.scale
        for i, layer in enumerate(self.features):
            h = layer(h)
            if i in TAPS:
                out.append(h / (h.pow(2).sum(1, keepdim=True).sqrt() + 1e-10))
        return out

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return sum(getattr(self, f"lin{i}")((fx - fy) ** 2).mean(dim=(1, 2, 3))
                   for i, (fx, fy) in enumerate(zip(self._taps(x), self._taps(y))))


def load_lpips(paths: list[str | os.PathLike]) -> LPIPS:
    """Build LPIPS from local weight files (merged); missing or unexpected keys raise ValueError."""
    if not paths:
        raise ValueError("perceptual loss: no weight files given")
    state: dict = {}
    for p in paths:
        obj = read_torch_file(p, "perceptual weights")
        if not isinstance(obj, dict):
            raise ValueError(f"perceptual weights {str(p)!r}: expected a state dict")
        state.update({k: v for k, v in obj.items() if not k.startswith("classifier.")})
    model = LPIPS()
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    bad = [k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape)]
    if missing or unexpected or bad:
        raise ValueError(f"perceptual weights {[str(p) for p in paths]}: missing keys {missing[:4]}"
                         f"{'...' if len(missing) > 4 else ''}, unexpected keys {unexpected[:4]}, "
                         f"wrong shapes {sorted(bad)[:4]} (need torchvision VGG16 features.* and LPIPS "
                         f"lin0..lin4.model.1.weight)")
    model.load_state_dict(state, strict=True)
    return model
