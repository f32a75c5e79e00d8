"""Response shapes: the legacy completion format and the chat format, whole or as stream chunks."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import lru_cache

from pydantic import BaseModel

from ..tokenizer import Tokenizer
from .chat_output import ChatOptions, ChatOutput, Piece
from .prompt_logprobs import PromptEntry, echo_logprobs, merge, vllm_prompt_logprobs
from .protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatLogprobs,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionResponse,
    Delta,
    FunctionCall,
    PromptTokensDetails,
    TokenLogprob,
    ToolCallDelta,
    ToolCallOut,
    TopLogprob,
    Usage,
)

# One sampled token's logprob and the top alternatives, as the engine reports it.
TokenLogprobs = tuple[float, list[tuple[int, float]]]
LOGPROB_FLOOR = -9999.0  # -inf is not JSON


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: printable stand-in character -> raw byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars)}


class TokenTexts:
    """A token's text and raw bytes, for logprobs (a partial UTF-8 token's text is U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        if token_id not in self._cache:
            self._cache[token_id] = self._lookup(token_id)
        return self._cache[token_id]

    def _lookup(self, token_id: int) -> tuple[str, list[int]]:
        if self.tokenizer is None or token_id >= len(self.tokenizer):
            return "", []
        text = self.tokenizer.token_text(token_id)
        piece = self.tokenizer.hf.convert_ids_to_tokens(token_id) or ""
        table = _byte_decoder()
        if piece and all(c in table for c in piece):
            return text, [table[c] for c in piece]
        return text, list(text.encode())


def _lp(x: float) -> float:
    return x if math.isfinite(x) else LOGPROB_FLOOR


@dataclass
class ChoiceState:
    """What one choice has produced so far."""

    index: int
    prompt_tokens: int
    prefix: str = ""  # the echoed prompt, for completions with echo
    prompt_ids: list[int] = field(default_factory=list)
    prompt_logprobs: list[PromptEntry] | None = None  # with the first token, when asked
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    last_token_time: float | None = None


def usage(choices: list[ChoiceState], prompt_tokens: int, cached: int) -> Usage:
    done = sum(len(c.token_ids) for c in choices)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=done,
        total_tokens=prompt_tokens + done,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )


