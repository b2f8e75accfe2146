"""LlamaGen interop: load a LlamaGen c2i GPT checkpoint (or a mutor2d one) into a GPT with strict
key and shape checks; the GPT's parameter names follow LlamaGen's gpt.py."""
from __future__ import annotations

import argparse

import torch

from ..io import read_torch_file
from .gpt import GPT


def llamagen_state_dict(obj) -> dict:
    """The GPT weights of a LlamaGen checkpoint: under "model", "ema", "module" or bare."""
    for key in ("model", "ema", "module", "state_dict"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            return obj[key]
    if isinstance(obj, dict) and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj
    raise ValueError("checkpoint holds no GPT weights (expected a state dict, or one under 'model'/'ema')")


def load_llamagen(model: GPT, obj, *, use_ema: bool = False) -> None:
    """Load a LlamaGen c2i GPT checkpoint, or a mutor2d one (path or loaded object), into ``model``
    with strict key checking. The register embedding, if the model has one, keeps its init (a
    checkpoint's own is taken when it has one; it is dropped for a model without registers).
    Logits match LlamaGen's only with ``cls_rope='zeros'`` (their class-token rotation)."""
    if isinstance(obj, (str, bytes)) or hasattr(obj, "__fspath__"):   # LlamaGen stores its argparse args
        obj = read_torch_file(obj, "GPT checkpoint", allow=[argparse.Namespace])
    if use_ema and isinstance(obj, dict) and "ema" in obj:
        obj = obj["ema"]
    sd = {k.removeprefix("_orig_mod.").removeprefix("module."): v for k, v in llamagen_state_dict(obj).items()}
    sd = {k: v for k, v in sd.items() if k != "freqs_cis" and ".kv_cache." not in k and k != "causal_mask"}
    own = model.state_dict()
    if model.has_register_token:        # its init, unless the checkpoint has its own
        sd.setdefault("register_embedding", own["register_embedding"])
    else:                               # a MuToR checkpoint into a model without registers
        sd.pop("register_embedding", None)
    missing, unexpected = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match the model: missing {missing[:8]}"
                         f"{'…' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
                         f"{'…' if len(unexpected) > 8 else ''}")
    bad = [k for k in sd if sd[k].shape != own[k].shape]
    if bad:
        raise ValueError("checkpoint shapes differ: " + ", ".join(
            f"{k} {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}" for k in bad[:4]))
    model.load_state_dict(sd, strict=True)
