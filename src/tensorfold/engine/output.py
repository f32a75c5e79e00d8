"""Committing a chosen token: the reply's ids, its new text, logprobs, and whether it ends the
request (a stop token, a stop string, the length). The engine finishes a request whose event
says so; this step touches no lane."""

from __future__ import annotations

import time

import torch

from ..ops.sampling import token_rank, top_logprobs
from .request import Request, TokenEvent


class Output:
    def __init__(self, tokenizer, eos_ids: set[int]) -> None:
        self.tokenizer, self.eos_ids = tokenizer, eos_ids

    def commit(
        self, req: Request, logits: torch.Tensor, token: int, logprobs=None, text: bool = True
    ) -> TokenEvent:
        """Appends `token` (chosen from `logits`) to the reply; the event carries its text and
        logprobs (`logprobs`: already computed from `logits`, as top_logprobs computes them),
        and `finished` with its reason when it ends the request. `text` False (a reply that
        `defers_text`): no text is decoded unless the token ends the reply, the next event
        that decodes carries it (`flush`)."""
        p = req.params
        if req.times.first_token is None:
            req.times.first_token = time.monotonic()
        req.output_ids.append(token)
        if p.logprobs is not None and logprobs is None:
            logprobs = top_logprobs(logits, token, p.logprobs)
        lp = [logprobs] if p.logprobs is not None else []
        reason = self.stop_reason(req, token)
        new, stop_hit = "", False
        if text or reason is not None:
            new, stop_hit = self.new_text(req, final=reason is not None)
        if stop_hit:
            reason = "stop"
        event = TokenEvent(req.request_id, [token], new, logprobs=lp)
        if p.prompt_logprobs is not None and len(req.output_ids) == 1:
            event.prompt_logprobs = [None, *req.prompt_logprobs]
        if reason is not None:
            event.finished, event.finish_reason = True, reason
        return event

    def defers_text(self, req: Request) -> bool:
        """Whether a run of tokens committed together (a verify pass's) may decode its text once,
        at its last token: no stop string must be found at the token that completes it, and no
        token's logprobs go out with its own text."""
        p = req.params
        return self.tokenizer is not None and not p.stop and p.logprobs is None

    def flush(self, req: Request, event: TokenEvent) -> None:
        """The text of the reply's tokens committed without it, onto `event` (the run's last)."""
        event.text += self.new_text(req, final=False)[0]

    @staticmethod
    def score_prompt(req: Request, start: int, logits: torch.Tensor) -> None:
        """Each prompt row's logits (from position `start`) score the prompt token after it."""
        ids, k = req.prompt_ids, req.params.prompt_logprobs
        for offset, row in enumerate(logits):
            nxt = start + offset + 1
            if nxt < len(ids):
                logprob, top = top_logprobs(row, ids[nxt], k)
                req.prompt_logprobs.append((logprob, token_rank(row, ids[nxt]), top))

    def stop_reason(self, req: Request, token: int) -> str | None:
        p = req.params
        if len(req.output_ids) <= p.min_tokens and len(req.output_ids) < req.max_tokens:
            return None  # min_tokens: no stop yet (its rule forbids the stop tokens too)
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_ids):
            return "stop"
        if len(req.output_ids) >= req.max_tokens:
            return "length"
        return None

    def new_text(self, req: Request, final: bool) -> tuple[str, bool]:
        if self.tokenizer is None:
            return "", False
        stops = req.params.stop if len(req.output_ids) > req.params.min_tokens else ()
        return req.reply.advance(self.tokenizer, req.output_ids, stops, final)
