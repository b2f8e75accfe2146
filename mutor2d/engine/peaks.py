"""Datasheet bf16 peaks of GPUs: the table behind the training log's MFU (mutor2d.engine.speed) and
bench/scaling.py's ``--gpu``, in a module without torch so that a command line can list it."""

# Peak dense bf16 tensor-core FLOP/s per GPU (vendor datasheets, no sparsity). A device name matches
# the first key it contains (case-insensitive), so the PCIe / NVL parts come before their SXM default.
PEAK_BF16_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H200 NVL": 835e12,
                   "H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}
