"""Hugging Face Hub-style folders: ``save_pretrained``, ``from_pretrained``, ``push_to_hub``.

``MutorModel`` wraps the GPT of a checkpoint with ``huggingface_hub.ModelHubMixin``. A saved folder holds
  model.safetensors  the weights (EMA when the checkpoint has them), with the step, grid, run config and
                     weight kind as safetensors metadata (the layout of ``checkpoint.export.export_safetensors``);
  config.json        {"format": "mutor2d", "step", "grid", "weights", "tokenizer", "run_config",
                     "weights_sha256": the SHA-256 of model.safetensors, checked at every load};
  README.md          the model card: the run's config, its FID records (RUN/eval/, as eval/leaderboard.py
                     shows them), a sample grid and how to sample;
  sample.png         that grid, sampled from the saved weights with the run's sample settings.
``mutor2d.checkpoint.locate.resolve`` maps such a folder to its model.safetensors once its checksum matches
(``io.verified_weights``), so ``sample.py --ckpt``, ``train.init_from``, ``app.py`` and ``from_pretrained``
take it like a run folder. ``save`` replaces only its own files (``OWN_FILES``, through a temp folder:
:func:`write_folder`); an OUT holding anything else is refused unless --force (:func:`check_out`).

    from mutor2d.hub import MutorModel
    MutorModel.from_checkpoint("runs/digits_mutor2d").save_pretrained("digits_hub")
    MutorModel.from_pretrained("digits_hub")          # or a hub id: "user/mutor2d-digits"
    python -m mutor2d.hub save runs/digits_mutor2d digits_hub [--force] [--push user/mutor2d-digits]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import yaml
from huggingface_hub import ModelCard, ModelHubMixin, snapshot_download
from huggingface_hub.utils import HFValidationError, validate_repo_id

from . import io
from . import checkpoint
from .checkpoint import export, inference, locate
from .checkpoint.locate import HUB_WEIGHTS as WEIGHTS, is_hub_folder
from .cli import HelpFormatter

CARD_IMAGE = "sample.png"
CARD_PER_CLASS = 4       # samples a class at most in the card's grid
OWN_FILES = (WEIGHTS, CARD_IMAGE, "README.md", "config.json")   # what save writes (config.json, the checksum, last)


class HubError(ValueError):
    """An output folder ``save`` must not write into; one-line message."""


def run_folder(path: Path) -> Path | None:
    """The run folder of a checkpoint file (RUN/checkpoints/step_*.pt), a run folder itself, else None."""
    if path.is_dir() and (path / "checkpoints").is_dir():
        return path
    return path.parent.parent if path.parent.name == "checkpoints" else None


class MutorModel(ModelHubMixin, library_name="mutor2d", tags=["mutor2d", "image-generation", "autoregressive"]):
    """A checkpoint's GPT (eval mode) with its run config ``cfg``, ``meta`` (step, grid, has_ema,
    config: as ``checkpoint.inference.read_meta``) and the run folder it came from (for the card)."""

    def __init__(self, model, cfg, meta: dict, run_dir: Path | None = None):
        self.model, self.cfg, self.meta, self.run_dir = model, cfg, meta, run_dir

    @classmethod
    def from_checkpoint(cls, path, use_ema: bool = True, device="cpu") -> "MutorModel":
        """A checkpoint file, run folder, safetensors export or hub folder."""
        path = locate.resolve(path)
        model, cfg, meta = inference.open_model(path, use_ema=use_ema, device=device)
        return cls(model, cfg, {**meta, "has_ema": bool(use_ema and meta["has_ema"])}, run_folder(path))

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision, cache_dir, force_download, local_files_only, token,
                         device="cpu", **kwargs) -> "MutorModel":
        folder = Path(model_id)
        if not folder.is_dir():
            folder = Path(snapshot_download(model_id, revision=revision, cache_dir=cache_dir, token=token,
                                            force_download=force_download, local_files_only=local_files_only))
        if not is_hub_folder(folder):
            raise checkpoint.CheckpointError(f"{model_id!r} is not a mutor2d model folder "
                                             f"(expected config.json with format mutor2d and {WEIGHTS})")
        return cls.from_checkpoint(folder, device=device)

    def hub_config(self, weights_sha256: str) -> dict:
        """What config.json holds, with the SHA-256 of the weights file."""
        return {"format": "mutor2d", "step": self.meta["step"], "grid": self.meta["grid"],
                "weights": "ema" if self.meta["has_ema"] else "model",
                "tokenizer": tokenizer_reference(self.cfg), "run_config": self.meta["config"],
                "provenance": self.meta.get("provenance"), io.WEIGHTS_SHA256_KEY: weights_sha256}

    def _save_pretrained(self, save_directory: Path) -> None:
        weights = export.save_safetensors(self.model.state_dict(), self.meta,
                                              "ema" if self.meta["has_ema"] else "model", save_directory / WEIGHTS)
        config = self.hub_config(io.file_sha256(weights))
        (save_directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if has_card_image(self.cfg):
            self.write_card_image(save_directory / CARD_IMAGE, weights)
        (save_directory / "README.md").unlink(missing_ok=True)    # the card follows the weights

    def write_card_image(self, out: Path, weights: Path) -> None:
        """A grid sampled now from ``weights`` (the file the folder ships, read back), with the run's
        sample settings and at most CARD_PER_CLASS samples a class: the card shows its own weights,
        never an older training grid."""
        from dataclasses import replace

        from .sampling import images as generation
        from .data.tokens import build_tokenizer
        model = inference.open_model(weights, device=next(self.model.parameters()).device)[0]
        s = replace(self.cfg.sample, per_class=min(self.cfg.sample.per_class, CARD_PER_CLASS))
        classes = generation.grid_classes(s, len(model.conditioning.choices(self.cfg.model)))
        generation.write_grid(model, build_tokenizer(self.cfg.data), tuple(self.meta["grid"]), s, classes,
                              out, objective=self.cfg.objective)

    def generate_model_card(self, *args, **kwargs) -> ModelCard:
        return ModelCard(model_card(self.cfg, self.meta, self.run_dir))


def tokenizer_reference(cfg) -> dict:
    """What decodes the tokens: the data section's variant and tokenizer ("pixel" with its grey levels,
    or a VQ checkpoint path, e.g. LlamaGen's vq_ds16_c2i.pt, to be found on the sampling machine; None
    for data that are tokens already, such as star graphs)."""
    tokenizer = getattr(cfg.data, "tokenizer", None)
    ref = {"data": cfg.data.name, "tokenizer": tokenizer}
    if tokenizer == "pixel" and hasattr(cfg.data, "levels"):
        ref["levels"] = cfg.data.levels
    return ref


def fid_table(run_dir: Path | None) -> str:
    """The run's evaluation records (RUN/eval/*.json) as eval/leaderboard.py's markdown table."""
    from .evaluation import records
    if run_dir is None or not any((run_dir / "eval").glob("*.json")):
        return "No evaluation records yet (`python eval/fid.py SAMPLES.npz --ref ...` writes them to RUN/eval/)."
    recs, _ = records.read_records([run_dir])
    return records.markdown_table(recs)


def has_card_image(cfg) -> bool:
    """Whether the card shows a sample grid: its conditioning kind has a fixed set of prefixes to pick
    rows from (class labels do; prompts do not, and their folder ships no picture)."""
    return cfg.model.conditioning_kind().num_choices(cfg.model) is not None


def model_card(cfg, meta: dict, run_dir: Path | None) -> str:
    """The README.md of a saved folder (YAML front matter for the hub, then the card)."""
    objective = cfg.objective.name
    run_yaml = yaml.safe_dump(meta["config"], sort_keys=False)
    kind = cfg.model.conditioning_kind()
    conditioned = "class-conditional" if kind.per_class else f"{kind.name}-conditioned"
    image = f"![samples]({CARD_IMAGE})" if has_card_image(cfg) else \
        f"(no sample grid: model.conditioning={kind.name!r} has no fixed set of prefixes to sample)"
    return f"""---
