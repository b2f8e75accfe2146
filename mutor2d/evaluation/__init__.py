"""Evaluation of trained models, one job per module:

  sources   image sources (sample npz files, ADM reference batches, image folders, digits:SPLIT)
  digits    the embedded digits classifier, registered as a torch-fidelity feature extractor
  metrics   FID / IS / precision-recall / KID of samples against a reference
  records   evaluation records (JSON) and the leaderboard table and plot over them
  online    the digits metric during training, and its floor (real held-out images)
  study     the image study: train, sample, score and summarise a set of methods and seeds
  study_runs    one run of a study (train, select a step on validation, sample, score), the floor, the pool
  study_tables  a study's records grouped over seeds: the table, paired differences, convergence
  study_plots   a study's figures (FID against step, metrics against the data fraction)
  extrapolation  NLL by position past the trained length: curves, taller image grids, tables
  stargraph solve rates and teacher-forced accuracy on the path-star graph task
  options   metric and feature names, the cache folder, MetricsError (no torch: command lines parse with them)
  plan      a study's settings and their checks (no torch until a check reads the config)

Images come from models through ``mutor2d.sampling.images``. Scripts in eval/ parse arguments only.
"""
