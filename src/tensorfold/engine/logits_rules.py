"""A request's own rule for its next-token logits: logit_bias, min_tokens, then the repetition,
frequency and presence penalties (vLLM's order), before temperature and the top-k/p/min-p cut.

`shape_logits` is a pure function of (the request's parameters, its prompt, its tokens so far,
one row of raw logits): no company, no position in a batch, no state kept between calls. So a
drafted token can be checked at any position by calling it with the tokens before that position,
and concurrent = solo holds. It works in fp32 (bf16 and fp16 logits convert exactly)."""

from __future__ import annotations

from collections import Counter
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
    `output_ids`; `row` is left untouched. The one-row case of `shape_rows`."""
    return shape_rows([(params, prompt_ids, output_ids)], row[None], eos_ids)[0]


def shape_rows(
    rules: list[tuple[SamplingParams, list[int], list[int]]],
    rows: torch.Tensor,
    eos_ids: Collection[int] = (),
) -> torch.Tensor:
    """Rows [L, V] shaped by their requests' rules (params, prompt ids, output ids), in fp32,
    a few launches for all rows. Each logit meets the same fp32 operations in the same order
    whatever the other rows are (elementwise, on the entries each rule touches), so a row's
    result is its own: `shape_logits` is this with one row. `rows` is left untouched."""
    x = rows.to(torch.float32).clone()
    bias = [(i, t, b) for i, (p, _, _) in enumerate(rules) for t, b in p.logit_bias]
    if bias:
        at, val = _entries(bias, x.device)
        x[at] = x[at] + val
    ends = [
        (i, t, 0.0)
        for i, (p, _, out) in enumerate(rules)
        if len(out) < p.min_tokens
        for t in stop_ids(p, eos_ids)
    ]
    if ends:
        x[_entries(ends, x.device)[0]] = float("-inf")
    seen = [
        (i, t, p.repetition_penalty)
        for i, (p, prompt, out) in enumerate(rules)
        if p.repetition_penalty != 1.0
        for t in sorted(set(prompt) | set(out))
    ]
    if seen:
        at, rp = _entries(seen, x.device)
        v = x[at]
        x[at] = torch.where(v > 0, v / rp, v * rp)
    _count_penalties(x, rules)
    return x


def _count_penalties(x: torch.Tensor, rules) -> None:
    """Frequency and presence penalties on the tokens each reply holds (a token it does not
    hold loses nothing)."""
    counted = [
        (i, t, float(n), p.frequency_penalty, p.presence_penalty)
        for i, (p, _, out) in enumerate(rules)
        if out and (p.frequency_penalty != 0.0 or p.presence_penalty != 0.0)
        for t, n in sorted(Counter(out).items())
    ]
    if not counted:
        return
    at = _index([(i, t) for i, t, *_ in counted], x.device)
    n, fp, pp = torch.tensor([c[2:] for c in counted], dtype=torch.float32).to(x.device).unbind(1)
    v = x[at] - fp * n
    x[at] = v - pp * (n > 0).to(torch.float32)


def _entries(entries: list[tuple[int, int, float]], device) -> tuple[tuple, torch.Tensor]:
    """(row index, token index) and the fp32 values of (row, token, value) entries."""
    values = torch.tensor([v for _, _, v in entries], dtype=torch.float32).to(device)
    return _index([(i, t) for i, t, _ in entries], device), values


def _index(pairs: list[tuple[int, int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    both = torch.tensor(pairs, dtype=torch.int64).to(device)
    return both[:, 0], both[:, 1]
