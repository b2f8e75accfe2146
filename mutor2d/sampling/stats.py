"""The counts of decoding runs, one type for every decoder (plain and speculative, images and text)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.functional import pad


@dataclass
class DecodeStats:
    """Counts over one or many decoding calls: sequences (images or prompts), tokens (emitted, up to a
    text's end), forwards (batched passes), row_forwards (passes per row while it decodes), drafts
    (2, 2, K) counts by draft distance (slot i drafts i + 1 tokens past the next one): [proposed
    (reached by verification), accepted] x [all drafts, register drafts]; seconds (wall). Tensors stay
    on the device until ``summary``."""
    sequences: int = 0
    tokens: int = 0
    forwards: int = 0
    row_forwards: Tensor | int = 0
    drafts: Tensor | None = None
    seconds: float = 0.0

    def add_plain(self, sequences: int, tokens: int, forwards: int, row_forwards: int) -> None:
        """A call without drafts."""
        self.sequences, self.tokens = self.sequences + sequences, self.tokens + tokens
        self.forwards, self.row_forwards = self.forwards + forwards, self.row_forwards + row_forwards

    def add_round(self, active: Tensor, reached: Tensor, kept: Tensor, register: Tensor | None = None) -> None:
        """One forward over rows ``active`` (B,) bool (the others are done); reached / kept / register
        (B, K) bool per draft slot (``verification.reached``, ``verify``'s lead, register drafts; K = 0:
        plain decoding, no draft counts)."""
        self.forwards += 1
        self.row_forwards = self.row_forwards + active.sum()
        if not kept.shape[1]:
            return
        reached, kept = reached & active[:, None], kept & active[:, None]
        register = torch.zeros_like(kept) if register is None else register
        counts = torch.stack([torch.stack([reached.sum(0), (reached & register).sum(0)]),
                              torch.stack([kept.sum(0), (kept & register).sum(0)])])
        self._add_drafts(counts)

    def _add_drafts(self, counts: Tensor) -> None:
        if self.drafts is None:
            self.drafts = counts.long()
            return
        counts = counts.long().to(self.drafts.device)
        K = max(self.drafts.shape[-1], counts.shape[-1])
        self.drafts = pad(self.drafts, (0, K - self.drafts.shape[-1])) + pad(counts, (0, K - counts.shape[-1]))

    def merge(self, other: "DecodeStats") -> None:
        """Add ``other``'s counts to these."""
        self.add_plain(other.sequences, other.tokens, other.forwards, other.row_forwards)
        self.seconds += other.seconds
        if other.drafts is not None:
            self._add_drafts(other.drafts)

    def state(self) -> dict:
        """The counts as JSON values (``from_state`` reads them back)."""
        drafts = None if self.drafts is None else self.drafts.tolist()
        return dict(sequences=self.sequences, tokens=self.tokens, forwards=self.forwards,
                    row_forwards=int(self.row_forwards), drafts=drafts, seconds=self.seconds)

    @classmethod
    def from_state(cls, state: dict) -> "DecodeStats":
        drafts = state.get("drafts")
        return cls(**{**state, "drafts": None if drafts is None else torch.tensor(drafts)})

    def summary(self) -> dict:
        """forwards, sequences, tokens; forwards_per_sequence (per image or prompt), forwards_per_token
        (1.0 without drafts), tokens_per_forward, tokens_per_s; with drafts accepted_per_forward
        (accepted drafts per round after the first pass), proposed, accepted, acceptance_by_distance,
        and the register_ ones when registers drafted. None where a count is zero."""
        rows, tokens = int(self.row_forwards), self.tokens
        out = {"forwards": self.forwards, "sequences": self.sequences, "tokens": tokens,
               "forwards_per_sequence": rows / self.sequences if self.sequences else None,
               "forwards_per_token": rows / tokens if tokens else None,
               "tokens_per_forward": tokens / rows if rows else None,
               "tokens_per_s": tokens / self.seconds if self.seconds else None}
        if self.drafts is None:
            return out
        (proposed, register_proposed), (accepted, register_accepted) = self.drafts.cpu().tolist()
        out.update(accepted_per_forward=sum(accepted) / max(rows - self.sequences, 1),
                   **_rates("", proposed, accepted))
        if sum(register_proposed):
            out.update(_rates("register_", register_proposed, register_accepted))
        return out


def _rates(kind: str, proposed: list[int], accepted: list[int]) -> dict:
    """{kind}proposed, {kind}accepted and {kind}acceptance_by_distance (None where nothing was proposed)."""
    return {f"{kind}proposed": proposed, f"{kind}accepted": accepted,
            f"{kind}acceptance_by_distance": [a / p if p else None for a, p in zip(accepted, proposed)]}
