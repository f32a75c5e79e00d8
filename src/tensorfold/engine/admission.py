"""A request as the engine admits it: checked against the vocabulary and the context, its
reply limit and seed resolved. Refusals are raised by name before it is queued."""

from __future__ import annotations

import os
from dataclasses import replace

from ..errors import ContextOverflow, InvalidRequest
from .request import Lane, Request, SamplingParams, Watch


def make_request(
    request_id: str,
    prompt_ids: list[int],
    params: SamplingParams,
    vocab: int,
    context: int,
    default_max: int | None,
    choice: int = 0,
    watch: Watch | None = None,
) -> Request:
    """max_tokens unset: the rest of the context, or `default_max` when that is smaller; seed
    unset: a random one (a request's draws then differ run to run, as the client asked)."""
    ids = [int(t) for t in prompt_ids]
    check_request(ids, params, vocab, context)
    rest = context - len(ids)
    max_tokens = params.max_tokens or min(rest, default_max or rest)
    seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
    params = replace(params, max_tokens=max_tokens, seed=seed)
    cuts = tuple(sorted(set(watch.cuts))) if watch is not None else ()
    return Request(request_id, ids, params, choice, watch, lane=Lane(cuts=cuts))


def check_request(ids: list[int], params: SamplingParams, vocab: int, context: int) -> None:
    if not ids:
        raise InvalidRequest("the prompt is empty", param="prompt")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise InvalidRequest(
            f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="prompt"
        )
    bad = [t for t, _ in params.logit_bias if not 0 <= t < vocab]
    bad += [t for t in params.stop_token_ids if not 0 <= t < vocab]
    if bad:
        name = "logit_bias" if bad[0] in dict(params.logit_bias) else "stop_token_ids"
        raise InvalidRequest(
            f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param=name
        )
    want = len(ids) + (params.max_tokens or 1)
    if want > context:
        raise ContextOverflow(
            f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens or 1}) = {want} exceeds "
            f"the context of {context} tokens",
            param="max_tokens",
        )
