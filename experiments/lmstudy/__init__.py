"""The parts of experiments/lm_study.py: tasks, runs (train.py per arm and seed), report."""
