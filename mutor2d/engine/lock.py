"""One live run per run folder: the lock file RUN/run.lock.

Rules:
  * The lock is created with O_CREAT|O_EXCL and holds one JSON line: pid, host, start time and the
    kernel's start time of the process (to tell a reused pid). O_EXCL creation is atomic on local file
    systems and on NFS v3+; flock/fcntl locks would vanish by themselves on SIGKILL, but on shared file
    systems they may be per node (Lustre ``localflock``, NFS without a lock manager), so two hosts could
    both "hold" one. The price of a file is that a SIGKILL leaves it behind: hence the stale rule.
  * Stale: the file names this host and its pid is not running (gone, a zombie, or reused by a process
    started at another time). A stale lock is taken over with a one-line notice. A lock of another host
    is never judged stale (its pid means nothing here): the error says to delete the file once that
    run is known to be dead. A lock file left empty (its writer died between creating and writing it)
    is stale after ``EMPTY_STALE_S``.
  * Takeovers are serialised with flock on the run folder (the contenders of a stale lock are all on
    its host), so two restarts racing for one stale lock cannot both win.
  * A second run on a held folder gets RunLocked (a ConfigError: one line naming the owner; train.py
    exits 2) before it reads or writes anything there.
  * The lock goes away when the run ends in any way Python sees (done, error, preemption exit 75); it
    is removed only if it is still this process's.
  * Under a launcher only the main process (RANK 0) takes it; the other processes run under it.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import ConfigError
from ..io import warn

LOCK_NAME = "run.lock"
EMPTY_STALE_S = 10.0


class RunLocked(ConfigError):
    """The run folder belongs to another live run; one-line message naming it."""


def _start_ticks(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of ``pid`` from /proc; None off Linux."""
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()       # fields 3.. of proc(5); the name may hold spaces
        return fields[0], int(fields[19])
    return None


@dataclass(frozen=True)
class Owner:
    """Who holds a lock: pid, host name, wall-clock start (ISO) and kernel start ticks (None off Linux)."""
    pid: int
    host: str
    started: str
    ticks: int | None = None

    @classmethod
    def me(cls) -> "Owner":
        proc = _start_ticks(os.getpid())
        return cls(os.getpid(), socket.gethostname(), time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                   proc[1] if proc else None)

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host} (started {self.started})"

    def running(self) -> bool | None:
        """Whether the owner still runs; None when it cannot be told here (another host)."""
        if self.host != socket.gethostname():
            return None
        try:
            with contextlib.suppress(PermissionError):      # alive, another user's
                os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        proc = _start_ticks(self.pid)               # None off Linux: running
        return proc is None or (proc[0] != "Z" and (self.ticks is None or proc[1] == self.ticks))


def read_owner(path: Path) -> Owner | None:
    """The owner a lock file names; None if the file is gone, empty or not a lock."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        return Owner(**json.loads(path.read_text()))
    return None


def _create(path: Path, me: Owner) -> bool:
    """Create the lock file naming ``me``; False if it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(asdict(me)) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except BaseException:                          # a full disk: no empty lock file is left
        path.unlink(missing_ok=True)
        raise
    return True


@contextlib.contextmanager
def _folder_mutex(folder: Path):
    """flock on the folder for the duration (a no-op where the file system refuses folder locks)."""
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(ImportError, OSError):
            import fcntl
            fd = os.open(folder, os.O_RDONLY)
            stack.callback(os.close, fd)           # closing releases the flock
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield


def _is_stale(path: Path, owner: Owner | None) -> bool:
    if owner is not None:
        return owner.running() is False
    with contextlib.suppress(FileNotFoundError):            # an empty lock file: stale once old enough
        return time.time() - path.stat().st_mtime > EMPTY_STALE_S
    return False


def acquire(run_dir: str | os.PathLike) -> Owner:
    """Take RUN/run.lock for this process (taking over a stale one); RunLocked if a live run holds it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path, me = run_dir / LOCK_NAME, Owner.me()
    for _ in range(3):                             # the owner may release it while we look
        if _create(path, me):
            return me
        owner = read_owner(path)
        if not _is_stale(path, owner):
            if owner is None and not path.exists():
                continue
            raise RunLocked(_held_message(run_dir, path, owner))
        with _folder_mutex(run_dir):
            if read_owner(path) == owner and _is_stale(path, owner):
                path.unlink(missing_ok=True)
                if _create(path, me):
                    what = owner.describe() if owner else "an unfinished lock file"
                    warn(f"took over {path}: its owner, {what}, is no longer running")
                    return me
    raise RunLocked(_held_message(run_dir, path, read_owner(path)))


def _held_message(run_dir: Path, path: Path, owner: Owner | None) -> str:
    who = owner.describe() if owner else "a run that is starting"
    text = f"run folder {str(run_dir)!r} is in use by {who}; wait for it to end or pass another --out"
    if owner is not None and owner.running() is None:
        text += f" (if that run is dead, delete {path})"
    return text


def release(run_dir: str | os.PathLike, me: Owner) -> None:
    """Remove RUN/run.lock if it is still ``me``'s."""
    path = Path(run_dir) / LOCK_NAME
    if read_owner(path) == me:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike, main: bool | None = None):
    """Hold RUN/run.lock for the body (main process only: ``main``, by default RANK, set by torchrun /
    accelerate launch, 0 or unset); a folder this created and left empty is removed again (a run
    refused by its config, or whose lock could not be written, leaves nothing behind)."""
    if not (int(os.environ.get("RANK", "0")) == 0 if main is None else main):
        yield None
        return
    run_dir = Path(run_dir)
    created, me = not run_dir.exists(), None
    try:
        me = acquire(run_dir)
        yield me
    finally:
        if me is not None:
            release(run_dir, me)
        if created:
            with contextlib.suppress(OSError):
                run_dir.rmdir()                    # only succeeds when empty
