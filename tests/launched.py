"""The end of a test file run as a torchrun worker that trained several runs in one process (with
accelerate's process-group teardown switched off between them): destroy the process group, flush, and
leave without the interpreter's teardown, where torch's threads can abort a finished process (SIGABRT,
"terminate called without an active exception") and fail a launch whose every run succeeded."""
import os
import sys


def exit_worker() -> None:
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
