"""A request's own rule for its next-token logits: logit_bias, min_tokens, then the repetition,
frequency and presence penalties (vLLM's order), before temperature and the top-k/p/min-p cut.

`shape_logits` is a pure function of (the request's parameters, its prompt, its tokens so far,
one row of raw logits): no company, no position in a batch, no state kept between calls. So a
drafted token can be checked at any position by calling it with the tokens before that position,
and concurrent = solo holds. It works in fp32 (bf16 and fp16 logits convert exactly)."""

from __future__ import annotations

from collections.abc import Collection

import torch

from .request import SamplingParams


def shapes_logits(params: SamplingParams) -> bool:
    """Whether the request's rule changes any logit (else the raw row is used as is)."""
    return bool(
        params.logit_bias
        or params.min_tokens > 0
        or params.repetition_penalty != 1.0
        or params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
    )


def stop_ids(params: SamplingParams, eos_ids: Collection[int]) -> list[int]:
    """Tokens that would end the reply: min_tokens forbids them until it is reached."""
    ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        ids |= set(eos_ids)
    return sorted(ids)


def shape_logits(
    params: SamplingParams,
    prompt_ids: list[int],
    output_ids: list[int],
    row: torch.Tensor,
    eos_ids: Collection[int] = (),
) -> torch.Tensor:
    """The processed logits row [V] (fp32) the request's sampling reads at the position after
    `output_ids`; `row` is left untouched."""
    x = row.to(torch.float32).clone()
    vocab, device = x.shape[0], x.device
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], device=device)
        bias = torch.tensor([b for _, b in params.logit_bias], dtype=torch.float32, device=device)
        x[ids] += bias
    if len(output_ids) < params.min_tokens:
        ends = stop_ids(params, eos_ids)
        if ends:
            x[torch.tensor(ends, device=device)] = float("-inf")
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), device=device)
        if seen.numel():
            v = x[seen]
            rp = params.repetition_penalty
            x[seen] = torch.where(v > 0, v / rp, v * rp)
    if output_ids and (params.frequency_penalty != 0.0 or params.presence_penalty != 0.0):
        counts = torch.bincount(torch.tensor(output_ids, device=device), minlength=vocab)
        counts = counts[:vocab].to(torch.float32)
        x -= params.frequency_penalty * counts
        x -= params.presence_penalty * (counts > 0).to(torch.float32)
    return x
