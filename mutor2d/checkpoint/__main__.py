"""``python -m mutor2d.checkpoint``: inspect, verify and export checkpoints (see the package doc)."""
from . import main

main()
