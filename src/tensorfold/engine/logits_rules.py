"""A request's own rule for its next-token logits: logit_bias, min_tokens, then the repetition,
frequency and presence penalties (vLLM's order), before temperature and the top-k/p/min-p cut.

`shape_logits` is a pure function of (the request's parameters, its prompt, its tokens so far,
one row of raw logits): no company, no position in a batch, no state kept between calls. So a
drafted token can be checked at any position by calling it with the tokens before that position,
and concurrent = solo holds. It works in fp32 (bf16 and fp16 logits convert exactly)."""

from __future__ import annotations

from collections.abc import Collection
from itertools import chain

import numpy as np
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
    on = [i for i, (p, _, _) in enumerate(rules) if p.logit_bias]
    if on:
        at, _ = _entries([[t for t, _ in rules[i][0].logit_bias] for i in on], on, x.device)
        bias = [b for i in on for _, b in rules[i][0].logit_bias]
        x[at] = x[at] + torch.tensor(bias, dtype=torch.float32).to(x.device, non_blocking=True)
    on = [i for i, (p, _, out) in enumerate(rules) if len(out) < p.min_tokens]
    ends = [stop_ids(rules[i][0], eos_ids) for i in on]
    if any(ends):
        x[_entries(ends, on, x.device)[0]] = float("-inf")
    on = [i for i, (p, _, _) in enumerate(rules) if p.repetition_penalty != 1.0]
    if on:  # a token seen twice is written twice with the same value
        at, n = _entries([rules[i][1] + rules[i][2] for i in on], on, x.device)
        rp = _per_entry([rules[i][0].repetition_penalty for i in on], n, x.device)
        v = x[at]
        x[at] = torch.where(v > 0, v / rp, v * rp)
    _count_penalties(x, rules)
    return x


def _count_penalties(x: torch.Tensor, rules) -> None:
    """Frequency and presence penalties on the tokens each reply holds, by their counts (a
    token it does not hold loses nothing). The counts are a [L, V] sum of ones (exact integers
    in any order) read back at each held token, so nothing waits for the device (an overlapped
    engine's host goes on planning while these run); a token held twice is written twice with
    the same value."""
    on = [
        i
        for i, (p, _, out) in enumerate(rules)
        if out and (p.frequency_penalty != 0.0 or p.presence_penalty != 0.0)
    ]
    if not on:
        return
    (row, tok), _ = _entries([rules[i][2] for i in on], on, x.device)
    counts = torch.zeros_like(x).index_put_((row, tok), torch.ones_like(tok, dtype=x.dtype), True)
    n = counts[row, tok]  # each held token's count (at least 1: its presence term is pp · 1)
    fp = torch.zeros(x.shape[0], dtype=torch.float32)
    pp = torch.zeros(x.shape[0], dtype=torch.float32)
    fp[on] = torch.tensor([rules[i][0].frequency_penalty for i in on], dtype=torch.float32)
    pp[on] = torch.tensor([rules[i][0].presence_penalty for i in on], dtype=torch.float32)
    fp, pp = fp.to(x.device, non_blocking=True), pp.to(x.device, non_blocking=True)
    v = x[row, tok] - fp[row] * n
    x[row, tok] = v - pp[row] * (n > 0).to(torch.float32)


def _entries(lists: list[list[int]], lanes: list[int], device) -> tuple[tuple, torch.Tensor]:
    """The (row, token) index of every id of each lane's list, and the lists' sizes."""
    sizes = torch.tensor([len(ids) for ids in lists], dtype=torch.int64)
    flat = np.fromiter(chain.from_iterable(lists), dtype=np.int64, count=int(sizes.sum()))
    rows = torch.repeat_interleave(torch.tensor(lanes, dtype=torch.int64), sizes)
    return (
        rows.to(device, non_blocking=True),
        torch.from_numpy(flat).to(device, non_blocking=True),
    ), sizes


def _per_entry(values: list[float], sizes: torch.Tensor, device) -> torch.Tensor:
    """Each lane's value (fp32) repeated for its entries."""
    return torch.repeat_interleave(torch.tensor(values, dtype=torch.float32), sizes).to(
        device, non_blocking=True
    )
