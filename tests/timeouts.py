"""Time limits of the tests' subprocesses: every limit is its base value times MUTOR2D_TEST_TIMEOUT_SCALE
(default 1; e.g. 3 on a loaded machine). A subprocess that runs past its limit fails its test with one
line saying it was a timeout and naming the scaled limit (the hook in tests/conftest.py)."""
import math
import os
import subprocess

SCALE_VAR = "MUTOR2D_TEST_TIMEOUT_SCALE"


def scale() -> float:
    """The factor of every subprocess time limit; ValueError naming the variable if it is not > 0."""
    text = os.environ.get(SCALE_VAR, "1")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{SCALE_VAR}={text!r}: expected a number > 0")
    return value


def limit(seconds: float) -> float:
    """A base time limit in seconds, scaled by MUTOR2D_TEST_TIMEOUT_SCALE."""
    return seconds * scale()


def timeout_message(e: subprocess.TimeoutExpired) -> str:
    cmd = e.cmd if isinstance(e.cmd, str) else " ".join(map(str, e.cmd))
    return (f"timeout: {cmd[:200]} ran past its limit of {e.timeout:.3g} s ({SCALE_VAR}={scale():g}; "
            f"raise it on a loaded machine)")
