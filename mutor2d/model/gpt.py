"""LlamaGen-style decoder.

Pre-norm RMSNorm, SwiGLU FFN, no biases, untied embeddings, 2D (or 1D) RoPE driven by explicit
position ids. Parameter names follow LlamaGen's gpt.py so its checkpoints load with strict checks
(mutor2d.model.llamagen).

What the model knows of MuToR: it can append ``num_extra`` copies of one learned embedding (the
register token) after the regular tokens, and it attends with a given ``Visibility`` rule and given
position ids. Nothing else. The same holds for cached decoding (``GPT.decode``): extra tokens read
the cache under their visibility rule and are never written to it (mutor2d.model.cache).
"""
from __future__ import annotations

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .attention import Visibility, causal_rule, get_backend, open_prefix
from .cache import CacheStep, extra_step, fixed_step
from .conditioning import conditioning
from .config import ModelConfig, Shape, model_shape

def _frozen_trace() -> bool:
    """True while torch.compile traces with inductor's weight freezing on (and grad off): the
    weights become constants and inductor prepacks them for its own GEMM of ``x @ W^T``."""
    if not torch.compiler.is_compiling() or torch.is_grad_enabled():
        return False
    config = sys.modules.get("torch._inductor.config")
    return bool(config is not None and config.freezing)