class CompletionFormat:
    """/v1/completions: text choices, logprobs in the legacy {tokens, token_logprobs, ...} shape."""

    def __init__(
        self,
        request_id: str,
        model: str,
        texts: TokenTexts,
        logprobs: bool,
        token_ids: bool,
        fingerprint: str | None = None,
        echo_logprobs: bool = False,
        prompt_logprobs: bool = False,
    ) -> None:
        self.id, self.model, self.texts = request_id, model, texts
        self.want_logprobs, self.want_ids = logprobs, token_ids
        self.fingerprint = fingerprint
        self.echo_logprobs, self.want_prompt = echo_logprobs, prompt_logprobs
        self.created = int(time.time())
        self._offsets: dict[int, int] = {}  # text_offset reached by each streamed choice
        self._sent: set[int] = set()  # choices whose prompt logprobs went out
        self._ids_sent: set[int] = set()  # choices whose prompt ids went out

    def opening(self, choice: ChoiceState) -> BaseModel | None:
        self._offsets[choice.index] = len(choice.prefix)
        if not choice.prefix or self.echo_logprobs:  # then it leads the first token's chunk
            return None
        head = CompletionChoice(
            index=choice.index, text=choice.prefix, prompt_token_ids=self._prompt_ids(choice)
        )
        return self._chunk(head)

    def _prompt_ids(self, choice: ChoiceState) -> list[int] | None:
        """The choice's prompt ids on its first chunk, with return_token_ids."""
        if not self.want_ids or choice.index in self._ids_sent:
            return None
        self._ids_sent.add(choice.index)
        return choice.prompt_ids

    def _prompt_parts(self, c: ChoiceState) -> tuple[str, CompletionLogprobs | None, list | None]:
        """(echoed text, its logprobs, vLLM's prompt_logprobs) once the prompt is scored."""
        entries = c.prompt_logprobs
        if entries is None:
            return "", None, None
        echo = echo_logprobs(c.prompt_ids, entries, self.texts) if self.echo_logprobs else None
        vllm = vllm_prompt_logprobs(c.prompt_ids, entries, self.texts) if self.want_prompt else None
        return (c.prefix if self.echo_logprobs else ""), echo, vllm

    def delta(
        self,
        choice: ChoiceState,
        text: str,
        ids: list[int],
        lps: list[TokenLogprobs],
        finish: str | None,
    ) -> BaseModel:
        logprobs, head, prompt_lp, vllm = None, "", None, None
        if choice.prompt_logprobs is not None and choice.index not in self._sent:
            self._sent.add(choice.index)
            head, prompt_lp, vllm = self._prompt_parts(choice)
        if self.want_logprobs:
            start = self._offsets.get(choice.index, 0)
            logprobs = self._logprobs(ids, lps, start)
            self._offsets[choice.index] = start + sum(len(t) for t in logprobs.tokens)
            logprobs = merge(prompt_lp, logprobs) if prompt_lp is not None else logprobs
        return self._chunk(
            CompletionChoice(
                index=choice.index,
                text=head + text,
                finish_reason=finish,
                logprobs=logprobs,
                token_ids=ids if self.want_ids else None,
                prompt_logprobs=vllm,
                prompt_token_ids=self._prompt_ids(choice),
            )
        )

    def usage_chunk(self, u: Usage) -> BaseModel:
        return CompletionChunk(
            id=self.id,
            model=self.model,
            created=self.created,
            choices=[],
            usage=u,
            system_fingerprint=self.fingerprint,
        )

    def response(self, choices: list[ChoiceState], u: Usage) -> BaseModel:
        out = []
        for c in choices:
            _, prompt_lp, vllm = self._prompt_parts(c)
            logprobs = None
            if self.want_logprobs:
                logprobs = self._logprobs(c.token_ids, c.logprobs, len(c.prefix))
                logprobs = merge(prompt_lp, logprobs) if prompt_lp is not None else logprobs
            out.append(
                CompletionChoice(
                    index=c.index,
                    text=c.prefix + c.text,
                    finish_reason=c.finish_reason,
                    logprobs=logprobs,
                    token_ids=c.token_ids if self.want_ids else None,
                    prompt_logprobs=vllm,
                    prompt_token_ids=c.prompt_ids if self.want_ids else None,
                )
            )
        return CompletionResponse(
            id=self.id,
            model=self.model,
            created=self.created,
            choices=out,
            usage=u,
            system_fingerprint=self.fingerprint,
        )

    def _chunk(self, choice: CompletionChoice) -> BaseModel:
        return CompletionChunk(
            id=self.id,
            model=self.model,
            created=self.created,
            choices=[choice],
            system_fingerprint=self.fingerprint,
        )

    def _logprobs(
        self, ids: list[int], lps: list[TokenLogprobs], offset: int
    ) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for token_id, (logprob, top) in zip(ids, lps):
            text = self.texts.get(token_id)[0]
            out.tokens.append(text)
            out.token_logprobs.append(_lp(logprob))
            alternatives: dict[str, float] = {}
            for t, v in top:  # tokens with the same text keep the likelier one's logprob
                alternatives.setdefault(self.texts.get(t)[0], _lp(v))
            alternatives.setdefault(text, _lp(logprob))  # the chosen token, always (OpenAI's k+1)
            out.top_logprobs.append(alternatives)
            out.text_offset.append(offset)
            offset += len(text)
        return out


