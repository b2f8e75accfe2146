"""Config files: where a config's name points (a path, or a name under configs/), reading its YAML
and parsing a ``--set section.key=value`` item. Every error is a one-line ConfigError."""
from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import yaml

from .checks import ConfigError, fail

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def resolve_path(name: str | os.PathLike) -> Path:
    """``name`` as a path if it exists, else ``configs/name`` (``.yaml`` may be omitted); a folder is
    a one-line ConfigError."""
    p = Path(name)
    if p.is_dir():
        raise ConfigError(f"config {str(name)!r} is a folder; expected a YAML file (or a name under {CONFIG_DIR})")
    if p.exists():
        return p
    tried = [CONFIG_DIR / p, *([] if p.suffix in (".yaml", ".yml") else [CONFIG_DIR / f"{p}.yaml"])]
    found = next((cand for cand in tried if cand.exists()), None)
    if found is not None:
        return found
    close = difflib.get_close_matches(tried[-1].name, config_names(), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise ConfigError(f"config '{name}' not found (looked for {', '.join(map(str, [p.absolute(), *tried]))}){hint}")


def config_names() -> list[str]:
    """The configs under configs/, by file name."""
    return sorted(q.name for q in CONFIG_DIR.glob("*.yaml"))


def parse_override(item: str) -> tuple[list[str], Any]:
    """``section.key=value`` -> (["section", "key"], value parsed with YAML scalar rules)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; a syntax error is a one-line ConfigError with the file's line number."""
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({what})") from None


def read_mapping(name: str | os.PathLike) -> dict:
    """The YAML config ``name`` (a path or a name under configs/) as a dict of sections; an empty file
    (nothing but comments) is a ConfigError, not the default run."""
    path = resolve_path(name)
    data = read_yaml(path)
    if data is None:
        raise ConfigError(f"config {str(path)!r} is empty; expected a mapping of sections "
                          f"('{{}}' for every default)")
    if not isinstance(data, dict):
        fail(str(path), "a mapping of sections", data)
    return data