class Linear(nn.Linear):
    """nn.Linear without bias. On CPU, for 2..SMALL_ROWS input rows (a decode step), it computes
    (W @ x^T)^T with x contiguous (so x^T is a transposed view): MKL runs that ~2x faster than
    x @ W^T for a few rows (docs/BENCHMARKS.md); same result up to float rounding. Not when
    traced with inductor's freezing (``sampling.compile_decoder`` on CPU): inductor's prepacked
    GEMM of x @ W^T is faster still."""
    SMALL_ROWS = 4

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        if (x.device.type == "cpu" and not _frozen_trace()
                and 1 < x.numel() // x.shape[-1] <= self.SMALL_ROWS):
            rows = x.reshape(-1, x.shape[-1]).contiguous()    # x^T must be a transposed view
            out = torch.mm(self.weight, rows.t()).t().contiguous()
            return out.view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """x * rsqrt(mean(x^2) + eps) computed in float32, cast back, times the weight."""
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class Rotary(nn.Module):
    """RoPE from (row, col) position ids. 2D: the first half of each head's (interleaved) pairs
    rotate by row, the second half by column (LlamaGen). 1D: all pairs rotate by column.
    Tokens with position (-1, -1) (a prefix without a cell) get the identity rotation, or zeros
    (LlamaGen's class token) when ``cls_rope='zeros'``."""

    def __init__(self, head_dim: int, base: float, mode: str, cls_rope: str):
        super().__init__()
        self.mode, self.cls_rope = mode, cls_rope
        dim = head_dim // 2 if mode == "2d" else head_dim      # 2D: each half of the pairs has its own angles
        inv = 1.0 / base ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim)
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions (B, L, 2) long -> (cos, signed sin), each (B, L, 1, head_dim) float32: the
        angle of pair i repeated on both of its lanes, sin negated on the even lane."""
        pos = positions.float()
        ang = pos[..., 1:2] * self.inv_freq
        if self.mode == "2d":
            ang = torch.cat([pos[..., 0:1] * self.inv_freq, ang], dim=-1)
        cell_less = (positions[..., :1] < 0)
        cos = ang.cos().masked_fill(cell_less, 0.0 if self.cls_rope == "zeros" else 1.0)
        sin = ang.sin().masked_fill(cell_less, 0.0)
        return (torch.stack([cos, cos], dim=-1).flatten(-2).unsqueeze(2),
                torch.stack([-sin, sin], dim=-1).flatten(-2).unsqueeze(2))


def _swap(x: Tensor) -> Tensor:
    """(..., 2k) -> (..., 2k) with the lanes of each pair exchanged; one strided copy."""
    return torch.stack([x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)


class _SwapPairs(torch.autograd.Function):
    """``_swap`` with its own backward: the swap is a permutation and its own inverse, so the
    gradient is the swapped gradient (a slice-based autograd graph would zero-fill twice)."""

    @staticmethod
    def forward(x: Tensor) -> Tensor:
        return _swap(x)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return _SwapPairs.apply(grad)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, L, heads, head_dim), pairs (x[2i], x[2i+1]) rotated by the angle of pair i, in float32:
    (x0 cos - x1 sin, x1 cos + x0 sin) = x * cos + swap_pairs(x) * signed sin (three kernels)."""
    xf = x.float()
    swapped = _SwapPairs.apply(xf) if xf.requires_grad else _swap(xf)   # no autograd: skip its overhead
    return torch.addcmul(xf * cos, swapped, sin).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, shape: Shape):
        super().__init__()
        self.n_head, self.head_dim, self.dim = shape.n_head, shape.head_dim, shape.dim
        self.wqkv = Linear(shape.dim, 3 * shape.dim)
        self.wo = Linear(shape.dim, shape.dim)
        self.attn_dropout = cfg.attn_dropout
        self.resid_dropout = nn.Dropout(cfg.resid_dropout)
        self.backend = cfg.attention       # a name in attention.BACKENDS, or "auto"
        self.cache: tuple[Tensor, Tensor] | None = None

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], vis: Visibility | None,
                step: CacheStep | None = None) -> Tensor:
        """x (B, L, dim) -> (B, L, dim). ``step`` set: a cached decode step (``vis`` unused)."""
        B, L, _ = x.shape
        q, k, v = self.wqkv(x).view(B, L, 3, self.n_head, self.head_dim).unbind(2)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        backend = get_backend(self.backend, x.device)
        if step is None:
            out = backend.attend(q, k, v, vis, self.attn_dropout if self.training else 0.0)
        else:
            kc, vc = self.cache
            keys, values = step.write(kc, k), step.write(vc, v)
            out = backend.attend_cached(q, keys, values, step.start, step.vis)
        out = out.transpose(1, 2).reshape(B, L, self.dim)
        return self.resid_dropout(self.wo(out))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig, shape: Shape):
        super().__init__()
        self.w1 = Linear(shape.dim, shape.ffn_dim)
        self.w3 = Linear(shape.dim, shape.ffn_dim)
        self.w2 = Linear(shape.ffn_dim, shape.dim)
        self.ffn_dropout = nn.Dropout(cfg.ffn_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.ffn_dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, shape: Shape):
        super().__init__()
        self.attention = Attention(cfg, shape)
        self.feed_forward = FeedForward(cfg, shape)
        self.attention_norm = RMSNorm(shape.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(shape.dim, cfg.norm_eps)

    def forward(self, x, rope, vis=None, step=None):
        h = x + self.attention(self.attention_norm(x), rope, vis, step)
        return h + self.feed_forward(self.ffn_norm(h))


class GPT(nn.Module):
    """Decoder over [prefix, tokens, extra tokens].

    prefix: what ``CONDITIONING[cfg.conditioning]`` takes (class labels (B,): one class token; prompt
    tokens (B, P)). ``register_token`` adds the one shared learnable embedding used for every
    extra token. The objectives' model interface (mutor2d.objectives.base.TokenModel).
    """
    sparse_logits = False        # objectives mask every row's loss: no host sync, one compiled graph
    decode_step = None           # runs ``decode`` when set: its compiled self (sampling.decoding.compile_decoder)
    decode_graphs = None         # replays plain decode rounds as graphs when set (sampling.captured.capture_decoder)

    def __init__(self, cfg: ModelConfig, register_token: bool = False):
        super().__init__()
        self.cfg = cfg
        self.shape = shape = model_shape(cfg)
        if shape.dim % shape.n_head:
            raise ValueError(f"model.dim={shape.dim} is not divisible by model.n_head={shape.n_head}")
        self.conditioning = conditioning(cfg.conditioning)
        self.conditioning.build(self)
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, shape.dim)
        self.tok_dropout = nn.Dropout(cfg.token_dropout)
        self.layers = nn.ModuleList(TransformerBlock(cfg, shape) for _ in range(shape.n_layer))
        self.norm = RMSNorm(shape.dim, cfg.norm_eps)
        self.output = Linear(shape.dim, cfg.vocab_size)
        self.rotary = Rotary(shape.head_dim, cfg.rope_base, cfg.rope, cfg.cls_rope)
        if register_token:
            self.register_embedding = nn.Parameter(torch.zeros(shape.dim))
        self.reset_parameters()

    @property
    def has_register_token(self) -> bool:
        return hasattr(self, "register_embedding")

    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, std)
        nn.init.zeros_(self.output.weight)       # LlamaGen zero-inits the output layer
        if self.has_register_token:
            nn.init.normal_(self.register_embedding, 0.0, std)

    def prefix_len(self, prefix: Tensor) -> int:
        return self.conditioning.prefix_len(prefix)

    def embed(self, tokens: Tensor | None, prefix: Tensor | None, num_extra: int = 0) -> Tensor:
        """(B, P + T_tokens + num_extra, dim) input embeddings, before token dropout."""
        parts = []
        if prefix is not None:
            parts.append(self.conditioning.embed(self, prefix))
        if tokens is not None and tokens.shape[1] > 0:
            parts.append(self.tok_embeddings(tokens))
        if num_extra:
            if not self.has_register_token:
                raise ValueError("num_extra > 0 needs a model built with register_token=True")
            parts.append(self.register_embedding.to(parts[0].dtype).expand(parts[0].shape[0], num_extra, -1))
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    def hidden(self, h: Tensor, positions: Tensor, vis: Visibility | None = None,
               step: CacheStep | None = None, prefix_len: int | None = None) -> Tensor:
        """Transformer trunk: embeddings (B, L, dim) -> last hidden states (B, L, dim), pre-norm.
        ``prefix_len``: the P prefix slots at the front, for ``model.prompt_attention``."""
        if step is None:
            vis = self.prompt_rule(vis, h.shape[0], h.shape[1], prefix_len, h.device)
        return self._trunk(h, positions, vis, step)

    def _trunk(self, h: Tensor, positions: Tensor, vis: Visibility | None, step: CacheStep | None) -> Tensor:
        """The blocks under ``vis`` as given (``hidden`` without the prompt rule)."""
        if positions.shape[:2] != h.shape[:2]:
            raise ValueError(f"position ids {tuple(positions.shape)} do not match tokens {tuple(h.shape[:2])}")
        rope = self.rotary(positions)
        h = self.tok_dropout(h)
        if step is None and vis is not None:
            self._prepare_masks(vis)
        if step is not None and not torch.compiler.is_compiling():
            for t in (h, *rope):                 # decode: any batch size, one graph (compiled blocks;
                                                 # inside a compiled ``decode`` marking is not allowed)
                torch._dynamo.maybe_mark_dynamic(t, 0)
        for layer in self.layers:
            h = layer(h, rope, vis, step)
        return h

    def prompt_rule(self, vis: Visibility | None, batch: int, length: int, prefix_len: int | None,
                    device) -> Visibility | None:
        """``vis`` (None: causal) under this model's ``prompt_attention``: unchanged when causal, else
        with the first ``prefix_len`` slots open to each other (attention.open_prefix)."""
        if self.cfg.prompt_attention == "causal":
            return vis
        if prefix_len is None:
            raise ValueError("model.prompt_attention=bidirectional: the caller must pass prefix_len (the prefix "
                             "slots at the front) to hidden / hidden_with_heads")
        if prefix_len < 2:
            return vis
        return open_prefix(vis if vis is not None else causal_rule(batch, length, device), prefix_len)

    def _prepare_masks(self, vis: Visibility) -> None:
        """Masks of ``vis`` built once before the blocks (each block's backend may differ)."""
        for name, dropout_p in {(layer.attention.backend, layer.attention.attn_dropout if self.training else 0.0)
                                for layer in self.layers}:
            get_backend(name, vis.key_rank.device).prepare(vis, dropout_p)

    def logits(self, h: Tensor) -> Tensor:
        """Final norm + LM head, float32 logits."""
        return self.output(self.norm(h)).float()

    def head_layers(self, count: int) -> nn.ModuleList:
        """``count`` fresh transformer blocks for extra heads on the trunk (the multi-head baseline; the
        objective owns them), linear weights drawn from N(0, init_std)."""
        heads = nn.ModuleList(TransformerBlock(self.cfg, self.shape) for _ in range(count))
        for m in heads.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, self.cfg.init_std)
        return heads

    def hidden_with_heads(self, h: Tensor, positions: Tensor, heads: nn.ModuleList,
                          prefix_len: int | None = None) -> tuple[Tensor, list[Tensor]]:
        """Causal (prompt rule as ``hidden``): (trunk hidden states (B, L, dim), [head k's (B, L, dim)]),
        each head one extra block on the trunk's last hidden states (pre-norm: ``logits`` applies the
        shared final norm)."""
        vis = self.prompt_rule(None, h.shape[0], h.shape[1], prefix_len, h.device)
        out = self._trunk(h, positions, vis, None)
        rope = self.rotary(positions)
        return out, [head(out, rope, vis) for head in heads]

    def forward(self, tokens: Tensor | None, positions: Tensor, prefix: Tensor | None = None,
                num_extra: int = 0, visibility: Visibility | None = None) -> Tensor:
        """Logits (B, P + T + num_extra, vocab) for prefix + tokens + extra tokens."""
        h = self.embed(tokens, prefix, num_extra)
        P = self.prefix_len(prefix) if prefix is not None else 0
        return self.logits(self.hidden(h, positions, visibility, prefix_len=P))

    # ------------------------------------------------------------------ decoding
    def setup_cache(self, batch_size: int, max_len: int, dtype=None, device=None) -> None:
        """Static KV cache for decoding (not part of the state dict)."""
        p = self.output.weight
        dtype, device = dtype or p.dtype, device or p.device
        shape = (batch_size, self.shape.n_head, max_len, self.shape.head_dim)
        for layer in self.layers:
            layer.attention.cache = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in "kv")
            for cache in layer.attention.cache:      # compiled blocks: no recompile per batch size
                torch._dynamo.maybe_mark_dynamic(cache, [0, 2])

    def clear_cache(self) -> None:
        for layer in self.layers:
            layer.attention.cache = None

    def decode(self, tokens: Tensor | None, positions: Tensor, cache_start: int | Tensor,
               prefix: Tensor | None = None, extra_positions: Tensor | None = None,
               extra_limit: Tensor | None = None) -> Tensor:
        """Cached step -> logits (B, R + E, vocab) of the new tokens: ``eager_decode``, or ``decode_step``
        when set (every argument passed by position: one call signature for a compiled step)."""
        step = self.decode_step or self.eager_decode
        return step(tokens, positions, cache_start, prefix, extra_positions, extra_limit)

    def eager_decode(self, tokens: Tensor | None, positions: Tensor, cache_start: int | Tensor,
                     prefix: Tensor | None = None, extra_positions: Tensor | None = None,
                     extra_limit: Tensor | None = None) -> Tensor:
        """Cached step -> logits (B, R + E, vocab) of the new tokens.

        Regular part: (prefix and) ``tokens``, R tokens with ``positions`` (B, R, 2); their keys
        are written at cache index ``cache_start`` (int, or (B,) long: one start per row) and
        they attend causally to the cache (a prefix given here is the prefill, at cache index 0: its
        slots see each other under ``model.prompt_attention=bidirectional``). Extra part (optional): E register tokens with
        ``extra_positions`` (B, E, 2); extra e reads cache entries 0..``extra_limit[b, e]``
        (this step's regular tokens included; -1 = none) and itself; its keys are never written
        to the cache and no regular token sees it."""
        E = 0 if extra_positions is None else extra_positions.shape[1]
        h = self.embed(tokens, prefix, E)
        R = h.shape[1] - E
        P = self.prefix_len(prefix) if prefix is not None else 0
        opens = self.cfg.prompt_attention != "causal" and P > 1
        if E == 0 and isinstance(cache_start, int) and not opens:
            step = CacheStep(cache_start, R, cache_start + R)
        else:
            step = extra_step(h.shape[0], R, cache_start, extra_limit, h.device)
            if opens:                         # the prefill: the prefix sits at cache indices 0..P-1
                step.vis = open_prefix(step.vis, P)
            if E:
                positions = torch.cat([positions, extra_positions], dim=1)
        return self.logits(self._trunk(h, positions, None, step))

    def fixed_decode(self, tokens: Tensor, positions: Tensor, index: Tensor) -> Tensor:
        """A decode step of fixed shapes, for a CUDA graph (mutor2d.sampling.captured): ``tokens`` (B, 1)
        at ``positions`` (B, 1, 2), their keys written at cache index ``index`` (0-dim long tensor, every
        row), attending to cache entries 0..index -> logits (B, 1, vocab); as ``eager_decode`` at that
        index, reading the whole cache under a mask instead of its first index + 1 entries."""
        h = self.embed(tokens, None)
        step = fixed_step(h.shape[0], self.layers[0].attention.cache[0].shape[2], index)
        return self.logits(self._trunk(h, positions, None, step))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