class ChatFormat:
    """/v1/chat/completions: an assistant message per choice (trace, answer, tool calls apart),
    logprobs in the chat shape."""

    def __init__(
        self,
        request_id: str,
        model: str,
        texts: TokenTexts,
        logprobs: bool,
        token_ids: bool,
        opts: ChatOptions | None = None,
        fingerprint: str | None = None,
    ) -> None:
        self.id, self.model, self.texts = request_id, model, texts
        self.want_logprobs, self.want_ids = logprobs, token_ids
        self.opts, self.fingerprint = opts or ChatOptions(), fingerprint
        self.created = int(time.time())
        self._outputs: dict[int, ChatOutput] = {}

    def opening(self, choice: ChoiceState) -> BaseModel | None:
        first = not self._outputs  # the stream's first chunk carries the prompt's ids
        self._outputs[choice.index] = ChatOutput(self.opts)
        opening = self._chunk(
            ChatChunkChoice(index=choice.index, delta=Delta(role="assistant", content=""))
        )
        if first and self.want_ids:
            opening.prompt_token_ids = choice.prompt_ids
        return opening

    def delta(
        self,
        choice: ChoiceState,
        text: str,
        ids: list[int],
        lps: list[TokenLogprobs],
        finish: str | None,
    ) -> list[BaseModel]:
        """The chunks for one event: a tool call is two (its name, then its arguments)."""
        out = self._outputs.setdefault(choice.index, ChatOutput(self.opts))
        piece = out.feed(text) + (out.finish() if finish else Piece())
        if finish == "stop" and out.calls:
            finish = "tool_calls"
        chunks = []
        for call in piece.calls:
            k = out.calls.index(call)
            head = ToolCallDelta(
                index=k,
                id=call.id,
                type="function",
                function=FunctionCall(name=call.name, arguments=""),
            )
            rest = ToolCallDelta(index=k, function=FunctionCall(arguments=call.arguments))
            chunks += [Delta(tool_calls=[head]), Delta(tool_calls=[rest])]
        text_delta = Delta(
            content=piece.content or None,
            reasoning_content=piece.reasoning or None,
            reasoning=piece.reasoning or None,
        )
        wanted = self.want_logprobs or self.want_ids
        if text_delta != Delta() or finish or (wanted and ids):
            chunks.insert(0, text_delta)
        last = len(chunks) - 1
        return [
            self._chunk(
                ChatChunkChoice(
                    index=choice.index,
                    delta=d,
                    finish_reason=finish if i == last else None,
                    logprobs=self._logprobs(ids, lps) if self.want_logprobs and i == 0 else None,
                    token_ids=ids if self.want_ids and i == 0 else None,
                )
            )
            for i, d in enumerate(chunks)
        ]

    def usage_chunk(self, u: Usage) -> BaseModel:
        return self._chunk(None, u)

    def response(self, choices: list[ChoiceState], u: Usage) -> BaseModel:
        out = [self._choice(c) for c in choices]
        first = choices[0] if choices else None
        scored = first is not None and first.prompt_logprobs is not None
        return ChatCompletionResponse(
            id=self.id,
            model=self.model,
            created=self.created,
            choices=out,
            usage=u,
            system_fingerprint=self.fingerprint,
            prompt_logprobs=(
                vllm_prompt_logprobs(first.prompt_ids, first.prompt_logprobs, self.texts)
                if scored
                else None
            ),
            prompt_token_ids=first.prompt_ids if self.want_ids and first is not None else None,
        )

    def _choice(self, c: ChoiceState) -> ChatChoice:
        reader = ChatOutput(self.opts)
        piece = reader.whole(c.text)
        trace = piece.reasoning if reader.had_reasoning else None
        calls = [
            ToolCallOut(id=t.id, function=FunctionCall(name=t.name, arguments=t.arguments))
            for t in piece.calls
        ]
        finish = "tool_calls" if calls and c.finish_reason == "stop" else c.finish_reason
        message = AssistantMessage(
            content=piece.content if piece.content or not (calls or trace) else None,
            reasoning_content=trace,
            reasoning=trace,
            tool_calls=calls or None,
        )
        return ChatChoice(
            index=c.index,
            message=message,
            finish_reason=finish,
            logprobs=self._logprobs(c.token_ids, c.logprobs) if self.want_logprobs else None,
            token_ids=c.token_ids if self.want_ids else None,
        )

    def _chunk(self, choice: ChatChunkChoice | None, u: Usage | None = None) -> BaseModel:
        return ChatCompletionChunk(
            id=self.id,
            model=self.model,
            created=self.created,
            choices=[choice] if choice is not None else [],
            usage=u,
            system_fingerprint=self.fingerprint,
        )

    def _entry(self, token_id: int, logprob: float) -> TopLogprob:
        text, raw = self.texts.get(token_id)
        return TopLogprob(token=text, logprob=_lp(logprob), bytes=raw)

    def _logprobs(self, ids: list[int], lps: list[TokenLogprobs]) -> ChatLogprobs:
        content = []
        for token_id, (logprob, top) in zip(ids, lps):
            head = self._entry(token_id, logprob)
            alternatives = [self._entry(t, v) for t, v in top]
            content.append(TokenLogprob(**head.model_dump(), top_logprobs=alternatives))
        return ChatLogprobs(content=content)
