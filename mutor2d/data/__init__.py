"""Training data, one module per family of ``data.name`` variants.

  tokens     token-grid datasets (embedded digits, pre-tokenised image stores) and ``collate``
  stargraph  the path-star graph task (Bachmann & Nagarajan 2024) as 1 x N token lines
"""
