"""Provenance: which code, library versions, data and initial weights produced an artifact (the fields
and where each artifact keeps them: docs/RELIABILITY.md, "Provenance").

A provenance (:func:`provenance`) is a JSON-able dict: ``code`` (:func:`code_identity`), ``versions``,
``device``, ``threads``, ``data`` and ``init`` (fingerprints, or null). A fingerprint is {"path" or
"name", "sha256", ...}: a file's sha256 is that of its bytes; a folder's is the sha256 of the lines
"RELATIVE_PATH\\tSIZE\\tSHA256\\n" of its files sorted by path; a random initialisation's is the sha256
of the text "random init, seed S". Displays and folder names use the first 12 hex digits
(:func:`short`); files store the full one. Files of at least :data:`CACHE_MIN_BYTES` are hashed once:
their sha256 is kept in ``hashes.json`` under $MUTOR2D_CACHE (else $XDG_CACHE_HOME/mutor2d, else
~/.cache/mutor2d), keyed by (absolute path, size, mtime_ns). A run folder's sessions:
RUN/provenance.json (:func:`append_session`).
"""
from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
from pathlib import Path

from . import io

PACKAGE_ROOT = Path(__file__).resolve().parent.parent     # the checkout (or site-packages) holding mutor2d
LIBRARIES = {"torch": "torch", "transformers": "transformers", "peft": "peft", "accelerate": "accelerate",
             "torch_fidelity": "torch-fidelity", "numpy": "numpy"}      # key -> distribution name
GIT_TIMEOUT_S = 10
CACHE_MIN_BYTES = 1 << 20
RUN_FILE = "provenance.json"
SHORT = 12


def short(sha256: str | None) -> str:
    """The short form of a hash: its first 12 hex digits ("–" for none)."""
    return sha256[:SHORT] if sha256 else "–"


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# ----------------------------------------------------------------------------- code and versions

def git(root: Path, *args: str) -> bytes | None:
    """``git -C root ARGS`` output, None when git is missing, fails or times out."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def package_version(dist: str = "mutor2d") -> str | None:
    """The installed version of the distribution ``dist`` (None when not installed)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def code_identity(root: str | os.PathLike = PACKAGE_ROOT) -> dict:
    """{"commit", "dirty", "diff_sha256"} of the checkout ``root`` (its top level), else {"package_version"}.
    dirty: uncommitted changes or untracked files; diff_sha256: sha256 of ``git diff HEAD --binary`` followed
    by each untracked file's name and content sha256 (null when clean); what git cannot tell is null."""
    root = Path(root)
    top = git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top.decode().strip()).resolve() != root.resolve():
        return {"package_version": package_version()}
    commit = git(root, "rev-parse", "HEAD")
    found = {"commit": commit.decode().strip() if commit else None, "dirty": None, "diff_sha256": None}
    diff = git(root, "diff", "HEAD", "--binary")
    untracked = git(root, "ls-files", "--others", "--exclude-standard", "-z")
    if diff is None or untracked is None:
        return found
    names = sorted(n for n in untracked.decode(errors="surrogateescape").split("\0") if n)
    h = hashlib.sha256(diff)
    for name in names:
        path = root / name
        h.update(f"{name}\t{file_sha256(path) if path.is_file() else ''}\n".encode(errors="surrogateescape"))
    dirty = bool(diff) or bool(names)
    return {**found, "dirty": dirty, "diff_sha256": h.hexdigest() if dirty else None}


def versions() -> dict:
    """python and each of LIBRARIES' installed version (None when not installed)."""
    return {"python": platform.python_version(), **{key: package_version(dist) for key, dist in LIBRARIES.items()}}


def code_text(code: dict | None) -> str:
    """A table cell: the short commit, "+dirty" when it had changes; "v1.2" outside a checkout; "–"."""
    if not code:
        return "–"
    if "commit" not in code:
        return f"v{code.get('package_version')}" if code.get("package_version") else "–"
    return short(code["commit"]) + ("+dirty" if code.get("dirty") else "")


# ----------------------------------------------------------------------------- fingerprints

def cache_file() -> Path:
    folder = os.environ.get("MUTOR2D_CACHE") or \
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mutor2d"
    return Path(folder) / "hashes.json"


