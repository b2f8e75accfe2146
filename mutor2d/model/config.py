"""The ``model`` section: the GPT's size, conditioning kind, RoPE, dropouts and attention backend, and
its size presets, built by mutor2d.model.gpt.GPT. No torch here (the rule: mutor2d.config);
conditioning kinds are torch-free to import (mutor2d.model.conditioning)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..checks import ConfigError, at_least, fail, fraction
from ..config import register_section
from .conditioning import CONDITIONING, conditioning

PROMPT_ATTENTION = ("causal", "bidirectional")    # model.prompt_attention: how prefix tokens see each other
BUILT_IN_BACKENDS = ("sdpa", "flex")  # mutor2d.model.attention registers them; a plugin's joins BACKENDS there


def check_backend(name: str) -> None:
    """``model.attention``: auto, a built-in backend, or (importing the registry, so torch) a plugin's."""
    if name in ("auto", *BUILT_IN_BACKENDS):
        return
    from .attention import BACKENDS
    if name not in BACKENDS:
        fail("model.attention", f"one of {['auto', *BACKENDS]} (a plugin's backend: its module in "
             f"MUTOR2D_PLUGINS)", name)


PRESETS = {  # model.preset -> (n_layer, n_head, dim); B..3B are LlamaGen's GPT sizes
    "tiny": (2, 2, 64),
    "small": (4, 4, 128),
    "B": (12, 12, 768),
    "L": (24, 16, 1024),
    "XL": (36, 20, 1280),
    "XXL": (48, 24, 1536),
    "3B": (24, 32, 3200),
}


PARAMS_LIMIT = 30 * 10 ** 9     # model parameters: ten times the 3B preset (120 GB of float32 weights)


@register_section("model", build="mutor2d.model.gpt:GPT")
@dataclass
class ModelConfig:
    """LlamaGen-style decoder. ``preset`` fills n_layer/n_head/dim unless they are set explicitly."""
    preset: Literal["tiny", "small", "B", "L", "XL", "XXL", "3B", "custom"] = "tiny"
    n_layer: int | None = None
    n_head: int | None = None
    dim: int | None = None
    vocab_size: int = 16384
    num_classes: int = 1000          # class-conditional prefix; ignored for prompt prefixes
    conditioning: str = "class"      # what the prefix is: a kind of mutor2d.model.conditioning.CONDITIONING
    rope: Literal["2d", "1d"] = "2d"
    rope_base: float = 10000.0
    cls_rope: Literal["identity", "zeros"] = "identity"  # "zeros" = LlamaGen's class-token rotation
    norm_eps: float = 1e-5
    init_std: float = 0.02
    token_dropout: float = 0.1
    attn_dropout: float = 0.0
    resid_dropout: float = 0.1
    ffn_dropout: float = 0.1
    class_dropout: float = 0.1       # labels dropped to the null class (CFG)
    attention: str = "auto"          # "auto" (flex on CUDA, else sdpa) or a backend of mutor2d.model.attention.BACKENDS
    prompt_attention: str = "causal"  # "bidirectional": prefix tokens see the whole prefix (attention.open_prefix)

    def conditioning_kind(self):
        """The conditioning kind (mutor2d.model.conditioning.CONDITIONING)."""
        return conditioning(self.conditioning)

    def check(self) -> None:
        if self.conditioning not in CONDITIONING:
            fail("model.conditioning", f"one of {list(CONDITIONING)}", self.conditioning)
        check_backend(self.attention)
        if self.prompt_attention not in PROMPT_ATTENTION:
            fail("model.prompt_attention", f"one of {list(PROMPT_ATTENTION)}", self.prompt_attention)
        if self.preset == "custom" and None in (self.n_layer, self.n_head, self.dim):
            raise ConfigError("model.preset: 'custom' needs model.n_layer, model.n_head and model.dim")
        for k in ("n_layer", "n_head", "dim", "vocab_size", "num_classes"):
            if getattr(self, k) is not None:
                at_least(f"model.{k}", getattr(self, k), 1)
        self._check_head_size()
        self._check_size()
        for k in ("rope_base", "norm_eps"):
            if getattr(self, k) <= 0:
                fail(f"model.{k}", "> 0", getattr(self, k))
        at_least("model.init_std", self.init_std, 0)
        for k in ("token_dropout", "attn_dropout", "resid_dropout", "ffn_dropout", "class_dropout"):
            fraction(f"model.{k}", getattr(self, k))

    def _check_head_size(self) -> None:
        _, heads, dim = _preset_filled(self)
        if dim % heads:
            raise ConfigError(f"model.dim: {dim} is not divisible by model.n_head={heads}")
        step = 4 if self.rope == "2d" else 2   # 2D RoPE: half the pairs rotate by row, half by column
        if (dim // heads) % step:
            raise ConfigError(f"model.rope={self.rope}: needs a head size (model.dim / model.n_head = "
                              f"{dim}/{heads}) divisible by {step}")

    def _check_size(self) -> None:
        """A model of more than PARAMS_LIMIT parameters is refused before anything is allocated."""
        shape = model_shape(self)
        params = shape.params(self.vocab_size, self.num_classes)
        if params > PARAMS_LIMIT:
            sizes = ", ".join(f"model.{k}={getattr(shape, k)}" for k in ("n_layer", "dim"))
            raise ConfigError(f"{sizes}, model.vocab_size={self.vocab_size}, model.num_classes={self.num_classes}: "
                              f"about {params:.3g} parameters; expected at most {PARAMS_LIMIT:.0e} "
                              f"(ten times the 3B preset)")

    def check_grid(self, grid: tuple[int, int]) -> None:
        """model.rope=1d rotates by column only: on a grid with H > 1 two rows would share positions."""
        H, W = grid
        if self.rope == "1d" and H > 1:
            raise ConfigError(f"model.rope=1d: the data is a {H}x{W} grid; use model.rope=2d (1d is for H = 1)")


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_head: int
    dim: int

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def ffn_dim(self) -> int:
        """LlamaGen: 2/3 of 4*dim rounded up to a multiple of 256."""
        return -(-int(2 * 4 * self.dim / 3) // 256) * 256

    def params(self, vocab_size: int, num_classes: int) -> int:
        """Parameter count of a GPT of this shape (attention, feed-forward and norms per layer; token
        embeddings, output head and class embeddings), without building it."""
        d = self.dim
        layer = 4 * d * d + 3 * d * self.ffn_dim + 2 * d
        return self.n_layer * layer + 2 * vocab_size * d + (num_classes + 1) * d + d


def _preset_filled(cfg: ModelConfig) -> tuple:
    """(n_layer, n_head, dim): explicit values, else the preset's (None for 'custom')."""
    base = PRESETS.get(cfg.preset, (None, None, None))
    return tuple(v if v is not None else b for v, b in zip((cfg.n_layer, cfg.n_head, cfg.dim), base))


def model_shape(cfg: ModelConfig) -> Shape:
    return Shape(*_preset_filled(cfg))
