"""What a chat request asks beyond the prompt: tools and tool_choice, the reply's format, and how
its reply is read (ChatOptions)."""

from __future__ import annotations

from typing import Any

from ..engine.reasoning import thinking_open
from .chat_output import ChatOptions
from .errors import APIError
from .logsafe import clip
from .protocol import ChatCompletionRequest


def check_tools(body: ChatCompletionRequest) -> None:
    """Each tool a function with a name; a named tool_choice names one of them."""
    for i, tool in enumerate(body.tools or []):
        fn = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise APIError(
                400, "a tool must be {type: function, function: {...}}", f"tools[{i}]",
                code="invalid_value",
            )  # fmt: skip
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise APIError(
                400, "a function needs a name", f"tools[{i}].function.name", code="invalid_value"
            )
        if not isinstance(fn.get("parameters", {}), dict):
            raise APIError(
                400,
                "function.parameters must be a JSON schema object",
                f"tools[{i}].function.parameters",
                code="invalid_value",
            )
    choice = tool_choice(body)
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise APIError(
            400,
            f"tool_choice {clip(repr(choice), 40)} is not none, auto, required or a function",
            "tool_choice",
            code="invalid_value",
        )
    if choice in ("auto", "required") and not body.tools:
        raise APIError(
            400, f"tool_choice {choice} needs tools", "tool_choice", code="invalid_value"
        )
    if isinstance(choice, dict):
        name = named_tool(choice)
        if name not in {t["function"]["name"] for t in body.tools or []}:
            raise APIError(
                400,
                f"tool_choice names {clip(repr(name), 60)}, which is not among the tools",
                "tool_choice",
                code="invalid_value",
            )


def tool_choice(body: ChatCompletionRequest) -> str | dict[str, Any]:
    if body.tool_choice is None:
        return "auto" if body.tools else "none"
    return body.tool_choice


def named_tool(choice: dict[str, Any]) -> str | None:
    fn = choice.get("function")
    return fn.get("name") if isinstance(fn, dict) else None


def chat_options(
    body: ChatCompletionRequest, prompt_ids: list[int], ids: tuple[int | None, int | None]
) -> ChatOptions:
    parse = tool_choice(body) != "none"
    return ChatOptions(
        think_open=thinking_open(prompt_ids, *ids),
        include_reasoning=body.include_reasoning,
        tools=body.tools if parse and body.tools else None,
        parallel_tool_calls=body.parallel_tool_calls is not False,
    )