def _read_cache(path: Path) -> dict:
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes; a file of CACHE_MIN_BYTES or more is read once per (path, size, mtime_ns)."""
    path = Path(path).resolve()
    st = path.stat()
    if st.st_size < CACHE_MIN_BYTES:
        return io.file_sha256(path)
    where, key = cache_file(), f"{path}\t{st.st_size}\t{st.st_mtime_ns}"
    cache = _read_cache(where)
    if key not in cache:
        cache[key] = io.file_sha256(path)
        try:
            where.parent.mkdir(parents=True, exist_ok=True)
            io.write_json_atomic(where, cache, indent=None)
        except OSError:                             # a read-only home: hashed again next time
            pass
    return cache[key]


def folder_sha256(folder: Path, names=None) -> str:
    """sha256 of the lines "RELATIVE_PATH\\tSIZE\\tSHA256\\n" of the folder's files (``names``: only
    those relative paths) sorted by path."""
    files = sorted((p.relative_to(folder).as_posix(), p) for p in folder.rglob("*") if p.is_file())
    h = hashlib.sha256()
    for rel, p in files:
        if names is None or rel in names:
            h.update(f"{rel}\t{p.stat().st_size}\t{file_sha256(p)}\n".encode(errors="surrogateescape"))
    return h.hexdigest()


def fingerprint(path: str | os.PathLike | None, names=None) -> dict | None:
    """{"path": absolute path, "sha256"} of a file or folder (``names``: of its files, these relative
    paths only); sha256 null when nothing is there; None for no path."""
    if not path:
        return None
    p = Path(path).resolve()
    sha = folder_sha256(p, names) if p.is_dir() else file_sha256(p) if p.is_file() else None
    return {"path": str(p), "sha256": sha}


def package_file(package: str, relative: str, name: str) -> dict:
    """{"name", "path", "sha256"} of a data file shipped inside an installed package (found without
    importing it); sha256 null when it is not there."""
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or []) if spec else []
    path = next((Path(f) / relative for f in folders if (Path(f) / relative).is_file()), None)
    return {"name": name, "path": str(path) if path else None, "sha256": file_sha256(path) if path else None}


def random_init(seed: int) -> dict:
    """The fingerprint of weights initialised at random from ``seed``."""
    text = f"random init, seed {seed}"
    return {"name": text, "sha256": text_sha256(text)}


def named(name: str, sha256: str | None = None) -> dict:
    """The fingerprint of something known by name only (a hub model, a built-in data set)."""
    return {"name": name, "sha256": sha256}


# ----------------------------------------------------------------------------- the record

def measured_device() -> tuple[str, int]:
    """(device name, intra-op threads) of this process, through torch."""
    import torch
    device = f"cuda ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else "cpu"
    return device, torch.get_num_threads()


def provenance(data: dict | None = None, init: dict | None = None, device: str | None = None,
               threads: int | None = None, root: str | os.PathLike = PACKAGE_ROOT) -> dict:
    """The provenance dict (module doc): code, versions, device, threads, data, init."""
    if device is None or threads is None:
        measured = measured_device()
        device, threads = device or measured[0], threads if threads is not None else measured[1]
    return {"code": code_identity(root), "versions": versions(), "device": str(device), "threads": int(threads),
            "data": data, "init": init}


def code_key(code: dict | None) -> tuple:
    """What identifies the code: commit and diff, or the package version."""
    code = code or {}
    return code.get("commit"), code.get("diff_sha256"), code.get("package_version")


def differences(a: dict, b: dict) -> list[str]:
    """Which of code, versions, data (fingerprint) differ between two provenances, in that order."""
    keys = {"code": lambda p: code_key(p.get("code")), "versions": lambda p: p.get("versions"),
            "data": lambda p: (p.get("data") or {}).get("sha256")}
    return [part for part, key in keys.items() if key(a) != key(b)]


def read_sessions(run_dir: str | os.PathLike) -> list[dict]:
    """The sessions of RUN/provenance.json, oldest first ([] when there is none or it is unreadable)."""
    try:
        sessions = json.loads((Path(run_dir) / RUN_FILE).read_text()).get("sessions")
    except (OSError, ValueError, AttributeError):
        return []
    return [s for s in sessions if isinstance(s, dict)] if isinstance(sessions, list) else []


def append_session(run_dir: str | os.PathLike, prov: dict, start_step: int) -> list[str]:
    """Add this session (``prov`` with its start time and step) to RUN/provenance.json; -> what differs
    from the first session (module doc: :func:`differences`)."""
    sessions = read_sessions(run_dir)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    io.write_json_atomic(Path(run_dir) / RUN_FILE,
                         {"sessions": sessions + [{**prov, "started": now, "start_step": int(start_step)}]})
    return differences(sessions[0], prov) if sessions else []
