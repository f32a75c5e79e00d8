"""Tool calls in Qwen3.5's format, parsed into OpenAI's `tool_calls`. The template tells the model:

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

A value is JSON unless the tool's schema says the argument is a string. A block that does not
parse, or names a function the request did not offer, leaves the rest of the reply as text."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION = re.compile(r"\s*<function=([^>\n]+)>\n?(.*?)</function>\s*\Z", re.DOTALL)
PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>\s*", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as OpenAI sends it


def _string_args(tools: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Function name -> its arguments typed as strings (their values are taken verbatim)."""
    out: dict[str, set[str]] = {}
    for tool in tools:
        fn = tool.get("function") or {}
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[fn.get("name", "")] = {
            k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"
        }
    return out


def _value(raw: str, as_string: bool) -> Any:
    if as_string:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def parse_block(body: str, strings: dict[str, set[str]]) -> ToolCall | None:
    """One `<tool_call>` block's inside, or None when it is not a call to an offered function."""
    m = FUNCTION.match(body)
    if m is None or m.group(1).strip() not in strings:
        return None
    name, inner = m.group(1).strip(), m.group(2)
    args, pos = {}, 0
    for p in PARAMETER.finditer(inner):
        if inner[pos : p.start()].strip():
            return None
        args[p.group(1).strip()] = _value(p.group(2), p.group(1).strip() in strings[name])
        pos = p.end()
    if inner[pos:].strip():
        return None
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", name, json.dumps(args, ensure_ascii=False))


@dataclass
class ToolCallStream:
    """Answer text in, (text delta, finished calls) out: text from `<tool_call>` on is held until
    its block closes; a block that does not parse turns the rest of the reply back into text."""

    tools: list[dict[str, Any]]
    parallel: bool = True
    held: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    plain: bool = False  # a block failed: everything from here on is text

    def __post_init__(self) -> None:
        self.strings = _string_args(self.tools)

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        if self.plain:
            return text, []
        buf, self.held, shown, new = self.held + text, "", "", []
        while buf:
            at = buf.find(OPEN)
            if at < 0:
                hold = next((n for n in range(len(OPEN) - 1, 0, -1) if buf.endswith(OPEN[:n])), 0)
                if self.calls and buf[: len(buf) - hold].strip():
                    return self._give_up(shown + buf, new)  # text after a call: not a call list
                keep = buf[: len(buf) - hold]
                shown += "" if self.calls else keep
                self.held = buf[len(buf) - hold :] if hold else ("" if not self.calls else keep)
                return shown, new
            if self.calls and buf[:at].strip():
                return self._give_up(shown + buf, new)
            shown, buf = shown + ("" if self.calls else buf[:at]), buf[at:]
            end = buf.find(CLOSE)
            if end < 0:
                self.held = buf
                return shown, new
            call = parse_block(buf[len(OPEN) : end], self.strings)
            if call is None:
                return self._give_up(shown + buf, new)
            if self.parallel or not self.calls:
                self.calls.append(call)
                new.append(call)
            buf = buf[end + len(CLOSE) :]
        return shown, new

    def _give_up(self, text: str, new: list[ToolCall]) -> tuple[str, list[ToolCall]]:
        self.plain = True
        return text, new

    def finish(self) -> str:
        """Held text at the end (an unclosed block, whitespace after the calls)."""
        held, self.held = self.held, ""
        return "" if self.calls and not held.strip() else held
