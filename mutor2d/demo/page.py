"""The interactive demo (``python app.py --ckpt RUN_OR_FOLDER``): a gradio page that samples a class grid
from one checkpoint and shows the images forming while they are decoded (``TokenWatch``).

A request is a dict of settings (``DEFAULTS``), read from the page or from its URL's query parameters
(``settings_from_query``), so a result is shared by its link. It runs through the one path from a model
to images (``generation.make_sampler``) as one batch seeded with ``shard_seed(seed, 0)``, so the grid
equals ``sample.py --classes C --per-class N --seed S --batch-size len(C)*N`` (the page shows that
command). Bad settings are a message in the page; requests are queued (one decoding at a time); the
server logs one line per request. app.py's flags are checked before anything loads (mutor2d.demo.cli,
``check_port``); Ctrl-C / SIGTERM close the server within ``STOP_S`` seconds (``serve``).
"""
import dataclasses
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from urllib.parse import urlencode

import numpy as np
import torch

from .. import config
from ..checkpoint import locate
from ..sampling import images as generation
from ..plugins import load_plugins
from ..sampling.config import decode_modes
from ..sampling.auto import auto_decode, can_draft

LOG = logging.getLogger("mutor2d.demo")
MAX_IMAGES = 64              # images per request
FRAME_S = 0.25               # seconds between partial grids
STOP_S = 3.0                 # seconds the server gets to close after Ctrl-C / SIGTERM
DEFAULTS = {"classes": None, "per_class": 4, "cfg": None, "temperature": None, "top_k": None, "top_p": None,
            "seed": 0, "decode": "auto", "draft": 0, "window": 4}
# setting -> how a message names it (the page's labels)
LABELS = {"cfg_scale": "CFG scale", "temperature": "temperature", "top_k": "top-k", "top_p": "top-p",
          "draft": "draft tokens", "window": "Jacobi window", "name": "decoding mode"}


class DemoError(ValueError):
    """A setting the demo cannot run; the message (one line) is shown in the page."""


def require_gradio():
    """The gradio module (analytics off: nothing leaves the machine); without it, one line naming the
    extra to install and exit 2."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    try:
        import gradio
    except ImportError as e:
        print(f"error: the demo needs gradio ({e}): pip install -e \".[demo]\"", file=sys.stderr)
        raise SystemExit(2) from None
    return gradio


def choice_labels(src: generation.Loaded) -> list[tuple[str, int]]:
    """(label, index) pairs of the searchable dropdown, named as the checkpoint's conditioning kind names
    its grid rows: "207: golden retriever" (ImageNet), "7" (digits), "style 2" (a kind of its own)."""
    return [(src.kind.row_label(src.cfg.model, i), i) for i in range(src.num_choices)]


def choices_name(src: generation.Loaded) -> str:
    """What the dropdown picks: "classes" for class labels, else "KIND choices" (e.g. "style choices")."""
    return "classes" if src.kind.per_class else f"{src.kind.name} choices"


# ----------------------------------------------------------------------------- settings

def _number(key: str, text, kind):
    try:
        return kind(text)
    except (TypeError, ValueError):
        raise DemoError(f"{key}={text!r}: expected {'an integer' if kind is int else 'a number'}") from None


def settings_from_query(query: dict, defaults: dict) -> dict:
    """URL query parameters (strings) -> settings, missing ones from ``defaults``; one-line DemoError
    for a value of the wrong type (ranges are checked by ``sample_config``)."""
    out = dict(defaults)
    for key, text in query.items():            # other keys are not settings
        if key == "classes":
            out[key] = [_number("classes", c, int) for c in str(text).split(",") if c.strip()]
        elif key == "decode":
            out[key] = str(text)
        elif key in DEFAULTS:
            out[key] = _number(key, text, float if key in ("cfg", "temperature", "top_p") else int)
    return out


def query_string(settings: dict) -> str:
    """The URL query that reproduces ``settings``."""
    return urlencode({k: ",".join(map(str, v)) if isinstance(v, list) else v for k, v in settings.items()})


def sample_config(src: generation.Loaded, st: dict, device):
    """The checkpoint's sample section with the settings on top, checked, its decoding mode fitted to
    the checkpoint (``auto``: ``auto_decode`` for this batch and device). DemoError / ConfigError (one
    line) for a bad value: a class out of range, too many images, --draft beyond the useful length."""
    n = src.num_choices
    if not st["classes"]:
        raise DemoError("choose at least one class")
    generation.check_classes(st["classes"], n, "classes")
    total = len(st["classes"]) * st["per_class"]
    if st["per_class"] < 1 or total > MAX_IMAGES:
        raise DemoError(f"images per class {st['per_class']}: expected 1..{MAX_IMAGES // len(st['classes'])} "
                        f"({MAX_IMAGES} images at most per request)")
    mode = st["decode"]
    if mode not in decode_modes():
        raise DemoError(f"decode={mode!r}: expected one of {', '.join(decode_modes())}")
    if mode == "auto":
        mode = auto_decode(total, device, can_draft(src.cfg.objective))
    decode = {"name": mode, **({"draft": st["draft"] or None} if mode == "registers" else {}),
              **({"window": st["window"]} if mode == "jacobi" else {})}
    given = {"cfg_scale": st["cfg"], "temperature": st["temperature"], "top_k": st["top_k"], "top_p": st["top_p"]}
    data = {**config.section_dict(src.cfg.sample), **{k: v for k, v in given.items() if v is not None},
            "seed": st["seed"], "per_class": st["per_class"], "classes": list(st["classes"]), "decode": decode}
    s = config.build_plain("sample", data)
    s.check(LABELS)
    return dataclasses.replace(s, decode=s.decode.fit(src.cfg.objective, src.grid, LABELS))


# ----------------------------------------------------------------------------- images forming

class TokenWatch:
    """The tokens emitted so far (B, N) of a decoding run: the decoder's progress callback
    (``sampling.rounds.Progress``), read from the page's thread by ``snapshot``."""

    def __init__(self, B: int, N: int):
        self.tokens = torch.zeros(B, N, dtype=torch.long)
        self.known = torch.zeros(B, N, dtype=torch.bool)
        self.lock = threading.Lock()

    def __call__(self, bodies: torch.Tensor, emitted) -> None:
        """bodies (B, N) being filled; the first ``emitted`` (an int or (B,)) of each row are in."""
        emitted = torch.as_tensor(emitted).cpu()
        known = torch.arange(bodies.shape[1]) < emitted.reshape(-1, 1)
        tokens = bodies.to("cpu", copy=True)
        with self.lock:
            self.tokens, self.known = tokens, known.expand_as(tokens)

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor]:
        with self.lock:
            return self.tokens.clone(), self.known.clone()


