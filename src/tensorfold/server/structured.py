"""Structured outputs: a chat request's `response_format` (json_object, json_schema) and its
`tool_choice` (required, a named function) as an llguidance grammar the engine masks with.

JSON goes through llguidance's JSON-schema compiler. A forced tool call is written in Qwen3.5's
format (toolcalls.py): `<tool_call>`, `<function=NAME>`, one `<parameter=ARG>` block per argument
in the schema's order (required ones always, optional ones maybe), a string argument raw on one
line (its enum kept), any other argument as JSON under its own schema."""

from __future__ import annotations

import json
import re
from typing import Any

from ..engine.constraints import Grammar
from .chat_request import named_tool, tool_choice
from .errors import APIError
from .protocol import ChatCompletionRequest

LEAD = "LEAD: /\\n{0,2}/\n"  # the newlines a reply opens with after its think block
# JSON without free whitespace (a model cannot stall in it), separated as json.dumps and most
# models write it: ", " between items, ": " after a key
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def compile_error(why: str) -> str:
    """llguidance's message about a schema without its listing of the grammar around it (our
    rule names and settings, which the client never wrote)."""
    lines, listing = [], False
    for line in why.splitlines():
        caret = listing and re.fullmatch(r"\s*\^+\s*", line)  # the listing's pointer
        listing = bool(re.match(r"\s*\d+ \| ", line))
        if not listing and not caret:
            lines.append(line)
    text = re.sub(r"^at \d+\(\d+\): ", "", "\n".join(lines).strip())
    return text.removeprefix("failed to compile JSON schema: ").strip() or why


def _lit(text: str) -> str:
    return json.dumps(text)


def _json_rule(name: str, schema: dict[str, Any]) -> str:
    return f"{name}: %json {json.dumps({**schema, 'x-guidance': COMPACT})}\n"


def json_grammar(schema: dict[str, Any]) -> str:
    """Any leading newlines, then a JSON value matching `schema`."""
    return "start: LEAD value\n" + LEAD + _json_rule("value", schema)


def _call_rules(k: int, fn: dict[str, Any]) -> list[str]:
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = set(params.get("required") or [])
    parts, rules = [], []
    for j, (arg, sub) in enumerate(props.items()):
        sub = sub if isinstance(sub, dict) else {}
        head = _lit(f"<parameter={arg}>\n")
        tail = _lit("\n</parameter>\n")
        if sub.get("type") == "string":
            enum = [e for e in sub.get("enum") or [] if isinstance(e, str)]
            value = "(" + " | ".join(_lit(e) for e in enum) + ")" if enum else "TEXT"
            rules.append(f"p{k}_{j}: {head} {value} {tail}\n")
        else:
            rules.append(f"p{k}_{j}: {head} v{k}_{j} {tail}\n")
            rules.append(_json_rule(f"v{k}_{j}", sub))
        parts.append(f"p{k}_{j}" + ("" if arg in required else "?"))
    opening = _lit(f"\n<function={fn['name']}>\n")
    closing = _lit("</function>\n")
    body = " ".join(parts)
    return [f"call{k}: <tool_call> {opening} {body} {closing} </tool_call>\n", *rules]


def tools_grammar(tools: list[dict[str, Any]], only: str | None, parallel: bool) -> str:
    """One call (of `only`, or of any tool), or with `parallel` one or more, newline apart."""
    fns = [t["function"] for t in tools if only is None or t["function"]["name"] == only]
    rules = [r for k, fn in enumerate(fns) for r in _call_rules(k, fn)]
    call = "call: " + " | ".join(f"call{k}" for k in range(len(fns))) + "\n"
    more = ' ("\\n" call)*' if parallel and only is None else ""
    return f"start: LEAD call{more}\n" + call + "".join(rules) + LEAD + "TEXT: /[^<\\n]*/\n"


def not_opening(prefix: str) -> str:
    """A Lark regex for any text that does not begin with `prefix` (a proper prefix of it
    included), written without lookahead: each way of leaving `prefix` early."""
    ways = [re.escape(prefix[:i]) + f"[^{re.escape(prefix[i])}]" for i in range(len(prefix))]
    partial = "|".join(re.escape(prefix[:i]) for i in range(1, len(prefix)))
    return f"/(?s:(?:{'|'.join(ways)}).*|{partial}|)/"


def auto_tools_grammar(tools: list[dict[str, Any]], parallel: bool) -> str:
    """tool_choice auto: a free reply that does not open a tool call, or calls of the offered
    tools only (a reply that opens `<tool_call>` must name one of them, well formed)."""
    calls = tools_grammar(tools, None, parallel).replace("start: LEAD call", "calls: call", 1)
    return "start: LEAD calls | FREE\n" + f"FREE: {not_opening('<tool_call>')}\n" + calls


def chat_grammar(body: ChatCompletionRequest, after: int | None) -> Grammar | None:
    """The request's grammar, or None when its reply is free text."""
    from llguidance import LLMatcher

    choice = tool_choice(body)
    if choice == "required" or isinstance(choice, dict):
        only = named_tool(choice) if isinstance(choice, dict) else None
        source = tools_grammar(body.tools or [], only, body.parallel_tool_calls is not False)
        return Grammar(LLMatcher.grammar_from_lark(source), after)
    fmt = body.response_format or {}
    kind = fmt.get("type", "text")
    if kind == "text" and choice == "auto" and body.tools:
        source = auto_tools_grammar(body.tools, body.parallel_tool_calls is not False)
        return Grammar(LLMatcher.grammar_from_lark(source), after)
    if kind == "text":
        return None
    if kind == "json_object":
        schema: dict[str, Any] = {"type": "object"}
        if "schema" in fmt:  # llama.cpp's form: the object's schema beside the type
            schema = fmt["schema"]
            if not isinstance(schema, dict):
                raise APIError(
                    400,
                    "response_format.schema must be a JSON schema object",
                    "response_format.schema",
                    code="invalid_value",
                )
    elif kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise APIError(
                400,
                "response_format json_schema needs json_schema.schema, a JSON schema object",
                "response_format.json_schema",
                code="invalid_value",
            )
    else:
        raise APIError(
            400,
            f"response_format type {json.dumps(kind)[:40]} is not text, json_object or json_schema",
            "response_format",
            code="invalid_value",
        )
    return Grammar(LLMatcher.grammar_from_lark(json_grammar(schema)), after)
