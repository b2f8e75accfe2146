"""VQ image tokenizer network with LlamaGen's VQModel module and parameter names.

Architecture (LlamaGen VQ-16, taming-style): conv encoder (``conv_blocks`` of ResNet blocks, stride-2
downsampling between levels, attention in the last level and the middle), ``quant_conv`` to the
codebook dimension, an L2-normalised codebook (``quantize.embedding``), ``post_quant_conv`` and the
mirrored decoder with nearest-neighbour upsampling. Images are in [-1, 1]; the token grid is
image_size / 2**(len(ch_mult) - 1) on each side.

Quantiser rule (same as LlamaGen): z and the codebook are L2-normalised, code = argmin over
|z|^2 + |e|^2 - 2 z.e; the decoder sees the normalised code vector. Losses (training only):
codebook  mean((e - sg(z))^2), commitment  beta * mean((sg(e) - z)^2), straight-through gradients.
Dead-code restart (training, when asked; not LlamaGen's): before a batch is quantised, once the usage window
is full, every code absent from it is moved onto a distinct random encoder output of this batch
(:meth:`VectorQuantizer.restart_dead`).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from .config import VQConfig, VQError


# ----------------------------------------------------------------------------- building blocks

def swish(x: Tensor) -> Tensor:
    return x * torch.sigmoid(x)


def group_norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(groups, channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """x + conv2(drop(swish(norm2(conv1(swish(norm1(x))))))); 1x1 ``nin_shortcut`` when widths differ."""

    def __init__(self, cin: int, cout: int, groups: int, dropout: float):
        super().__init__()
        self.norm1 = group_norm(cin, groups)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = group_norm(cout, groups)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(self.dropout(swish(self.norm2(h))))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    """Single-head spatial self-attention over h*w positions, 1x1 conv q/k/v/proj_out, residual."""

    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.norm = group_norm(channels, groups)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (m(y).flatten(2).transpose(1, 2).unsqueeze(1) for m in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)  # (b, 1, hw, c), scale c^-0.5
        out = out.squeeze(1).transpose(1, 2).reshape(b, c, h, w)
        return x + self.proj_out(out)


class Resample(nn.Module):
    """Down: pad right/bottom by one, 3x3 conv with stride 2. Up: nearest-neighbour x2, then 3x3 conv."""

    def __init__(self, channels: int, down: bool):
        super().__init__()
        self.down = down
        self.conv = nn.Conv2d(channels, channels, 3, stride=2 if down else 1, padding=0 if down else 1)

    def forward(self, x: Tensor) -> Tensor:
        x = F.pad(x, (0, 1, 0, 1)) if self.down else F.interpolate(x, scale_factor=2.0, mode="nearest")
        return self.conv(x)


class Level(nn.Module):
    """One resolution of ``conv_blocks``: ``n`` ResnetBlocks (``res``, cin -> cout), each followed by an
    AttnBlock (``attn``) when ``attn``, then the ``downsample`` (encoder) or ``upsample`` (decoder) if any."""

    def __init__(self, cin: int, cout: int, n: int, attn: bool, groups: int, dropout: float, resample: str):
        super().__init__()
        self.res, self.attn = nn.ModuleList(), nn.ModuleList()
        for _ in range(n):             # interleaved, as LlamaGen builds them: a seed gives its weights
            self.res.append(ResnetBlock(cin, cout, groups, dropout))
            cin = cout
            if attn:
                self.attn.append(AttnBlock(cout, groups))
        self.resample = resample       # "downsample", "upsample" or "" (none): the module's name
        if resample:
            self.add_module(resample, Resample(cout, down=resample == "downsample"))

    def forward(self, h: Tensor) -> Tensor:
        for i, res in enumerate(self.res):
            h = res(h)
            if len(self.attn):
                h = self.attn[i](h)
        return getattr(self, self.resample)(h) if self.resample else h


class Encoder(nn.Module):
    """(B, in_channels, S, S) -> (B, z_channels, S/f, S/f)."""

    def __init__(self, cfg: VQConfig):
        super().__init__()
        ch, mult, g, p = cfg.ch, cfg.ch_mult, cfg.norm_groups, cfg.dropout_p
        self.conv_in = nn.Conv2d(cfg.in_channels, ch, 3, padding=1)
        self.conv_blocks = nn.Sequential()
        cin = ch
        for level, m in enumerate(mult):
            down = "" if level == len(mult) - 1 else "downsample"      # attention in the last level only
            self.conv_blocks.append(Level(cin, ch * m, cfg.num_res_blocks, not down, g, p, down))
            cin = ch * m
        self.mid = nn.Sequential(ResnetBlock(cin, cin, g, p), AttnBlock(cin, g), ResnetBlock(cin, cin, g, p))
        self.norm_out = group_norm(cin, g)
        self.conv_out = nn.Conv2d(cin, cfg.z_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.mid(self.conv_blocks(self.conv_in(x)))
        return self.conv_out(swish(self.norm_out(h)))


class Decoder(nn.Module):
    """(B, z_channels, S/f, S/f) -> (B, in_channels, S, S). ``conv_blocks[0]`` is the deepest level."""

    def __init__(self, cfg: VQConfig):
        super().__init__()
        ch, mult, g, p = cfg.ch, cfg.ch_mult, cfg.norm_groups, cfg.dropout_p
        cin = ch * mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, cin, 3, padding=1)
        self.mid = nn.Sequential(ResnetBlock(cin, cin, g, p), AttnBlock(cin, g), ResnetBlock(cin, cin, g, p))
        self.conv_blocks = nn.Sequential()
        for level in reversed(range(len(mult))):
            cout, last, up = ch * mult[level], level == len(mult) - 1, "upsample" if level else ""
            self.conv_blocks.append(Level(cin, cout, cfg.num_res_blocks + 1, last, g, p, up))
            cin = cout
        self.norm_out = group_norm(cin, g)
        self.conv_out = nn.Conv2d(cin, cfg.in_channels, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.conv_blocks(self.mid(self.conv_in(z)))
        return self.conv_out(swish(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    """Nearest-code quantiser over ``embedding`` (n_e, e_dim), L2-normalised when ``l2_norm``.

    ``codebook_used`` (LlamaGen's buffer) holds the most recent ``usage_window`` codes seen in
    training; -1 marks empty slots (a LlamaGen checkpoint's buffer is loaded as it is)."""

    def __init__(self, n_e: int, e_dim: int, beta: float, l2_norm: bool, usage_window: int):
        super().__init__()
        self.n_e, self.e_dim, self.beta, self.l2_norm = n_e, e_dim, beta, l2_norm
        self.embedding = nn.Embedding(n_e, e_dim)
        with torch.no_grad():
            self.embedding.weight.uniform_(-1.0 / n_e, 1.0 / n_e)
            if l2_norm:
                self.embedding.weight.copy_(F.normalize(self.embedding.weight, dim=-1))
        self.register_buffer("codebook_used", torch.full((usage_window,), -1.0) if usage_window else None)

    def codebook(self) -> Tensor:
        """(n_e, e_dim) code vectors as the decoder sees them."""
        w = self.embedding.weight
        return F.normalize(w, dim=-1) if self.l2_norm else w

    def nearest(self, z: Tensor) -> Tensor:
        """z (M, e_dim), already normalised if l2_norm -> codes (M,) long."""
        e = self.codebook()
        e2 = (e ** 2).sum(1)
        step = max(1, (1 << 26) // self.n_e)  # rows per chunk: bounds the (rows, n_e) distance matrix
        out = [((zc ** 2).sum(1, keepdim=True) + e2 - 2 * zc @ e.t()).argmin(1) for zc in z.split(step)]
        return torch.cat(out) if out else z.new_zeros(0, dtype=torch.long)

    def forward(self, z: Tensor, restart: torch.Generator | None = None) -> tuple[Tensor, Tensor, dict]:
        """z (B, e_dim, h, w) -> (z_q (B, e_dim, h, w), codes (B, h, w), losses).

        losses: codebook, commitment (zero tensors in eval mode). ``restart``: in training, restart dead
        codes first (:meth:`restart_dead`), drawing with this generator."""
        b, c, h, w = z.shape
        z = z.permute(0, 2, 3, 1).reshape(-1, c)
        if self.l2_norm:
            z = F.normalize(z, dim=-1)
        if restart is not None and self.training:
            self.restart_dead(z.detach(), restart)
        codes = self.nearest(z)
        z_q = self.codebook()[codes]
        if self.training:
            losses = {"codebook": F.mse_loss(z_q, z.detach()),
                      "commitment": self.beta * F.mse_loss(z, z_q.detach())}
            self._track_usage(codes)
        else:
            zero = z.new_zeros(())
            losses = {"codebook": zero, "commitment": zero}
        z_q = z + (z_q - z).detach()
        z_q = z_q.reshape(b, h, w, c).permute(0, 3, 1, 2)
        return z_q, codes.reshape(b, h, w), losses

    @torch.no_grad()
    def _track_usage(self, codes: Tensor) -> None:
        if self.codebook_used is None:
            return
        n = min(codes.numel(), self.codebook_used.numel())
        self.codebook_used.copy_(torch.cat([self.codebook_used[n:], codes[-n:].to(self.codebook_used)]))

    @torch.no_grad()
    def restart_dead(self, z: Tensor, generator: torch.Generator) -> int:
        """Move every code absent from a full usage window onto a distinct random row of ``z`` (M, e_dim),
        the batch's encoder outputs as quantised; -> the number moved. Nothing moves before the window is
        full, or when ``z`` holds a non-finite value. With several processes rank 0's codebook is sent to
        all (every call, so that no process waits on another's decision)."""
        used = self.codebook_used
        moved = 0
        if used is not None and bool((used >= 0).all()) and bool(torch.isfinite(z).all()):
            dead = torch.ones(self.n_e, dtype=torch.bool, device=used.device)
            dead[used.long()] = False
            idx = dead.nonzero().flatten()[:len(z)].to(self.embedding.weight.device)
            moved = len(idx)
            if moved:
                pick = torch.randperm(len(z), generator=generator, device=generator.device)[:moved]
                self.embedding.weight[idx] = z[pick.to(z.device)].to(self.embedding.weight.dtype)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast(self.embedding.weight.data, 0)
        return moved

    def usage(self) -> float:
        """Fraction of the codebook among the last ``usage_window`` training codes."""
        if self.codebook_used is None:
            return float("nan")
        return self.codebook_used[self.codebook_used >= 0].long().unique().numel() / self.n_e

    def lookup(self, codes: Tensor) -> Tensor:
        """codes (B, h, w) long -> (B, e_dim, h, w) code vectors."""
        if codes.min() < 0 or codes.max() >= self.n_e:
            raise VQError(f"codes out of range: got values in [{int(codes.min())}, {int(codes.max())}], "
                          f"expected [0, {self.n_e - 1}]")
        return self.codebook()[codes].permute(0, 3, 1, 2)


class VQModel(nn.Module):
    """LlamaGen-compatible VQ tokenizer. Images in [-1, 1]."""

    def __init__(self, cfg: VQConfig):
        super().__init__()
        self.config = cfg.validate()
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.quantize = VectorQuantizer(cfg.codebook_size, cfg.codebook_embed_dim, cfg.commit_loss_beta,
                                        cfg.codebook_l2_norm, cfg.usage_window)
        self.quant_conv = nn.Conv2d(cfg.z_channels, cfg.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(cfg.codebook_embed_dim, cfg.z_channels, 1)

    def encode(self, x: Tensor, restart: torch.Generator | None = None) -> tuple[Tensor, Tensor, dict]:
        """x (B, C, S, S) in [-1, 1] -> (z_q (B, e_dim, S/f, S/f), codes (B, S/f, S/f), losses);
        ``restart``: the quantiser's dead-code restart generator (training only)."""
        self._check_input(x)
        return self.quantize(self.quant_conv(self.encoder(x)), restart)

    def decode(self, z_q: Tensor) -> Tensor:
        """(B, e_dim, h, w) -> images (B, C, h*f, w*f), nominally in [-1, 1]."""
        return self.decoder(self.post_quant_conv(z_q))

    def decode_codes(self, codes: Tensor) -> Tensor:
        """codes (B, h, w) long -> images (B, C, h*f, w*f)."""
        return self.decode(self.quantize.lookup(codes))

    def forward(self, x: Tensor, restart: torch.Generator | None = None) -> tuple[Tensor, Tensor, dict]:
        """x -> (reconstruction, codes, losses); ``restart`` as in :meth:`encode`."""
        z_q, codes, losses = self.encode(x, restart)
        return self.decode(z_q), codes, losses

    def _check_input(self, x: Tensor) -> None:
        f = self.config.downsample
        if x.dim() != 4 or x.shape[1] != self.config.in_channels or x.shape[2] % f or x.shape[3] % f:
            raise VQError(f"VQ input: expected (B, {self.config.in_channels}, H, W) with H, W multiples "
                          f"of {f}, got {tuple(x.shape)}")
