"""The thinking trace apart from the answer: Qwen3.5 replies `trace\\n</think>\\n\\nanswer` after a
generation prompt that opens `<think>`. Whole replies and streamed text split the same way."""

from __future__ import annotations

from dataclasses import dataclass

THINK_START = "<think>"
THINK_END = "</think>"


def thinking_open(prompt_ids: list[int], start_id: int | None, end_id: int | None) -> bool:
    """True when the prompt leaves a think block open (the reply starts inside the trace)."""
    if start_id is None or end_id is None:
        return False
    last_start = max((i for i, t in enumerate(prompt_ids) if t == start_id), default=-1)
    last_end = max((i for i, t in enumerate(prompt_ids) if t == end_id), default=-1)
    return last_start > last_end


def split_reasoning(text: str, think_open: bool) -> tuple[str | None, str]:
    """(trace, answer) of a whole reply; the trace is None when the reply has none. A reply cut
    before `</think>` is all trace."""
    splitter = ReasoningSplitter(think_open)
    r1, c1 = splitter.feed(text)
    r2, c2 = splitter.finish()
    return (r1 + r2 if splitter.had_reasoning else None), c1 + c2


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


@dataclass
class ReasoningSplitter:
    """Streams text into (trace delta, answer delta). Newlines around `</think>` belong to
    neither side (the template writes them back), so they are held until the next text shows
    which side they fall on."""

    in_trace: bool
    had_reasoning: bool = False
    pending: str = ""  # held text: newlines at an edge, a partial marker
    started: bool = False  # the current side has shown text

    def __post_init__(self) -> None:
        self.had_reasoning = self.in_trace

    def feed(self, text: str) -> tuple[str, str]:
        buf, self.pending = self.pending + text, ""
        if self.in_trace:
            at = buf.find(THINK_END)
            if at < 0:
                hold = _partial_suffix(buf, THINK_END)
                body = buf[: len(buf) - hold]
                kept = body.rstrip("\n")
                self.pending = buf[len(kept) :]
                return self._shown(kept), ""
            trace = self._shown(buf[:at].rstrip("\n"))
            self.in_trace, self.started = False, False
            return trace, self.feed(buf[at + len(THINK_END) :])[1]
        if not self.started and not self.had_reasoning:
            head = buf.lstrip("\n")
            if head.startswith(THINK_START):  # a reply that opens its own think block
                self.in_trace = self.had_reasoning = True
                return self.feed(head[len(THINK_START) :])
            if head and THINK_START.startswith(head):
                self.pending = buf
                return "", ""
        return "", self._shown(buf)

    def _shown(self, text: str) -> str:
        """Text of the current side; the newlines that open a side are the template's."""
        if not self.started:
            text = text.lstrip("\n")
            self.started = bool(text)
        return text

    def finish(self) -> tuple[str, str]:
        """What is still held at the end of the reply."""
        held, self.pending = self.pending, ""
        if self.in_trace:
            return self._shown(held.rstrip("\n")), ""
        return "", self._shown(held)


def think_ids(tokenizer) -> tuple[int | None, int | None]:
    """The ids of `<think>` and `</think>` when the vocabulary has them as single tokens."""
    if tokenizer is None:
        return None, None
    vocab = tokenizer.hf.get_vocab()
    return vocab.get(THINK_START), vocab.get(THINK_END)
