"""Make images from a training checkpoint.

PNG grid (rows = classes):
    python sample.py --ckpt runs/digits [--classes 1,7,9] [--per-class 8] [--cfg 2.0] [--out grid.png]
Class-balanced npz for evaluation (N / classes per class), sharded over processes, resumable:
    accelerate launch sample.py --ckpt RUN --num 50000 --npz samples.npz --cfg 2.0 --batch-size 125
(on CPUs: accelerate launch --multi_gpu --num_processes 2 sample.py ..., or torchrun --nproc_per_node 2
--no-python -- python sample.py ...). The npz is the
same for any number of processes; rerunning an interrupted command finishes it. accelerate's notice
"--num_processes was set to a value of 0" (no accelerate config) is harmless: docs/SCALING.md.

Outputs go beside their checkpoint unless --out / --npz PATH say otherwise: RUN/samples/ for a
checkpoint of a run folder, HUB_samples/ beside a hub folder, DIR/STEM_samples/ for any other file (a
safetensors export, a copied .pt), named step first like the training grids (RUN/samples/step_XXXXXXXX.png)
but never their name: step_XXXXXXXX_cfgC_seedS_DECODE[_tT][_kK][_pP][_raw]_CLASSES_xN_HASH.png (or
_CLASSES_nN_HASH.npz with --npz alone; CLASSES: cls1-7-9, all or 10cls; HASH: 6 hex digits of every
setting that shapes the output, so different outputs never share a name).
Grid rows are named in a left margin ("7"; "207: golden retriever" for ImageNet's 1000 classes; the
names also sit in the PNG's text chunk "rows"); --no-labels leaves the margin out.

--ckpt takes a checkpoint file or a run folder (its newest valid checkpoint). Sampling defaults
come from the checkpoint's ``sample`` config section, decoding mode included (``sample.decode``; old
checkpoints: plain); the flags below map onto its fields (``SAMPLE_FLAGS``), and --set sample.KEY=VALUE
sets any field (a plugin mode's too; MUTOR2D_PLUGINS=module[,module] imports plugins). --temperature 0 is greedy
decoding. Rows of a grid (and the samples of an npz) are the choices of the model's conditioning kind:
its classes for class labels. --decode registers drafts with the offsets the checkpoint's objective
trained, at most its useful draft length (the default); --decode auto picks the fastest exact mode for
the batch size and device from the crossover bench/sample.py measured (mutor2d/sampling/crossover.json).
--ckpt also takes a hub folder (mutor2d.hub: save_pretrained).
The token grid is the one the checkpoint records, else its dataset's; --grid HxW must equal it (a model
sampled at another grid makes garbage) and is needed only when neither is known.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from mutor2d.preempt import exit_on_ctrl_c
if __name__ == "__main__":       # before the other imports: a Ctrl-C while they load is one line, exit 130
    exit_on_ctrl_c()

from mutor2d import config, io           # the command line parses and checks before torch is imported
from mutor2d.checkpoint import locate
from mutor2d.checks import over_memory
from mutor2d.cli import HelpFormatter, check_choice
from mutor2d.config_files import parse_override
from mutor2d.plugins import load_plugins
from mutor2d.sampling.values import PER_CLASS_LIMIT, SampleFileError, parse_classes

if TYPE_CHECKING:
    from mutor2d.sampling.images import Loaded

# sample-section field -> (flag, argparse dest): the one mapping of flags onto the checkpoint's sample
# section; ``decode.*`` fields belong to the decoding mode (a flag for another mode's field is an error)
SAMPLE_FLAGS = {"cfg_scale": ("--cfg-scale", "cfg"), "temperature": ("--temperature", "temperature"),
                "top_k": ("--top-k", "top_k"), "top_p": ("--top-p", "top_p"), "decode.name": ("--decode", "decode"),
                "decode.draft": ("--draft", "draft"), "decode.anchors": ("--draft-anchors", "draft_anchors"),
                "decode.fill": ("--no-fill", "fill"), "decode.window": ("--window", "window"),
                "labels": ("--no-labels", "labels")}


NUM_LIMIT = 10 ** 6     # --num: samples of one npz (ImageNet's FID uses 50,000)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint file or run folder")
    p.add_argument("--out", help="PNG grid path (default: RUN/samples/step_XXXXXXXX_cfgC_seedS_DECODE_CLASSES_xN_HASH"
                                 ".png for a checkpoint of a run folder, HUB_samples/ beside a hub folder, else "
                                 "DIR/STEM_samples/ beside the checkpoint file; the training grids are "
                                 "RUN/samples/step_XXXXXXXX.png)")
    p.add_argument("--classes", help="comma-separated class indices (default: the checkpoint's sample.classes, "
                                     "else 10 spread over the classes; npz: all classes)")
    p.add_argument("--per-class", type=int, help="grid columns: samples per class (default: sample.per_class)")
    p.add_argument("--num", type=int, help="with --npz (required there): number of samples, a multiple of the "
                                           "class count")
    p.add_argument("--npz", nargs="?", const="", metavar="PATH",
                   help="write a class-balanced sample file instead of a grid, at PATH (default, --npz alone: "
                        "the folder of --out's default, step_XXXXXXXX_cfgC_seedS_DECODE_CLASSES_nN_HASH.npz)")
    p.add_argument("--cfg-scale", "--cfg", dest="cfg", type=float,
                   help="classifier-free guidance scale, 1 = off (default: sample.cfg_scale)")
    p.add_argument("--temperature", type=float, help="0 = greedy (default: sample.temperature)")
    p.add_argument("--top-k", type=int, help="0 = off (default: sample.top_k)")
    p.add_argument("--top-p", type=float, help="1 = off (default: sample.top_p)")
    p.add_argument("--seed", type=int, help="seed of the first batch; batch k uses shard_seed(seed, k) "
                                            "(default: sample.seed)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="samples per forward; npz: per shard (the file depends on it, not on the process count)")
    p.add_argument("--grid", help="token grid HxW (default: the model's; must equal it when known)")
    p.add_argument("--ema", action=argparse.BooleanOptionalAction, default=True,
                   help="use the EMA weights when the checkpoint has them")
    p.add_argument("--compile", action="store_true", help="torch.compile the decoding step (default: eager; "
                                                          "compiling costs about 25 s + 6.5 s per layer on an H200)")
    p.add_argument("--capture", action=argparse.BooleanOptionalAction, default=None,
                   help="replay the plain decode rounds as a CUDA graph (mutor2d.sampling.captured; default: on "
                        "CUDA without --compile; speculative rounds stay eager)")
    p.add_argument("--decode", metavar="MODE",
                   help="plain (one token per forward); registers (exact speculative decoding with the "
                        "checkpoint's register drafts, --draft K); jacobi (exact speculative Jacobi decoding, "
                        "--window K); auto (the fastest exact mode for the batch size and device, measured: "
                        "mutor2d/sampling/crossover.json); modes of MUTOR2D_PLUGINS modules too (default: the "
                        "checkpoint's sample.decode, plain)")
    p.add_argument("--draft", type=int, help="--decode registers: draft tokens per forward (default and maximum: "
                                             "the checkpoint's useful draft length)")
    p.add_argument("--draft-anchors", choices=("every", "last"),
                   help="--decode registers: K registers after every verified token (a partial acceptance "
                        "keeps fresh drafts) or after the last one only (K extra tokens per row, not (K+1)K; "
                        "default: sample.decode.anchors, every)")
    p.add_argument("--no-fill", dest="fill", action="store_const", const=False,
                   help="--decode registers: no Jacobi guesses where a register cannot draft (row ends; "
                        "default: fill them)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing --out, or an --npz file made with other settings (default: refuse; "
                        "an npz of the same settings is reported complete)")
    p.add_argument("--no-labels", dest="labels", action="store_const", const=False,
                   help="grid PNG without the left margin naming each row's class (default: the checkpoint's "
                        "sample.labels, true; the names stay in the PNG's text chunk 'rows')")
    p.add_argument("--window", type=int, help="--decode jacobi: window of guessed tokens (default: "
                                              "sample.decode.window, 4)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="sample.KEY=VALUE",
                   help="override a field of the checkpoint's sample section, e.g. sample.decode.draft=2 or a "
                        "plugin mode's field (repeatable; the flags above apply after)")
    p.add_argument("--device", help="default: the accelerate process's device (cuda if present)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def pick(value, default):
    """A command-line value, or the config's default when the flag was not given."""
    return default if value is None else value