def partial_images(src: generation.Loaded, tokens: torch.Tensor, known: torch.Tensor) -> np.ndarray:
    """tokens, known (B, N) -> uint8 images (B, h, w, 3): the tokens decoded by the checkpoint's
    tokenizer, the area of tokens not yet emitted grey."""
    H, W = src.grid
    with torch.no_grad():
        device = generation.tokenizer_device(src.tokenizer) or torch.device("cpu")
        images = src.tokenizer.decode(tokens.view(-1, H, W).to(device)).float().cpu()
    mask = torch.nn.functional.interpolate(known.view(-1, 1, H, W).float(), size=images.shape[-2:], mode="nearest")
    return generation.to_uint8(torch.where(mask > 0, images, torch.full_like(images, 0.5)))


def stats_table(st: dict, s, stats: dict, N: int, seconds: float, command: str) -> str:
    """Markdown beside the grid: the decoding mode, its counts and the sample.py command of the grid."""
    mode = s.decode.name + "".join(f", {k} {v}" for k, v in config.section_dict(s.decode).items()
                                   if k in ("draft", "window"))
    rows = [("decoding", mode + (" (auto)" if st["decode"] == "auto" else "")),
            ("forwards per image", f"{stats['forwards_per_sequence']:.1f} for {N} tokens"),
            ("tokens per forward", f"{stats['tokens_per_forward']:.2f}"),
            ("tokens/s", f"{stats['tokens_per_s']:.0f}"), ("seconds", f"{seconds:.2f}")]
    for kind, what in (("", "acceptance by draft distance"), ("register_", "register drafts' acceptance")):
        rates = stats.get(f"{kind}acceptance_by_distance")
        if rates:
            rows.append((what, ", ".join(f"{d}: {'–' if r is None else f'{r:.2f}'}" for d, r in enumerate(rates, 1))))
    return "\n".join(["| statistic | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), "", f"Same grid: `{command}`"])


class Demo:
    """One checkpoint opened for sampling (``src`` on ``device``) and the requests made to it."""

    def __init__(self, src: generation.Loaded, device: torch.device, ckpt: str):
        self.src, self.device, self.ckpt = src, device, ckpt
        self.choices = choice_labels(src)
        self.out = Path(tempfile.mkdtemp(prefix="mutor2d_demo_"))
        self.lock, self.requests = threading.Lock(), 0

    def defaults(self) -> dict:
        """The page's first settings: the checkpoint's sample section (four of its grid classes)."""
        s = self.src.cfg.sample
        return {**DEFAULTS, "classes": generation.grid_classes(s, self.src.num_choices)[:4], "cfg": s.cfg_scale,
                "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "seed": s.seed}

    def command(self, st: dict, s) -> str:
        opts = "".join(f" --{k} {v}" for k, v in config.section_dict(s.decode).items() if k in ("draft", "window"))
        return (f"python sample.py --ckpt {self.ckpt} --classes {','.join(map(str, st['classes']))} --per-class "
                f"{st['per_class']} --seed {s.seed} --batch-size {len(st['classes']) * st['per_class']} --cfg "
                f"{s.cfg_scale} --temperature {s.temperature} --top-k {s.top_k} --top-p {s.top_p} --decode "
                f"{s.decode.name}{opts}")

    def save(self, images: np.ndarray, st: dict, tag: str) -> str:
        rows = [self.src.kind.row_label(self.src.cfg.model, c) for c in st["classes"]]
        return str(generation.save_grid(images, st["per_class"], self.out / f"{self.requests:05d}_{tag}.png", rows,
                                        labels=self.src.cfg.sample.labels))

    def run(self, st: dict):
        """Yield (grid PNG path, stats markdown or None) while decoding, then the final grid and its
        stats. ValueError (one line) for settings the checkpoint cannot run."""
        s = sample_config(self.src, st, self.device)
        src, B, N = self.src, len(st["classes"]) * st["per_class"], self.src.grid[0] * self.src.grid[1]
        watch = TokenWatch(B, N)
        sampler = generation.make_sampler(src.model, src.tokenizer, src.grid, s, objective=src.cfg.objective,
                                          device=self.device, progress=watch)
        prefixes = generation.balanced_prefixes(src.kind, src.cfg.model, B, st["classes"])
        with self.lock, ThreadPoolExecutor(1) as worker:    # leaving waits for the decoding to end
            self.requests += 1
            start = time.perf_counter()
            decoding = worker.submit(sampler, prefixes, generation.shard_seed(s.seed, 0))
            while wait([decoding], FRAME_S).not_done:
                yield self.save(partial_images(src, *watch.snapshot()), st, "partial"), None
        grid = self.save(decoding.result(), st, "grid")           # result(): raises the sampler's exception
        seconds = time.perf_counter() - start
        yield grid, stats_table(st, s, sampler.last.summary(), N, seconds, self.command(st, s))


# ----------------------------------------------------------------------------- the page

def settings_of(values) -> dict:
    """The page's input values (in DEFAULTS' order) -> settings; DemoError for an empty number box."""
    st = dict(zip(DEFAULTS, values))
    for key in ("per_class", "seed", "draft", "window", "top_k"):
        if st[key] is None:
            raise DemoError(f"{key}: expected an integer")
        st[key] = int(st[key])
    st["classes"] = [int(c) for c in st["classes"] or []]
    return st


def handlers(demo: Demo):
    """(on_load, on_generate) of the page: the settings from the URL (and their link); the images as
    they form, then their statistics, PNG and link."""
    gr = require_gradio()

    def on_load(request: gr.Request):
        defaults = demo.defaults()
        try:
            st = settings_from_query(dict(request.query_params), defaults)
            generation.check_classes(st["classes"] or [], demo.src.num_choices, "classes")
            note = ""
        except ValueError as e:
            st, note = defaults, f"**error:** {e} (the page shows the checkpoint's defaults)"
        return [*(st[k] for k in DEFAULTS), note, query_string(st)]

    def on_generate(*values):
        start, st, frames = time.perf_counter(), None, 0
        try:
            st = settings_of(values)
            for path, stats in demo.run(st):
                frames += 1
                yield path, stats or f"decoding… {time.perf_counter() - start:.1f} s", \
                    (path if stats else None), (query_string(st) if stats else gr.skip())
        except ValueError as e:
            LOG.info("request %s -> error: %s", query_string(st or {}), e)
            yield None, f"**error:** {e}", None, gr.skip()
            return
        except Exception as e:                          # a bug or the machine: gradio shows it in the page
            LOG.info("request %s -> failed: %s: %s", query_string(st or {}), type(e).__name__, e)
            raise gr.Error(f"{type(e).__name__}: {e}") from None
        LOG.info("request %s -> %d images, %d frames, %.2f s", query_string(st),
                 len(st["classes"]) * st["per_class"], frames, time.perf_counter() - start)
    return on_load, on_generate


SHARE_JS = "(q) => { if (q) { window.history.replaceState(null, '', '?' + q); } return []; }"


def build_app(demo: Demo):
    """The page (gr.Blocks): settings on the left; the grid forming, its statistics, PNG download and link
    on the right."""
    gr = require_gradio()
    d, cfg = demo.defaults(), demo.src.cfg
    with gr.Blocks(title="mutor2d demo") as app:
        gr.Markdown(f"## mutor2d · `{demo.ckpt}` · {cfg.objective.name}, step {demo.src.step}, "
                    f"{demo.src.grid[0]}x{demo.src.grid[1]} tokens, {demo.src.num_choices} {choices_name(demo.src)}")
        with gr.Row():
            with gr.Column(scale=1):
                boxes = [gr.Dropdown(demo.choices, value=d["classes"], multiselect=True, filterable=True,
                                     label=f"{choices_name(demo.src)} (type to search)", elem_id="classes"),
                         gr.Slider(1, 16, value=d["per_class"], step=1, label="images per class", elem_id="per_class"),
                         gr.Number(d["cfg"], label="CFG scale (1 = off)", elem_id="cfg"),
                         gr.Number(d["temperature"], label="temperature (0 = greedy)", elem_id="temperature"),
                         gr.Number(d["top_k"], label="top-k (0 = off)", precision=0, elem_id="top_k"),
                         gr.Number(d["top_p"], label="top-p (1 = off)", elem_id="top_p"),
                         gr.Number(d["seed"], label="seed", precision=0, elem_id="seed"),
                         gr.Radio(decode_modes(), value=d["decode"], label="decoding", elem_id="decode"),
                         gr.Number(d["draft"], label="draft tokens (registers; 0 = the checkpoint's useful length)",
                                   precision=0, elem_id="draft"),
                         gr.Number(d["window"], label="Jacobi window", precision=0, elem_id="window")]
                button = gr.Button("Generate", variant="primary", elem_id="generate")
            with gr.Column(scale=2):
                image = gr.Image(label="samples", type="filepath", interactive=False, elem_id="grid")
                stats = gr.Markdown(elem_id="stats")
                download = gr.File(label="download the grid (PNG)", elem_id="download")
                link = gr.Textbox(label="share: this page's URL query", elem_id="link", interactive=False)
        on_load, on_generate = handlers(demo)
        app.load(on_load, None, [*boxes, stats, link])
        button.click(on_generate, boxes, [image, stats, download, link]).then(None, link, None, js=SHARE_JS)
    return app


def check_port(host: str, port: int) -> None:
    """DemoError (one line) for a port outside 1..65535 or one that cannot be served on ``host`` (in use)."""
    if not 1 <= port <= 65535:
        raise DemoError(f"--port {port}: expected a port in 1..65535")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)      # a closed server's TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError as e:
            raise DemoError(f"--port {port}: cannot serve on {host}:{port} ({e.strerror or e}); "
                            f"expected a free port (another server holds it?)") from None


def serve(app, host: str, port: int) -> None:
    """Launch ``app`` with gradio's queue (one decoding at a time) and wait for Ctrl-C / SIGTERM; then
    close the server (at most STOP_S seconds: running and queued requests are dropped) and exit with
    128 + the signal's number."""
    caught = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: caught.append(signum))
    try:
        app.queue(default_concurrency_limit=1).launch(server_name=host, server_port=port, show_error=True,
                                                      prevent_thread_lock=True)
    except OSError as e:                               # taken since check_port
        raise DemoError(f"--port {port}: cannot serve on {host}:{port} ({e})") from None
    while not caught:
        time.sleep(0.2)
    LOG.info("%s: stopping", signal.Signals(caught[0]).name)
    closer = threading.Thread(target=app.close, daemon=True)
    closer.start()
    closer.join(STOP_S)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + caught[0])                          # decoding threads are not waited for


def run(args) -> None:
    """app.py's arguments (mutor2d.demo.cli, parsed before torch loads): check the port, open the
    checkpoint (an unreadable one: ``error: ...`` and exit 2), then serve the page until Ctrl-C / SIGTERM."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
    try:
        check_port(args.host, args.port)
        load_plugins()
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        src = generation.open_checkpoint(locate.resolve(args.ckpt), use_ema=args.ema, device=device)
        serve(build_app(Demo(src, device, args.ckpt)), args.host, args.port)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
