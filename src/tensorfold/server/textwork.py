"""Tokenizing, detokenizing and chat templates run on worker threads under a time limit: the
event loop only awaits them, so a costly prompt never delays another request's tokens or
/health. (The tokenizer releases the GIL while it encodes; a request's own template renders in a
child process, sandbox.py.)"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from ..tokenizer import Tokenizer
from .errors import APIError
from .limits import Limits
from .prompts import encode_chat, encode_own_chat, encode_prompts, template_kwargs, template_names
from .protocol import ChatMessage, Prompt
from .sandbox import TemplateSandbox

WORKERS = 4
T = TypeVar("T")


@dataclass(frozen=True)
class ChatInput:
    """What a chat request or /tokenize asks the template for."""

    messages: list[ChatMessage]
    kwargs: dict[str, Any] | None
    add_generation_prompt: bool
    template: str | None  # the request's own chat_template
    tools: list[dict[str, Any]] | None = None  # rendered by the template (its tools variable)

    @classmethod
    def of(cls, body: Any) -> ChatInput:
        return cls(
            body.messages,
            body.chat_template_kwargs,
            body.add_generation_prompt,
            body.chat_template,
            getattr(body, "tools", None) or None,
        )


class TextWorker:
    def __init__(self, tokenizer: Tokenizer | None, vocab_size: int, limits: Limits) -> None:
        self.tokenizer, self.vocab_size, self.limits = tokenizer, vocab_size, limits
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="tensorfold-text")
        self.names = template_names(tokenizer)
        self.sandbox = (
            TemplateSandbox(limits.template_timeout_s, limits.max_prompt_bytes)
            if limits.trust_request_chat_template
            else None
        )

    async def prompts(self, prompt: Prompt) -> list[list[int]]:
        return await self._run(encode_prompts, prompt, self.tokenizer, self.vocab_size)

    async def chat(self, req: ChatInput) -> list[int]:
        if not req.messages:
            raise APIError(400, "messages must not be empty", "messages", code="invalid_value")
        if req.template is None:
            kwargs = template_kwargs(req.kwargs, self.names) | self._tools(req)
            return await self._run(
                encode_chat, req.messages, self.tokenizer, kwargs, req.add_generation_prompt
            )
        sandbox = self._sandbox_for(req.template)
        kwargs = template_kwargs(req.kwargs, None) | self._tools(req)
        return await self._run(
            encode_own_chat,
            req.messages,
            self.tokenizer,
            req.template,
            sandbox,
            kwargs,
            req.add_generation_prompt,
        )

    @staticmethod
    def _tools(req: ChatInput) -> dict[str, Any]:
        return {"tools": req.tools} if req.tools else {}

    async def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            raise APIError(400, "this checkpoint has no tokenizer", "tokens", code="no_tokenizer")
        return await self._run(self._decode, ids)

    def _decode(self, ids: list[int]) -> str:
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise APIError(
                400,
                f"token id {bad} is outside the vocabulary [0, {self.vocab_size})",
                "tokens",
                code="invalid_value",
            )
        return self.tokenizer.decode(ids)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.sandbox is not None:
            self.sandbox.close()

    def _sandbox_for(self, template: str) -> TemplateSandbox:
        if self.sandbox is None:
            raise APIError(
                400,
                "this server renders only the checkpoint's chat template (start "
                "it with --trust-request-chat-template to allow a request's own)",
                "chat_template",
                code="untrusted_chat_template",
            )
        size = len(template.encode())
        if size > self.limits.max_template_bytes:
            raise APIError(
                400,
                f"chat_template is {size} bytes; at most "
                f"{self.limits.max_template_bytes} (--max-template-bytes)",
                "chat_template",
                code="chat_template_too_large",
            )
        return self.sandbox

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on a worker thread, under the prompt time limit."""
        return await self._run(fn, *args)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on a worker thread; past the time limit the request gets a 503 (the thread
        finishes on its own: its input is bounded by the body caps)."""
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(self.pool, fn, *args), self.limits.prompt_timeout_s
            )
        except TimeoutError:
            raise APIError(
                503,
                f"the prompt was not processed within "
                f"{self.limits.prompt_timeout_s:g}s (--prompt-timeout); the server "
                "is busy, retry shortly",
                code="prompt_timeout",
                type="server_error",
                headers={"Retry-After": "1"},
            ) from None
