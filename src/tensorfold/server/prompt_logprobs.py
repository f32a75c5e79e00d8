"""The prompt's logprobs: completions' `echo` with `logprobs` (OpenAI: the echoed prompt's tokens
lead the legacy logprobs, the first one without a logprob) and vLLM's `prompt_logprobs`."""

from __future__ import annotations

import math
from typing import Any

from .protocol import CompletionLogprobs

# (logprob, rank, top alternatives) of a prompt token; None for the first, which nothing predicts
PromptEntry = tuple[float, int, list[tuple[int, float]]] | None
FLOOR = -9999.0  # -inf is not JSON


def _lp(x: float) -> float:
    return x if math.isfinite(x) else FLOOR


def echo_logprobs(ids: list[int], entries: list[PromptEntry], texts) -> CompletionLogprobs:
    """The echoed prompt in the legacy shape, text offsets from 0."""
    out, offset = CompletionLogprobs(), 0
    for token_id, entry in zip(ids, entries):
        text = texts.get(token_id)[0]
        out.tokens.append(text)
        out.text_offset.append(offset)
        offset += len(text)
        if entry is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        logprob, _, top = entry
        out.token_logprobs.append(_lp(logprob))
        alternatives: dict[str, float] = {}
        for t, v in top:
            alternatives.setdefault(texts.get(t)[0], _lp(v))
        alternatives.setdefault(text, _lp(logprob))  # the prompt's own token, always
        out.top_logprobs.append(alternatives)
    return out


def vllm_prompt_logprobs(
    ids: list[int], entries: list[PromptEntry], texts
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's shape: per position None or {token id: {logprob, rank, decoded_token}}, the prompt's
    own token first, then the top alternatives."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for token_id, entry in zip(ids, entries):
        if entry is None:
            out.append(None)
            continue
        logprob, rank, top = entry
        d = {str(token_id): _entry(logprob, rank, texts.get(token_id)[0])}
        for r, (t, v) in enumerate(top, start=1):
            d.setdefault(str(t), _entry(v, r, texts.get(t)[0]))
        out.append(d)
    return out


def _entry(logprob: float, rank: int, text: str) -> dict[str, Any]:
    return {"logprob": _lp(logprob), "rank": rank, "decoded_token": text}


def merge(prompt: CompletionLogprobs, reply: CompletionLogprobs) -> CompletionLogprobs:
    """The echoed prompt's logprobs, then the reply's (their offsets after the prompt's text)."""
    return CompletionLogprobs(
        tokens=prompt.tokens + reply.tokens,
        token_logprobs=prompt.token_logprobs + reply.token_logprobs,
        top_logprobs=prompt.top_logprobs + reply.top_logprobs,
        text_offset=prompt.text_offset + reply.text_offset,
    )