library_name: mutor2d
tags: [mutor2d, image-generation, autoregressive, {objective}]
---

# mutor2d: {objective} GPT, step {meta['step']}

A {conditioned} autoregressive image model (LlamaGen-style decoder over a {meta['grid'][0]}x{meta['grid'][1]}
token grid) trained with `{objective}` in mutor2d; weights: {'EMA' if meta['has_ema'] else 'raw'}
(`model.safetensors`); tokenizer: `{json.dumps(tokenizer_reference(cfg))}`.

{image}

## Evaluation

{fid_table(run_dir)}

## Sample

With mutor2d installed (`pip install -e ".[demo]"` in its repository):

```bash
python sample.py --ckpt THIS_FOLDER --classes 1,7 --per-class 8 --cfg {cfg.sample.cfg_scale}
python app.py --ckpt THIS_FOLDER        # the interactive demo
```

```python
from mutor2d.hub import MutorModel
m = MutorModel.from_pretrained("THIS_FOLDER_OR_HUB_ID")    # m.model: the GPT, m.cfg: its run config
```

## Run config

```yaml
{run_yaml}```
"""


def foreign_files(out: Path) -> list[str]:
    """Names in folder ``out`` that ``save`` did not write: all of them unless it is a mutor2d hub
    folder, else those not in OWN_FILES."""
    names = sorted(p.name for p in out.iterdir())
    return [n for n in names if n not in OWN_FILES] if is_hub_folder(out) else names


def check_out(out: Path, force: bool) -> None:
    """HubError (one line) for an OUT that is a file, or that holds files ``save`` did not write (unless ``force``)."""
    if out.exists() and not out.is_dir():
        raise HubError(f"{str(out)!r} is a file; expected a folder for the hub folder to write")
    foreign = foreign_files(out) if out.is_dir() else []
    if foreign and not force:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise HubError(f"{str(out)!r} holds files hub save did not write ({shown}): choose a new folder, or "
                       f"--force to replace only {', '.join(OWN_FILES)} there")


def write_folder(model: MutorModel, out: Path) -> None:
    """``save_pretrained`` into a temp folder beside ``out``, then move it in: the whole folder when
    ``out`` does not exist, else each of OWN_FILES over its namesake (every other file stays)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=io.TEMP_SUFFIX))
    try:
        model.save_pretrained(tmp)
        if out.exists():
            for name in OWN_FILES:
                os.replace(tmp / name, out / name)
        else:
            os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def repo_id_arg(text: str) -> str:
    """argparse type for a hub repository id ('name' or 'namespace/name'), checked before anything is written."""
    try:
        validate_repo_id(text)
    except HFValidationError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    return text


