"""A run stopped by a signal after its checkpoint: :class:`Preempted`, and the exit status of an entry
script it ends, ``PREEMPTED_EXIT`` (75, "try again": schedulers requeue on it). Light (no torch): a
command line names them before importing torch; the engine (mutor2d.engine.loop) raises it.
"""

PREEMPTED_EXIT = 75


class Preempted(Exception):
    """A stop signal ended the run after a checkpoint; train.py exits with PREEMPTED_EXIT."""
