"""The per-row state of a batch of texts being decoded on the host: emitted tokens, done flags and the
rules that end a row (EOS, a stop string, ``max_new_tokens``)."""
from __future__ import annotations


class Rows:
    """A row ends at EOS, at the token completing a stop string, or at ``max_new_tokens``. ``raw_stop``:
    match as transformers' StopStringCriteria does (``prompts``: real prompt ids), else in the decoded text."""

    def __init__(self, B: int, max_new_tokens: int, eos=(), stop=(), tokenizer=None, prompts=None,
                 raw_stop: bool = False):
        self.out, self.done = [[] for _ in range(B)], [False] * B
        self.max_new, self.eos, self.stop, self.tokenizer = max_new_tokens, set(eos), list(stop), tokenizer
        if self.stop and tokenizer is None:
            raise ValueError(f"stop={self.stop}: stop strings need the tokenizer")
        self.raw, self.window = raw_stop, 2 * max(map(len, self.stop), default=0) + 4
        self.context = [list(p) for p in prompts] if raw_stop else [[] for _ in range(B)]

    def _completes_stop(self, row: int) -> bool:
        """Whether a stop string occurs in the row's last tokens' text, overlapping its last token."""
        seq = (self.context[row] + self.out[row])[-self.window:]
        now, before = (self.tokenizer.decode(s, skip_special_tokens=not self.raw) for s in (seq, seq[:-1]))
        return any(now.find(s, max(len(before) - len(s) + 1, 0)) >= 0 for s in self.stop)

    def emit(self, row: int, tokens: list[int]) -> None:
        """Append a round's tokens to ``row`` up to the one that ends it (see the class doc)."""
        out = self.out[row]
        for t in tokens:
            out.append(t)
            if t in self.eos or len(out) >= self.max_new or (self.stop and self._completes_stop(row)):
                self.done[row] = True
                return
