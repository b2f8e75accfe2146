"""Where a run resumes from, and which checkpoints it keeps.

Rules:
  * Resume point, decided once (``find_resume``, by the engine holding the run's lock; the config the
    run continues with is that checkpoint's: mutor2d.engine.setup.ResumeWith): ``--resume auto`` takes
    the newest checkpoint of the run folder whose full read passes (a run folder given as PATH: the
    same, over that folder). Each unreadable one of the run's own folder is named on stderr and renamed
    ``*.pt.unreadable`` (kept for inspection, never counted again). Checkpoints present but none
    readable is an error, not a fresh start. Unreadable includes a checksum mismatch (bit rot in the
    tensor data).
  * Rotation keeps the newest ``train.keep_ckpts`` readable checkpoints (0 = all), and every checkpoint
    of a step that is a multiple of ``train.keep_every`` (for scoring later), and deletes only
    readable ones older than all of those: never a newer file, never the only readable one, never the
    last good one.
  * Good: the checkpoint of step N holds the weights after update N; it is good once update N+1 is
    judged healthy (engine/health.py: the loss and gradient of those weights were normal). A run that
    diverges sets the checkpoints written after the last good one aside (``*.pt.diverged``), so that
    ``--resume auto`` continues from the good one, and its error names that file.
  * Temp files of saves killed mid-write (``.step_*.pt.*.tmp``, sharded ``.step_*.dcp.tmp/``) are
    removed when a run starts, by the run that holds the folder's lock (engine/lock.py).
"""
from __future__ import annotations

from pathlib import Path

from .. import checkpoint as ckpt_lib
from . import sharded as sharded_checkpoint
from .locate import is_hub_folder, resolve
from .. import io
from ..io import warn
from ..config import ConfigError


def remove_stale_temps(run_dir: Path) -> None:
    folder = run_dir / "checkpoints"
    for tmp in io.remove_stale_temps(folder) + sharded_checkpoint.remove_stale_temps(folder):
        warn(f"removed {tmp}, left by a save that was killed mid-write")


def set_aside(path: Path, reason: str) -> None:
    aside = path.with_name(path.name + ".unreadable")
    path.rename(aside)
    warn(f"skipped {path}: {reason}; renamed to {aside.name}")


def find_resume(resume: str | None, run_dir: Path, main: bool) -> tuple[Path | None, dict | None]:
    """(checkpoint path, its loaded dict) to continue from, or (None, None) for a fresh run: the one
    resume decision (module doc), made by the engine once it holds the run's lock.

    resume: None (fresh: refuses a folder that has checkpoints), "auto" (``run_dir``'s newest readable
    checkpoint; none at all: a fresh run), a run folder (its newest readable one) or a checkpoint file /
    sharded or hub folder. Only the process ``main`` sets unreadable files aside, and only in ``run_dir``."""
    if resume is None:
        if ckpt_lib.list_checkpoints(run_dir):
            raise ConfigError(f"run folder {str(run_dir)!r} already has checkpoints: "
                              f"pass --resume auto to continue it, or another --out")
        return None, None
    folder = run_dir if resume == "auto" else Path(resume)
    if resume != "auto" and not is_run_folder(folder):
        try:
            path = resolve(resume)
            return path, ckpt_lib.load(path)
        except (FileNotFoundError, ckpt_lib.CheckpointError) as e:
            raise ConfigError(f"--resume {resume}: {e}") from None
    found = ckpt_lib.list_checkpoints(folder)
    ours = main and folder.resolve() == Path(run_dir).resolve()
    for path in reversed(found):
        try:
            return path, ckpt_lib.load(path)
        except ckpt_lib.CheckpointError as e:
            if ours:
                set_aside(path, str(e))
            elif main:
                warn(f"skipped {path}: {e}")
        except FileNotFoundError:    # another process of the launch set it aside while this one read it
            continue
    if found:
        raise ConfigError(f"--resume {resume}: none of the {len(found)} checkpoints of {str(folder)!r} is readable"
                          f"{' (renamed *.unreadable)' if ours else ''}; refusing to start over: pass --out for a "
                          f"fresh run")
    if resume != "auto":
        raise ConfigError(f"--resume {resume}: no checkpoint under {io.shown_path(folder)}")
    return None, None


def is_run_folder(path: Path) -> bool:
    """A folder of step checkpoints (not one sharded checkpoint, not a hub folder)."""
    return path.is_dir() and not sharded_checkpoint.is_sharded_checkpoint(path) and not is_hub_folder(path)


def rotate(run_dir: Path, keep: int, protect: Path | None = None, keep_every: int = 0) -> None:
    """Delete readable checkpoints older than the newest ``keep`` readable ones, except ``protect``
    (the last good one; see module doc) and those of steps that are multiples of ``keep_every``."""
    if not keep:
        return
    kept = 0
    for path in reversed(ckpt_lib.list_checkpoints(run_dir)):
        if kept < keep:
            if ckpt_lib.is_readable(path):
                kept += 1
            else:
                set_aside(path, "unreadable")
        elif path != protect and not kept_for_scoring(path, keep_every) and ckpt_lib.is_readable(path):
            ckpt_lib.remove(path)


def kept_for_scoring(path: Path, keep_every: int) -> bool:
    """A checkpoint of a step that is a multiple of ``train.keep_every`` (0 = none) is never rotated."""
    return bool(keep_every) and ckpt_lib.checkpoint_step(path) % keep_every == 0


class Retention:
    """The main process's record of the last good checkpoint and of the one written after it (not yet
    confirmed), and rotation around them (see module doc)."""

    def __init__(self, run_dir: Path, keep: int, resumed: Path | None, keep_every: int = 0):
        self.run_dir, self.keep, self.keep_every = run_dir, keep, keep_every
        self.good: Path | None = None
        self.pending = resumed if resumed is not None and resumed.exists() else None

    def observe(self, healthy: bool) -> None:
        """After each update: a healthy one confirms the checkpoint of the weights it started from."""
        if healthy and self.pending is not None:
            self.good, self.pending = self.pending, None

    def saved(self, path: Path) -> None:
        self.pending = path
        rotate(self.run_dir, self.keep, protect=self.good, keep_every=self.keep_every)

    def kept_message(self) -> str:
        if self.good is None:
            return "no checkpoint of this session was confirmed good (the checkpoints are left as they are)"
        return f"the last good checkpoint is {self.good}"

    def after_divergence(self) -> str:
        """Set the unconfirmed checkpoints after the last good one aside; a message naming what is kept."""
        found = ckpt_lib.list_checkpoints(self.run_dir)
        if self.good not in found:
            return self.kept_message()
        for path in found[found.index(self.good) + 1:]:
            aside = path.with_name(path.name + ".diverged")
            path.rename(aside)
            warn(f"set {path} aside as {aside.name}: written after the last good checkpoint")
        return f"{self.kept_message()}; continue from it with --resume auto (and, e.g., a smaller optim.lr)"
