"""A chat reply's text as OpenAI shapes it: the thinking trace, the answer, the tool calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..engine.reasoning import ReasoningSplitter
from .toolcalls import ToolCall, ToolCallStream


@dataclass(frozen=True)
class ChatOptions:
    """How a chat request's replies are read."""

    think_open: bool = False  # the prompt leaves a think block open
    include_reasoning: bool = True  # vLLM's switch: False drops the trace from the reply
    tools: list[dict[str, Any]] | None = None  # parse tool calls (tools offered, choice not none)
    parallel_tool_calls: bool = True


@dataclass
class Piece:
    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def __add__(self, other: Piece) -> Piece:
        return Piece(
            self.reasoning + other.reasoning, self.content + other.content, self.calls + other.calls
        )


class ChatOutput:
    """One choice's text in, pieces out; whole replies and streams split the same way."""

    def __init__(self, opts: ChatOptions) -> None:
        self.opts = opts
        self.split = ReasoningSplitter(opts.think_open)
        self.tools = ToolCallStream(opts.tools, opts.parallel_tool_calls) if opts.tools else None
        self.calls: list[ToolCall] = []

    @property
    def had_reasoning(self) -> bool:
        return self.split.had_reasoning and self.opts.include_reasoning

    def feed(self, text: str) -> Piece:
        return self._answer(*self.split.feed(text), final=False)

    def finish(self) -> Piece:
        return self._answer(*self.split.finish(), final=True)

    def _answer(self, reasoning: str, content: str, final: bool) -> Piece:
        calls: list[ToolCall] = []
        if self.tools is not None:
            content, calls = self.tools.feed(content)
            if final:
                content += self.tools.finish()
        self.calls += calls
        return Piece(reasoning if self.opts.include_reasoning else "", content, calls)

    def whole(self, text: str) -> Piece:
        return self.feed(text) + self.finish()
