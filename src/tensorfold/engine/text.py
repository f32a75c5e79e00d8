"""Incremental text of a reply: stop strings are held back until they can no longer match."""

from __future__ import annotations


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


def advance_text(
    full: str, emitted: int, stops: tuple[str, ...], final: bool
) -> tuple[str, int, bool]:
    """Given the decoded reply so far, returns (new text to emit, new emitted length, stop hit).

    A stop string ends the reply before it; text is emitted only once no stop can begin in it,
    and an incomplete UTF-8 sequence (decoded as U+FFFD at the end) waits for its next byte.
    """
    if stops:
        start = max(0, emitted - max(len(s) for s in stops))
        hits = [i for i in (full.find(s, start) for s in stops) if i >= 0]
        if hits:
            cut = min(hits)
            return full[emitted:cut], max(emitted, cut), True
    if final:
        return full[emitted:], len(full), False
    safe = len(full) - held_back(full, stops)
    while safe > emitted and full[safe - 1] == "\ufffd":
        safe -= 1
    return full[emitted:safe], max(emitted, safe), False


class Detokenizer:
    """The reply's text, decoded a few tokens at a time instead of whole at every step.

    Each step decodes only the tokens since the last complete piece of text (with the piece
    before them for context), so a long reply costs the same per token as a short one."""

    def __init__(self) -> None:
        self.text, self.prefix_offset, self.read_offset = "", 0, 0

    def add(self, tokenizer, ids: list[int], final: bool = False) -> str:
        prefix = tokenizer.decode(ids[self.prefix_offset : self.read_offset])
        window = tokenizer.decode(ids[self.prefix_offset :])
        # An incomplete UTF-8 sequence decodes as U+FFFD: wait for its next byte unless done.
        if len(window) > len(prefix) and (final or not window.endswith("\ufffd")):
            self.text += window[len(prefix) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        return self.text


class ReplyText:
    """A reply's decoded text and how much of it is emitted; a stop string ends it."""

    def __init__(self) -> None:
        self.detok, self.emitted = Detokenizer(), 0

    @property
    def text(self) -> str:
        return self.detok.text[: self.emitted]

    def advance(
        self, tokenizer, ids: list[int], stops: tuple[str, ...], final: bool
    ) -> tuple[str, bool]:
        """Decodes the reply's ids; returns (new text to emit, stop hit)."""
        full = self.detok.add(tokenizer, ids, final)
        new, self.emitted, hit = advance_text(full, self.emitted, stops, final)
        return new, hit
