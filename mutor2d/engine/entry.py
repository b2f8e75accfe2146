"""How an entry script ends a run: ``run_entry`` turns an error that ends a run into one line on stderr
and its exit code (``exit_code``), and Ctrl-C into one line and exit 130. No torch: train.py reports a
bad config through it before torch is imported; the loop raises Diverged."""
from __future__ import annotations

import os
import time

from ..preempt import INTERRUPTED_EXIT, PREEMPTED_EXIT, Preempted, interrupted_line

ECHO_DELAY_S = 5.0   # seconds a process other than the main one waits before printing an input error


def exit_code(error: BaseException) -> int | None:
    """The exit code of an entry script for an error that ends a run with one line on stderr (None:
    not one of them): 75 stopped by a signal after a checkpoint, 1 diverged, 74 a checkpoint could not
    be written, 2 bad config or input (ConfigError, CheckpointError, a locked run folder, a file that
    cannot be read or written, ...)."""
    from ..checkpoint import WRITE_FAILED_EXIT, CheckpointWriteError
    codes = ((Preempted, PREEMPTED_EXIT), (Diverged, 1), (CheckpointWriteError, WRITE_FAILED_EXIT),
             ((ValueError, OSError), 2))
    return next((code for kind, code in codes if isinstance(error, kind)), None)


def run_entry(main):
    """Run an entry script's ``main()`` -> its result; an error that ends a run (``exit_code``) becomes
    one line on stderr and that exit code. Bad config or input (2) is mostly the same in every process
    of a launch: the main one (RANK 0 or unset) prints it at once, another only if it is still running
    ECHO_DELAY_S later (a launcher stops the others when the main one exits, so a shared error is
    printed once and an error of that process alone is still shown). A launched process stopped by a
    signal (75, its shards saved) leaves without the interpreter's teardown, where torch's threads
    could abort it (SIGABRT, "terminate called without an active exception") and turn 75 into -6.
    A Ctrl-C that reaches it (start-up, a command's work: a run stops on it with 75) is one line, exit 130."""
    import sys
    try:
        return main()
    except KeyboardInterrupt as e:       # Ctrl-C before a run exists (once it does, the run stops with 75)
        print(interrupted_line(e), file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT) from None
    except Exception as e:
        if (code := exit_code(e)) is None:
            raise
        if code == 2 and os.environ.get("RANK", "0") != "0":
            time.sleep(ECHO_DELAY_S)
        print(str(e) if code == PREEMPTED_EXIT else f"error: {e}", file=sys.stderr)
        if code == PREEMPTED_EXIT and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)      # all is saved; a launched process's teardown could abort in torch's threads
        raise SystemExit(code) from None


class Diverged(RuntimeError):
    """Too many skipped (non-finite or blown-up) updates in a row; one-line message."""