def push(model: MutorModel, repo_id: str, out: Path) -> None:
    """Upload ``model`` to ``repo_id``; a failure (no network, no token, refused) is one line, exit 2."""
    try:
        print(model.push_to_hub(repo_id))
    except Exception as e:                             # the hub client's errors have no common base class
        print(f"error: could not push to {repo_id!r} ({type(e).__name__}: {e}); the hub folder {str(out)!r} is "
              f"written", file=sys.stderr)
        raise SystemExit(2) from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m mutor2d.hub", formatter_class=HelpFormatter,
                                 description="Save a checkpoint as a hub folder (and push it).")
    sub = ap.add_subparsers(dest="cmd", required=True, help="what to do (save: a hub folder, --push: also upload)")
    save = sub.add_parser("save", help="CKPT (file, run folder, export) -> hub folder OUT",
                          formatter_class=HelpFormatter,
                          description="Write a hub folder (config.json, model.safetensors, a model card) that "
                                      "sample.py, app.py and MutorModel.from_pretrained read.")
    save.add_argument("ckpt", help="checkpoint file, run folder (its newest checkpoint) or safetensors export")
    save.add_argument("out", help="the hub folder to write")
    save.add_argument("--no-ema", action="store_true", help="the raw weights even when EMA exists")
    save.add_argument("--force", action="store_true",
                      help="write into an OUT that holds other files (only the hub folder's own four files "
                           "are replaced; default: refuse)")
    save.add_argument("--push", metavar="REPO_ID", type=repo_id_arg,
                      help="also push to this hub repository (default: local only)")
    return ap


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    try:
        check_out(out, args.force)
        model = MutorModel.from_checkpoint(args.ckpt, use_ema=not args.no_ema)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    with io.exit_on_write_error(f"hub folder {str(out)!r}", "the temp folder beside it is removed"):
        write_folder(model, out)
    print(f"wrote {args.out}")
    if args.push is not None:
        push(model, args.push, out)


if __name__ == "__main__":
    from .preempt import exit_on_ctrl_c
    exit_on_ctrl_c()        # python -m: a Ctrl-C mid-way is one line, exit 130
    main()
