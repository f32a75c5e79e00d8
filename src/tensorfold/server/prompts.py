"""Prompts to token ids: raw text, token ids, batches of either, and chat messages."""
from __future__ import annotations

from typing import Any

from jinja2 import TemplateError

from ..errors import ConfigError
from ..tokenizer import Tokenizer
from .errors import APIError
from .protocol import ChatMessage, Prompt

RESERVED_TEMPLATE_KWARGS = ("messages", "tokenize", "add_generation_prompt", "conversation")


def _need(tokenizer: Tokenizer | None, param: str) -> Tokenizer:
    if tokenizer is None:
        raise APIError(400, "this checkpoint has no tokenizer: send token ids", param,
                       code="no_tokenizer")
    return tokenizer


def split_prompt(prompt: Prompt) -> list[str | list[int]]:
    """One prompt or a batch: a list of strings or of id lists is a batch, a list of ids is one."""
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


def encode_prompts(prompt: Prompt, tokenizer: Tokenizer | None) -> list[list[int]]:
    """Ids of each prompt; range checks (empty, outside the vocabulary) are the engine's."""
    return [_need(tokenizer, "prompt").encode(p) if isinstance(p, str) else list(p)
            for p in split_prompt(prompt)]


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: content parts joined into one string."""
    out = []
    for i, m in enumerate(messages):
        d = m.model_dump(exclude_none=True)
        if isinstance(m.content, list):
            for part in m.content:
                if part.type != "text":
                    raise APIError(400, f"content parts of type {part.type!r} are not supported "
                                   "(text only)", f"messages[{i}].content", code="unsupported")
            d["content"] = "".join(part.text or "" for part in m.content)
        out.append(d)
    return out


def template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    bad = sorted(set(kwargs or {}) & set(RESERVED_TEMPLATE_KWARGS))
    if bad:
        raise APIError(400, f"chat_template_kwargs may not set {', '.join(bad)}",
                       "chat_template_kwargs", code="invalid_value")
    return dict(kwargs or {})


def encode_chat(messages: list[ChatMessage], tokenizer: Tokenizer | None,
                kwargs: dict[str, Any] | None, add_generation_prompt: bool = True) -> list[int]:
    """Renders the messages with the checkpoint's chat template (e.g. enable_thinking=False)."""
    tok = _need(tokenizer, "messages")
    if not messages:
        raise APIError(400, "messages must not be empty", "messages", code="invalid_value")
    rendered, extra = template_messages(messages), template_kwargs(kwargs)
    try:
        return tok.chat(rendered, add_generation_prompt=add_generation_prompt, **extra)
    except ConfigError as exc:
        raise APIError(400, str(exc), "messages", code="no_chat_template") from exc
    except (TemplateError, TypeError, ValueError, KeyError) as exc:
        raise APIError(400, f"the chat template refused the messages: {exc}", "messages",
                       code="invalid_value") from exc