def pick_device(text: str | None):
    """(accelerate state, device): --device, else the accelerate process's device. A one-line error
    for a device this machine does not have."""
    import torch
    from accelerate import PartialState
    if text is not None:
        try:
            wanted = torch.device(text)
        except RuntimeError:
            raise SampleFileError(f"--device {text!r}: expected cpu, cuda or cuda:N") from None
        if wanted.type == "cuda" and not torch.cuda.is_available():
            raise SampleFileError(f"--device {text}: CUDA is not available on this machine")
        if wanted.type == "cuda" and wanted.index is not None and wanted.index >= torch.cuda.device_count():
            raise SampleFileError(f"--device {text}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    on_cpu = not torch.cuda.is_available() or (text or "").startswith("cpu")
    state = PartialState(cpu=on_cpu)      # cpu=True: several processes talk over gloo
    if text and state.num_processes > 1 and not on_cpu:
        raise SampleFileError(f"--device {text}: not with several processes (each process gets its own GPU)")
    return state, torch.device(text) if text else state.device


def check_args(args) -> None:
    """Flag values that need no checkpoint: one-line errors naming the flag."""
    if args.batch_size < 1:
        raise SampleFileError(f"--batch-size {args.batch_size}: expected >= 1")
    if args.seed is not None and args.seed < 0:
        raise SampleFileError(f"--seed {args.seed}: expected an integer >= 0")
    if args.npz is None and args.num is not None:
        raise SampleFileError("--num goes with --npz (a grid takes --per-class)")
    if args.npz is not None and (args.num is None or args.per_class is not None or args.out is not None):
        raise SampleFileError("--npz takes --num N (N / classes per class), not --per-class or --out")
    if args.npz and Path(args.npz).is_dir():
        raise SampleFileError(f"--npz {args.npz}: is a directory; expected the path of a .npz file")
    if args.out is not None and (Path(args.out).is_dir() or Path(args.out).suffix.lower() != ".png"):
        what = "is a directory" if Path(args.out).is_dir() else "is not a .png file name"
        raise SampleFileError(f"--out {args.out!r}: {what}; expected the path of a .png file")
    if args.out is not None and Path(args.out).exists() and not args.force:
        raise SampleFileError(f"--out {args.out}: exists; pass --force to replace it, or another --out")
    if args.classes is not None and not args.classes.strip():
        raise SampleFileError("--classes '': expected comma-separated class indices (leave the flag out for "
                              "the default classes)")
    for flag, value, high in (("--per-class", args.per_class, PER_CLASS_LIMIT), ("--num", args.num, NUM_LIMIT),
                              ("--draft", args.draft, None), ("--window", args.window, None)):
        if value is not None and value < 1:
            raise SampleFileError(f"{flag} {value}: expected >= 1")
        if value is not None and high is not None and value > high:
            raise SampleFileError(f"{flag} {value}: expected at most {high}")
    for item in args.overrides:
        if not item.startswith("sample."):
            raise SampleFileError(f"--set {item}: sample.py sets fields of the sample section (sample.KEY=VALUE)")
        parse_override(item)


def sample_section(args, src: Loaded):
    """The checkpoint's ``sample`` section with --set items, then the flags given, on top
    (SAMPLE_FLAGS; --decode to another mode drops the old mode's fields), checked once, its decoding
    mode fitted to the checkpoint's objective and grid. A bad value is a one-line error naming its flag
    (--set items are checked before: ``check_args``)."""
    given = {f: flag for f, (flag, dest) in SAMPLE_FLAGS.items() if getattr(args, dest) is not None}
    data = config.apply_overrides({"sample": config.section_dict(src.cfg.sample)}, args.overrides)
    mode = args.decode or data["sample"].get("decode", {}).get("name", "plain")
    known = {f.name for f in dataclasses.fields(config.variant_class("sample.decode", mode))}
    for f, flag in given.items():
        if f.startswith("decode.") and f != "decode.name" and f.split(".")[1] not in known:
            options = [SAMPLE_FLAGS.get(f"decode.{k}", (f"--set sample.decode.{k}",))[0] for k in sorted(known)]
            raise SampleFileError(f"{flag}: not an option of --decode {mode} (its options: "
                                  f"{', '.join(options) or 'none'})")
    data = config.apply_overrides(data, [f"sample.{f}={getattr(args, SAMPLE_FLAGS[f][1])}" for f in given])
    s = config.build_plain("sample", data["sample"])
    names = {f.removeprefix("decode."): flag for f, flag in given.items()}
    s.check(names)
    return dataclasses.replace(s, decode=s.decode.fit(src.cfg.objective, src.grid, names))


def pick_auto(args, src: Loaded, device) -> None:
    """--decode auto -> the fastest exact mode (``auto_decode``) for the images of one batch on this
    device; plain and jacobi only when the checkpoint's registers cannot draft."""
    if args.decode != "auto":
        return
    from mutor2d.sampling import images as generation
    from mutor2d.sampling.auto import auto_decode, can_draft
    s = src.cfg.sample
    rows = len(args.classes.split(",")) if args.classes else len(generation.grid_classes(s, src.num_choices))
    total = args.num if args.npz is not None else pick(args.per_class, s.per_class) * rows
    images = min(args.batch_size, total)
    args.decode = auto_decode(images, device, can_draft(src.cfg.objective))
    print(f"--decode auto: {args.decode} (batches of {images} images on {device.type})")


def check_memory(flag: str, value: int, images: int, side: int) -> None:
    """``images`` images of ``side`` x ``side`` RGB pixels, held in memory at once (a grid, an npz being
    assembled), must fit this machine's memory; else a one-line error naming the flag and both sizes."""
    if short := over_memory(images * side * side * 3):
        raise SampleFileError(f"{flag} {value}: {images} images of {side}x{side} pixels, {short}")


SHOWN_CLASSES = 6     # a file name lists at most this many classes (more: their count)


def class_part(classes: list[int], num_choices: int) -> str:
    """The classes in a file name: ``cls1-7-9``, ``all``, or ``10cls`` beyond SHOWN_CLASSES."""
    if list(classes) == list(range(num_choices)):
        return "all"
    return f"cls{'-'.join(map(str, classes))}" if len(classes) <= SHOWN_CLASSES else f"{len(classes)}cls"


def output_name(src: Loaded, s, seed: int, ema: bool, suffix: str, classes: list[int], count: str,
                batch_size: int) -> str:
    """The default output name (the module doc's pattern, never a training grid's): step, CFG scale, seed,
    decoding mode, temperature / top-k / top-p when on, ``raw`` for --no-ema, ``class_part``, ``count``
    (``x8`` per class, ``n1000`` samples), then 6 hex digits of the SHA-256 of everything that shapes the
    output (JSON, keys sorted), e.g. step_00001000_cfg1_seed3_registers_t0.9_raw_all_n1000_HASH.npz."""
    parts = [f"step_{src.step:08d}", f"cfg{s.cfg_scale:g}", f"seed{seed}", s.decode.name]
    parts += [f"{k}{v:g}" for k, v, off in (("t", s.temperature, 1), ("k", s.top_k, 0), ("p", s.top_p, 1)) if v != off]
    parts += [] if ema else ["raw"]
    section = {k: v for k, v in config.section_dict(s).items() if k not in ("classes", "per_class", "seed")}
    shaping = {"sample": section, "seed": seed, "classes": list(classes), "count": count, "batch_size": batch_size,
               "grid": list(src.grid), "ema": ema, "suffix": suffix}
    digest = hashlib.sha256(json.dumps(shaping, sort_keys=True, default=str).encode()).hexdigest()[:6]
    return "_".join([*parts, class_part(classes, src.num_choices), count, digest]) + suffix


def output_folder(path: Path) -> Path:
    """Where default outputs of checkpoint ``path`` go: ``locate.output_dir``, except beside a hub
    folder (HUB_samples/), never inside the folder meant to be shared."""
    hub = path.parent
    if path.name == locate.HUB_WEIGHTS and locate.is_hub_folder(hub):
        return hub.parent / f"{hub.name}_samples"
    return locate.output_dir(path)


def speed_line(stats, mode: str, processes: int = 1) -> str:
    """What sampling took: "sampled 20 images in 3.1 s of decoding (--decode plain: 64.0 forwards per
    image, 6.5 images/s)"; with several processes, this one's share."""
    if not stats.sequences:
        return "sampled no image"
    fpi = stats.summary()["forwards_per_sequence"]
    who = "this process " if processes > 1 else ""
    return (f"{who}sampled {stats.sequences} images in {stats.seconds:.1f} s of decoding (--decode {mode}: "
            f"{fpi:.1f} forwards per image, {stats.sequences / max(stats.seconds, 1e-9):.1f} images/s)")


def write_png(args, src: Loaded, s, sampler, path: Path, seed: int) -> None:
    """The PNG grid: one row per choice of the conditioning kind (class), --per-class columns, named in a
    left margin (unless --no-labels); --out, else ``output_folder``/``output_name``."""
    from mutor2d.sampling import images as generation
    n = src.num_choices
    classes = parse_classes(args.classes, n) if args.classes else generation.grid_classes(s, n)
    per_class = pick(args.per_class, s.per_class)
    if per_class < 1:
        raise SampleFileError(f"sample.per_class {per_class}: expected >= 1")
    side = src.tokenizer.image_size * max(1, -(-generation.GRID_MIN_SIDE // src.tokenizer.image_size))
    check_memory("--per-class", per_class, per_class * len(classes), side)
    prefixes = generation.balanced_prefixes(src.kind, src.cfg.model, per_class * len(classes), classes)
    images = generation.sample_batches(sampler, prefixes, args.batch_size, seed, src.kind)
    rows = [src.kind.row_label(src.cfg.model, c) for c in classes]
    out = args.out or output_folder(path) / output_name(src, s, seed, args.ema, ".png", classes, f"x{per_class}",
                                                        args.batch_size)
    with io.exit_on_write_error(str(out)):
        out = generation.save_grid(images, per_class, out, rows, labels=s.labels)
    print(speed_line(sampler.total, s.decode.name))
    print(f"wrote {out} ({len(classes)} rows x {per_class}: {', '.join(rows)}; step {src.step})")


def write_npz(args, src: Loaded, s, sampler, path: Path, seed: int, state) -> None:
    """The balanced npz (N / choices per choice: per class), its shards split over the processes."""
    from mutor2d.sampling import images as generation
    from mutor2d.sampling import npz as npz_files
    n = src.num_choices
    classes = parse_classes(args.classes, n) if args.classes else list(range(n))
    check_memory("--num", args.num, args.num, src.tokenizer.image_size)
    prefixes = generation.balanced_prefixes(src.kind, src.cfg.model, args.num, classes)
    options = {k: v for k, v in config.section_dict(s.decode).items() if k != "name"}   # the mode's fields
    meta = npz_files.sample_meta(checkpoint=str(path), step=src.step, config=src.cfg.to_dict(),
                                 settings=generation.sampling_settings(s), seed=seed, classes=classes, num=args.num,
                                 batch_size=args.batch_size, ema=src.ema, grid=src.grid, decode=s.decode.name,
                                 decode_options=options)
    out = args.npz or output_folder(path) / output_name(src, s, seed, args.ema, ".npz", classes, f"n{args.num}",
                                                        args.batch_size)
    job = npz_files.NpzJob(out, prefixes, args.batch_size, seed, meta, kind=src.kind)
    differ = job.differing_settings()          # []: the file holds this very job
    if differ == []:
        if state.is_main_process:
            print(f"{job.out} is already complete")
        return
    if job.out.exists() and not args.force:
        what = "not a sample file of this tool" if differ is None else f"made with other settings: {', '.join(differ)}"
        raise SampleFileError(f"{job.out} holds other samples ({what}); pass --force to replace "
                              f"it, or write to another --npz")
    todo = job.missing()              # every process lists the same shards before any is written
    state.wait_for_everyone()
    if len(todo) < job.num_shards and state.is_main_process:
        print(f"reusing {job.num_shards - len(todo)} of {job.num_shards} shards finished earlier in {job.dir}; "
              f"making the other {len(todo)}")
    try:
        with io.exit_on_write_error(str(job.dir)):
            job.run(sampler, todo[state.process_index::state.num_processes], progress=state.is_main_process)
    except KeyboardInterrupt:         # as SIGTERM: the finished shards stay for the rerun, said in one line
        done = job.num_shards - len(job.missing())
        raise KeyboardInterrupt(f"{done} of {job.num_shards} shards are finished in {job.dir}; the same command "
                                f"makes the rest") from None
    state.wait_for_everyone()
    if state.is_main_process:
        with io.exit_on_write_error(str(job.out)):
            job.assemble()
        print(speed_line(sampler.total, s.decode.name, state.num_processes))
        print(f"wrote {job.out} ({args.num} samples, {len(classes)} classes, step {src.step})")


def run(argv=None) -> None:
    """Check the flags (those that need no torch first), open the checkpoint and write the grid or npz."""
    args = parse_args(argv)
    check_args(args)
    path = locate.resolve(args.ckpt).resolve()
    from mutor2d.sampling.captured import capture_decoder
    from mutor2d.sampling.decoding import compile_decoder
    from mutor2d.sampling.config import decode_modes
    from mutor2d.sampling import images as generation
    check_choice(build_parser(), "--decode", args.decode, decode_modes())
    state, device = pick_device(args.device)
    src = generation.open_checkpoint(path, use_ema=args.ema, device=device, grid=args.grid)
    pick_auto(args, src, device)
    s = sample_section(args, src)
    seed = pick(args.seed, s.seed)
    if args.compile:
        compile_decoder(src.model)
    if args.capture or (args.capture is None and device.type == "cuda" and not args.compile):
        capture_decoder(src.model)
    sampler = generation.make_sampler(src.model, src.tokenizer, src.grid, s, objective=src.cfg.objective,
                                      device=device)
    if args.npz is not None:
        write_npz(args, src, s, sampler, path, seed, state)
    elif state.is_main_process:
        write_png(args, src, s, sampler, path, seed)
    if src.model.decode_graphs is not None and state.is_main_process:
        print(src.model.decode_graphs.summary() or "no plain decode round was captured (speculative rounds stay eager)")


def main(argv=None) -> None:
    """The command line (mutor2d.engine.entry.run_entry): library errors (SampleFileError, ConfigError,
    bad checkpoints, unreadable files) become one line ``error: ...`` on stderr and exit status 2, Ctrl-C
    one line and exit 130."""
    from mutor2d.engine.entry import run_entry

    def start() -> None:
        load_plugins()
        run(argv)
    run_entry(start)


if __name__ == "__main__":
    main()
