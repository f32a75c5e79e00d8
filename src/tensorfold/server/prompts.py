"""Prompts to token ids: raw text, token ids, batches of either, and chat messages. These run on
the worker threads of textwork.py, never on the event loop."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from jinja2 import TemplateError, meta, nodes

from ..errors import ConfigError
from ..tokenizer import Tokenizer
from .errors import APIError
from .limits import CHAT_ROLES, MAX_KWARG_CHARS
from .logsafe import clip
from .protocol import ChatMessage, Prompt
from .sandbox import RenderJob, TemplateFailed, TemplateSandbox

# Names the server sets itself, or Hugging Face's apply_chat_template takes as its own arguments:
# a request's chat_template_kwargs may not set them (chat_template would run the client's code).
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "messages",
        "tokenize",
        "add_generation_prompt",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "continue_final_message",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "processor_kwargs",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
        "sep_token",
        "cls_token",
        "mask_token",
        "additional_special_tokens",
    }
)
JINJA_GLOBALS = frozenset(
    {"range", "dict", "lipsum", "cycler", "joiner", "namespace", "raise_exception", "strftime_now"}
)
MAX_EXACT_INT = 1 << 53
log = logging.getLogger("tensorfold.server")


def _need(tokenizer: Tokenizer | None, param: str) -> Tokenizer:
    if tokenizer is None:
        raise APIError(
            400, "this checkpoint has no tokenizer: send token ids", param, code="no_tokenizer"
        )
    return tokenizer


def split_prompt(prompt: Prompt) -> list[str | list[int]]:
    """One prompt or a batch: a list of strings or of id lists is a batch, a list of ids is one."""
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


def encode_prompts(prompt: Prompt, tokenizer: Tokenizer | None, vocab_size: int) -> list[list[int]]:
    """Ids of each prompt; ids outside the vocabulary are refused here (echo decodes them before
    the engine sees them); an empty prompt is the engine's to refuse."""
    out = []
    for p in split_prompt(prompt):
        ids = _need(tokenizer, "prompt").encode(p) if isinstance(p, str) else list(p)
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise APIError(
                400,
                f"token id {bad} is outside the vocabulary [0, {vocab_size})",
                "prompt",
                code="invalid_value",
            )
        out.append(ids)
    return out


def template_messages(
    messages: list[ChatMessage], roles: tuple[str, ...] | None = CHAT_ROLES
) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: content parts joined into one string. A role
    the template does not render would vanish from the prompt, so it is refused (`roles` None:
    the request's own template decides)."""
    out = []
    for i, m in enumerate(messages):
        if m.role == "developer":  # the OpenAI SDK's system role for newer models
            m = m.model_copy(update={"role": "system"})
        if roles is not None and m.role not in roles:
            raise APIError(
                400,
                f"role {clip(repr(m.role), 60)} is not one of {', '.join(roles)}",
                f"messages[{i}].role",
                code="invalid_value",
            )
        d = m.model_dump(exclude_none=True)
        if isinstance(m.content, list):
            for part in m.content:
                if part.type != "text":
                    raise APIError(
                        400,
                        f"content parts of type {part.type!r} are not supported (text only)",
                        f"messages[{i}].content",
                        code="unsupported",
                    )
            d["content"] = "".join(part.text or "" for part in m.content)
        if m.content is None and m.role != "assistant":
            raise APIError(
                400,
                f"a {clip(m.role, 20)} message needs content",
                f"messages[{i}].content",
                code="invalid_value",
            )
        if "tool_calls" in d:
            d["tool_calls"] = _calls_for_template(d["tool_calls"], i)
        out.append(d)
    return out


def _calls_for_template(calls: Any, i: int) -> list[dict[str, Any]]:
    """An assistant turn's tool calls with their JSON arguments as objects, as templates read
    them (Qwen3.5's writes one <parameter=...> per key, as the model wrote it)."""
    param = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise APIError(400, "tool_calls must be a list", param, code="invalid_type")
    out = []
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise APIError(
                400, "a tool call needs function.name", f"{param}[{k}]", code="invalid_value"
            )
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except ValueError as exc:
                raise APIError(
                    400,
                    f"function.arguments is not JSON: {exc}",
                    f"{param}[{k}].function.arguments",
                    code="invalid_value",
                ) from exc
        out.append({**call, "function": {**fn, "arguments": args}})
    return out


def template_names(tokenizer: Tokenizer | None) -> frozenset[str]:
    """The variables the checkpoint's chat template reads that a request may set (e.g.
    enable_thinking): what it reads, less what the server sets and Jinja's own names."""
    from .template_child import LimitedEnvironment

    source = getattr(tokenizer.hf, "chat_template", None) if tokenizer is not None else None
    sources = list(source.values()) if isinstance(source, dict) else [source] if source else []
    env, names = LimitedEnvironment(1), set()
    for text in sources:
        try:
            tree = env.parse(text)
        except TemplateError as exc:  # rendering will say so; meanwhile no kwargs are taken
            log.warning("could not read the chat template's variables: %s", exc)
            continue
        # a name the template assigns is its own working variable, unless it asks whether the
        # caller defined it (`set x = x if x is defined else true`): that is a knob
        stored = {n.name for n in tree.find_all(nodes.Name) if n.ctx in ("store", "param")}
        asked = {
            t.node.name
            for t in tree.find_all(nodes.Test)
            if t.name in ("defined", "undefined") and isinstance(t.node, nodes.Name)
        }
        names |= meta.find_undeclared_variables(tree) - (stored - asked)
    return frozenset(names - RESERVED_TEMPLATE_KWARGS - JINJA_GLOBALS)


def _plain(value: Any) -> bool:
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int):
        return abs(value) <= MAX_EXACT_INT
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and len(value) <= MAX_KWARG_CHARS


