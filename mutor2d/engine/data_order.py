"""Which samples each process reads at each step.

Epoch e is a permutation of the dataset drawn from ``seed + e``; step s takes positions
[s*B, (s+1)*B) of the concatenated epochs (B = global batch); micro-batch m of process r takes the
slice (m*world + r)*b .. +b of it (b = B / (world*grad_accum)). The order depends on the step only,
so resuming needs no loader state (a checkpoint stores none: mutor2d.checkpoint.state), and the
global batch of a step is the same for any process count.

Grouped by length (``lengths`` given, text data): each epoch's permutation is cut into windows of
``chunk`` global batches; a window is sorted by length (longest first), cut into batches, and its
batches are shuffled, so a step's samples have similar lengths (less padding) and the order is still
a function of (seed, epoch) alone.
"""
from __future__ import annotations

import torch

from ..config import ConfigError


class StepBatches:
    """Index lists of one process's micro-batches for steps [start, end)."""

    def __init__(self, n: int, batch_size: int, world: int, rank: int, accum: int, seed: int,
                 start: int, end: int, lengths: torch.Tensor | None = None, chunk: int = 32):
        if batch_size % (world * accum):
            raise ConfigError(f"train.batch_size={batch_size} is not divisible by "
                              f"processes x train.grad_accum = {world} x {accum}")
        self.n, self.B, self.world, self.rank, self.accum = n, batch_size, world, rank, accum
        self.b = batch_size // (world * accum)
        self.seed, self.start, self.end = seed, start, end
        self.lengths, self.chunk = lengths, chunk
        self._epoch, self._perm = -1, None

    def _perm_of(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed + epoch)
            perm = torch.randperm(self.n, generator=g)
            self._epoch, self._perm = epoch, perm if self.lengths is None else self._grouped(perm, g)
        return self._perm

    def _grouped(self, perm: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """``perm`` with each window of ``chunk`` batches sorted by length and its batches shuffled."""
        out = []
        for window in perm.split(self.B * self.chunk):
            window = window[self.lengths[window].argsort(descending=True, stable=True)]
            batches = list(window.split(self.B))
            out += [batches[k] for k in torch.randperm(len(batches), generator=g).tolist()]
        return torch.cat(out)

    def positions(self, first: int, count: int) -> torch.Tensor:
        """Dataset indices of stream positions first .. first+count-1 (epoch e holds e*n .. e*n+n-1)."""
        last = first + count
        return torch.cat([self._perm_of(e)[max(first - e * self.n, 0):last - e * self.n]
                          for e in range(first // self.n, (last - 1) // self.n + 1)])

    def __len__(self) -> int:
        return max(0, self.end - self.start) * self.accum

    def __iter__(self):
        for step in range(self.start, self.end):
            glob = self.positions(step * self.B, self.B)
            for m in range(self.accum):
                off = (m * self.world + self.rank) * self.b
                yield glob[off:off + self.b].tolist()
