"""How a run or command stops on a signal. :class:`Preempted`: stopped after its checkpoint, exit
``PREEMPTED_EXIT`` (75, "try again": schedulers requeue on it; the engine, mutor2d.engine.loop, raises
it). Ctrl-C anywhere else (start-up, a command mid-way): one line on stderr and exit ``INTERRUPTED_EXIT``
(130, as a shell reports Ctrl-C), never a traceback: every entry script calls :func:`exit_on_ctrl_c`
first, before its other imports. Light (no torch): a command line names them before importing torch.
"""
import contextlib
import os
import sys

PREEMPTED_EXIT = 75
INTERRUPTED_EXIT = 130          # 128 + SIGINT


class Preempted(Exception):
    """A stop signal ended the run after a checkpoint; train.py exits with PREEMPTED_EXIT."""


def interrupted_line(error: KeyboardInterrupt) -> str:
    """The one line a Ctrl-C ends a command with; a KeyboardInterrupt raised with a message (what was
    kept, how to continue) adds it."""
    return "interrupted by Ctrl-C" + (f": {error}" if str(error) else "")


def exit_on_ctrl_c() -> None:
    """From here on, a Ctrl-C (KeyboardInterrupt) that reaches the top of this process ends it with
    ``interrupted_line`` on stderr and exit 130 instead of a traceback, also while the entry script is
    still importing. The process leaves at once (``os._exit``, streams flushed): the ``with`` and
    ``finally`` blocks the interrupt passed through have run, and Python would otherwise kill itself
    with SIGINT."""
    previous = sys.excepthook
    if getattr(previous, "ctrl_c", False):
        return

    def hook(kind, error, tb):
        if not issubclass(kind, KeyboardInterrupt):
            return previous(kind, error, tb)
        with contextlib.suppress(OSError, ValueError):      # a closed or broken stream says nothing
            sys.stdout.flush()
            print(interrupted_line(error), file=sys.stderr, flush=True)
        os._exit(INTERRUPTED_EXIT)
    hook.ctrl_c = True
    sys.excepthook = hook
