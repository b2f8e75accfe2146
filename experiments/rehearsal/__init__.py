"""The parts of experiments/rehearse.py: procs (processes, the stop signal), stages (sizes, makers, checks)."""
