"""Value checks every config section uses: one-line :class:`ConfigError` messages naming the key.

Range rules (``fail``, ``at_least``, ``at_most``, ``fraction``, ``check_seed``), ``check_model_fits``
for estimates checked before allocating, and ``check_type``, which coerces a YAML value to a dataclass
field's type (bool, int, float, str, Literal, Optional, list, tuple).
"""
from __future__ import annotations

import math
import os
import types
import typing
from typing import Any, Literal

SEED_LIMIT = 2 ** 32               # seeds live in [0, 2^32): numpy, torch and python all take them


class ConfigError(ValueError):
    """A bad config value; the message is one line naming the key."""


# ----------------------------------------------------------------------------- range rules

def fail(key: str, expected: str, value: Any) -> None:
    raise ConfigError(f"{key}: expected {expected}, got {value!r}")


def at_least(key: str, value, low) -> None:
    if value < low:
        fail(key, f">= {low}", value)


def at_most(key: str, value, high, why: str = "") -> None:
    """``value <= high``, else a ConfigError naming the limit (and ``why`` it is the limit)."""
    if value > high:
        fail(key, f"<= {high}" + (f" ({why})" if why else ""), value)


WORKERS_LIMIT = 256     # data.num_workers: processes the loader forks


def check_workers(key: str, value: int) -> None:
    """A worker count in 0..WORKERS_LIMIT (a huge one forks until the machine stops)."""
    at_least(key, value, 0)
    at_most(key, value, WORKERS_LIMIT, "data-loading processes")


def physical_memory() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


TRAIN_BYTES_PER_PARAM = 16   # float32 weights, gradients and Adam's two moments: a run trained where it is built
BUILD_BYTES_PER_PARAM = 4    # float32 weights, built on the host before they move to an accelerator


def over_memory(need: int) -> str | None:
    """None when ``need`` bytes fit this machine's physical memory (or it is unknown); else the end of
    a one-line error: "N GiB; this machine has M GiB of memory"."""
    have = physical_memory()
    if have is None or need <= have:
        return None
    return f"{need / 2 ** 30:.3g} GiB; this machine has {have / 2 ** 30:.3g} GiB of memory"


def check_model_fits(params: int, sizes: str, bytes_per_param: int) -> None:
    """A model of ``params`` parameters (set by the config fields ``sizes`` names) that needs more than
    this machine's physical memory at ``bytes_per_param`` is refused in one line before it is built."""
    if short := over_memory(params * bytes_per_param):
        raise ConfigError(f"{sizes}: about {params:.3g} parameters at {bytes_per_param} bytes each, {short}")


def fraction(key: str, value: float) -> None:
    if not 0 <= value <= 1:
        fail(key, "a number in [0, 1]", value)


def check_seed(key: str, value: int) -> None:
    if not 0 <= value < SEED_LIMIT:
        fail(key, "an integer in [0, 2^32)", value)


# ----------------------------------------------------------------------------- type checking

YAML_BOOL_WORDS = {False: ("no", "off", "false"), True: ("yes", "on", "true")}


def check_type(key: str, value: Any, tp: Any) -> Any:
    """Return ``value`` coerced to ``tp`` or raise ConfigError naming ``key``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for a in (a for a in args if a is not type(None)):
            try:
                return check_type(key, value, a)
            except ConfigError:
                pass
        fail(key, str(tp).replace("typing.", ""), value)
    if origin is Literal:
        if isinstance(value, bool):            # YAML 1.1 reads no/off/yes/on as booleans
            value = next((a for a in args if isinstance(a, str) and a in YAML_BOOL_WORDS[value]), value)
        if not any(value == a and type(value) is type(a) for a in args):
            fail(key, f"one of {list(args)}", value)
        return value
    if origin in (list, tuple):
        return _check_sequence(key, value, origin, args)
    if tp is Any:
        return value
    if tp not in SCALARS:
        raise ConfigError(f"{key}: unsupported type {tp}")
    return SCALARS[tp](key, value)


def _check_sequence(key: str, value: Any, origin, args) -> Any:
    if not isinstance(value, (list, tuple)):
        fail(key, "a list", value)
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            fail(key, f"{len(args)} values", value)
        return tuple(check_type(key, v, a) for v, a in zip(value, args))
    out = [check_type(key, v, args[0] if args else Any) for v in value]
    return tuple(out) if origin is tuple else out


def _as_float(key, value):
    """A finite number; YAML 1.1 reads "1e-3" as a string, so numeric strings are accepted."""
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        fail(key, "a number", value)
    number = float(number) if abs(number) < 1e308 else math.inf
    if not math.isfinite(number):
        fail(key, "a finite number", value)
    return number


def _exactly(tp: type, expected: str):
    def check(key, value):
        if isinstance(value, bool) is not (tp is bool) or not isinstance(value, tp):
            fail(key, expected, value)
        return value
    return check


SCALARS = {bool: _exactly(bool, "true/false"), int: _exactly(int, "an integer"), float: _as_float,
           str: _exactly(str, "a string")}
