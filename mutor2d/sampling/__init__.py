"""Autoregressive decoding with a KV cache: ``decoding.generate`` fills a grid in raster order from a
prefix (class labels, a prompt, ...) under the per-token rules of ``rules.SamplingRules`` (CFG,
temperature, top-k, top-p). Every decoding mode, for images and text, is the one round loop of
``rounds`` (a model step verifying a drafter's drafts by ``verification``'s rule) with its drafter
(``drafters``); the modes are the ``sample.decode`` variants of ``config``, each registered with its
drafter's builder: ``plain``, ``registers`` (MuToR registers as drafters), ``jacobi`` (training-free)
and ``auto`` (the fastest exact one for the batch and device). All are exact: samples follow plain
sampling's distribution, greedy decoding gives plain greedy's tokens. A new mode: docs/EXTENDING.md.
"""