def template_kwargs(
    kwargs: dict[str, Any] | None, allowed: frozenset[str] | None
) -> dict[str, Any]:
    """Plain values (booleans, numbers, short strings) under names the template reads; `allowed`
    None (the request's own template): any name but the reserved ones."""
    for name, value in (kwargs or {}).items():
        ok = (
            name.isidentifier()
            and name not in RESERVED_TEMPLATE_KWARGS
            and (allowed is None or name in allowed)
        )
        if not ok:
            known = ", ".join(sorted(allowed)) if allowed else "none"
            raise APIError(
                400,
                f"chat_template_kwargs may not set {clip(repr(name), 60)} "
                f"(the chat template reads: {known})",
                "chat_template_kwargs",
                code="invalid_value",
            )
        if not _plain(value):
            raise APIError(
                400,
                f"chat_template_kwargs.{name} must be a boolean, a number or a "
                f"string of at most {MAX_KWARG_CHARS} characters",
                f"chat_template_kwargs.{name}",
                code="invalid_value",
            )
    return dict(kwargs or {})


def encode_chat(
    messages: list[ChatMessage],
    tokenizer: Tokenizer | None,
    kwargs: dict[str, Any],
    add_generation_prompt: bool = True,
) -> list[int]:
    """Renders the messages with the checkpoint's chat template (e.g. enable_thinking=False);
    `kwargs` were checked by template_kwargs."""
    tok = _need(tokenizer, "messages")
    rendered = template_messages(messages)
    try:
        return tok.chat(rendered, add_generation_prompt=add_generation_prompt, **kwargs)
    except ConfigError as exc:
        raise APIError(400, str(exc), "messages", code="no_chat_template") from exc
    except (TemplateError, TypeError, ValueError, KeyError) as exc:
        param = "messages"
        if kwargs and _renders(
            lambda: tok.chat(rendered, add_generation_prompt=add_generation_prompt)
        ):
            param = "chat_template_kwargs"  # the template takes the messages without them
        raise APIError(
            400,
            f"the chat template refused the {param}: {clip(str(exc), 300)}",
            param,
            code="invalid_value",
        ) from exc


def _renders(render) -> bool:
    try:
        render()
        return True
    except (TemplateFailed, TemplateError, TypeError, ValueError, KeyError):
        return False


def encode_own_chat(
    messages: list[ChatMessage],
    tokenizer: Tokenizer | None,
    template: str,
    sandbox: TemplateSandbox,
    kwargs: dict[str, Any],
    add_generation_prompt: bool = True,
) -> list[int]:
    """Renders the messages with the request's own template, in the sandbox's child process."""
    tok = _need(tokenizer, "messages")
    special = {k: v for k, v in tok.hf.special_tokens_map.items() if isinstance(v, str)}
    job = RenderJob(
        template, template_messages(messages, roles=None), kwargs, add_generation_prompt, special
    )
    try:
        return tok.encode(sandbox.render(job))
    except TemplateFailed as exc:
        raise _own_template_error(exc, job, sandbox) from exc


def _own_template_error(exc: TemplateFailed, job: RenderJob, sandbox: TemplateSandbox) -> APIError:
    if exc.kind == "busy":
        return APIError(
            503,
            str(exc),
            "chat_template",
            code="chat_template_busy",
            type="server_error",
            headers={"Retry-After": "1"},
        )
    codes = {
        "syntax": "invalid_chat_template",
        "timeout": "chat_template_timeout",
        "limit": "chat_template_limit",
        "render": "invalid_chat_template",
    }
    param = "chat_template"
    if (
        exc.kind == "render"
        and job.kwargs
        and _renders(
            lambda: sandbox.render(
                RenderJob(job.template, job.messages, {}, job.add_generation_prompt, job.special)
            )
        )
    ):
        param = "chat_template_kwargs"  # the template renders without them
    return APIError(
        400,
        f"the request's chat template failed: {clip(str(exc), 300)}",
        param,
        code=codes[exc.kind],
    )
