"""Sampled tokens of many rows at once on the GPU: `ops.sampling.sample_row`'s rule (its
reference) in one sort of all the rows and two kernels, so a pass's sampled lanes cost one sort,
two launches and one sync together, not a sort and four syncs each.

A stable sort's order is a function of the row alone, so sorting every row together gives each
row its own order. A sorted row is then cut into chunks of CHUNK values; one program a chunk
takes each value's weight e = exp(v - v₀) (v₀ the row's largest), the chunk's running sums and
its sum, and the few figures the row's program needs to find where the kept prefix ends and the
draw falls without reading the chunks again (the largest running sum, the smallest weight, ...).
The row's program adds the chunk sums in a fixed tree, then reads only the chunks it must: a
running sum is the chunks' sum before it plus the chunk's own, rounded once, and since rounding
keeps order, a chunk's largest figure says exactly whether a test passes anywhere in it. Every
sum has one fixed order (the configuration here is part of the rule): a row's token never
depends on the other rows or on their number. The sums' order is not torch's: on the GPU a
token may differ from `sample_row`'s where the draw falls within rounding of a boundary.

The rule in weights: the kept prefix is the longest one whose every value after the first has
its sum before it under top_p times the whole sum and its weight at least min_p (min_p times
the first weight, 1); the draw is the first kept value whose running sum passes u times the
kept prefix's sum (the last kept value if none does)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 4096  # sorted values a program: fixed (with WARPS it decides the sums' order)
WARPS = 8
GROUP = 32  # rows sorted together: their fp32 copies, sorted values, ids and running sums
FIGURES = 4  # a chunk's sum, largest sum-before, smallest weight (after the first), largest sum


@triton.jit
def _weights(keys, o, inside, t):
    """exp(v - v₀) of the sorted values v = key / t in fp64 at positions o (0 outside)."""
    v = tl.load(keys + o, mask=inside, other=float("-inf")).to(tl.float64) / t
    return tl.exp(v - tl.load(keys).to(tl.float64) / t)


@triton.jit
def _chunk_figures(keys_ptr, rule_ptr, runs_ptr, fig_ptr, B, V, C, CHUNK: tl.constexpr):
    """Chunk c of row r: each value's running sum of weights within the chunk (stored), and the
    chunk's figures [sum, max(run - e), min(e), max(run)] over its values < n (the first value
    of the row left out of the two tests it always passes)."""
    r, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    t, n = tl.load(rule_ptr + r), tl.load(rule_ptr + B + r).to(tl.int32)
    o = c * CHUNK + tl.arange(0, CHUNK)
    inside = o < n
    e = _weights(keys_ptr + r * V, o, inside, t)
    run = tl.cumsum(e, axis=0)
    tl.store(runs_ptr + r * V + o, run, mask=o < V)
    later = inside & (o > 0)
    fig = fig_ptr + (r * 4) * C + c
    tl.store(fig, tl.sum(e, axis=0))
    tl.store(fig + C, tl.max(tl.where(later, run - e, float("-inf")), axis=0))
    tl.store(fig + 2 * C, tl.min(tl.where(later, e, float("inf")), axis=0))
    tl.store(fig + 3 * C, tl.max(tl.where(inside, run, float("-inf")), axis=0))


@triton.jit
def _pick(v, o, at):
    """v[at] of a 1-D block (o its positions): a sum of one value and zeros, exact."""
    return tl.sum(tl.where(o == at, v, 0.0), axis=0)


@triton.jit
def _choose(
    keys_ptr,
    idx_ptr,
    runs_ptr,
    fig_ptr,
    rule_ptr,
    out_ptr,
    B,
    V,
    C,
    CHUNK: tl.constexpr,
    CP: tl.constexpr,
):
    """Row r's token from its chunks' figures and at most three chunks' running sums."""
    r = tl.program_id(0).to(tl.int64)
    keys, runs = keys_ptr + r * V, runs_ptr + r * V
    t, n = tl.load(rule_ptr + r), tl.load(rule_ptr + B + r).to(tl.int32)
    top_p, min_p = tl.load(rule_ptr + 2 * B + r), tl.load(rule_ptr + 3 * B + r)
    u = tl.load(rule_ptr + 4 * B + r)
    oc = tl.arange(0, CP)
    live = oc < C
    fig = fig_ptr + (r * 4) * C + oc
    whole = tl.cumsum(tl.load(fig, mask=live, other=0.0), axis=0)  # through each chunk
    before = whole - tl.load(fig, mask=live, other=0.0)  # the chunks' sum before each chunk
    total = _pick(whole, oc, C - 1)
    limit = tl.where(top_p < 1.0, top_p * total, float("inf"))  # top_p 1: no limit
    sum_before_max = tl.load(fig + C, mask=live, other=float("-inf"))
    weight_min = tl.load(fig + 2 * C, mask=live, other=float("inf"))
    # the first chunk holding a value that fails a test: rounding keeps order, so exactly where
    # before + its largest sum-before reaches the limit or its smallest weight is under min_p
    fails = live & ((before + sum_before_max >= limit) | (weight_min < min_p))
    cut = tl.min(tl.where(fails, oc, C), axis=0)
    kept_n = n
    o = tl.arange(0, CHUNK)
    if cut < C:
        at = cut * CHUNK + o
        inside = at < n
        e = _weights(keys, at, inside, t)
        run = tl.load(runs + at, mask=inside, other=0.0)
        keep = ((_pick(before, oc, cut) + (run - e) < limit) & (e >= min_p)) | (at == 0)
        kept_n = tl.min(tl.where(inside & ~keep, at, n), axis=0)
    last = kept_n - 1
    last_chunk = last // CHUNK
    kept_sum = _pick(before, oc, last_chunk) + tl.load(runs + last)
    target = u * kept_sum
    # the draw: the first chunk before the last kept one whose largest running sum passes the
    # target, else the last kept value's chunk, read up to the kept prefix's end
    sum_max = tl.load(fig + 3 * C, mask=live, other=float("-inf"))
    passes = (oc < last_chunk) & (before + sum_max > target)
    drawn = tl.min(tl.where(passes, oc, last_chunk), axis=0)
    at = drawn * CHUNK + o
    inside = at < kept_n
    run = _pick(before, oc, drawn) + tl.load(runs + at, mask=inside, other=0.0)
    choice = tl.minimum(tl.min(tl.where(inside & (run > target), at, kept_n), axis=0), last)
    tl.store(out_ptr + r, tl.load(idx_ptr + r * V + choice))


def choose(rows: torch.Tensor, temperature, top_k, top_p, min_p, u, chunk=CHUNK) -> torch.Tensor:
    """Tokens [B] of rows [B, V] of fp32 values (each through its request's rule), every other
    argument B values: the batched `sample_row` rule (`chunk`: CHUNK, other sizes for the checks).

    The rows are sorted as fp32: for distinct fp32 values x > y, x / t > y / t in fp64 (the
    quotients' gap is far wider than an fp64 rounding), so it is the order of the fp64 values
    `sample_row` sorts, ties in the same index order, at half the sort's traffic."""
    b, v = rows.shape
    if rows.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"sampled rows must hold fp32 values, got {rows.dtype}")
    keys, idx = torch.sort(rows.float(), dim=-1, descending=True, stable=True)
    n = [k if 0 < k < v else v for k in top_k]
    rule = torch.tensor([temperature, n, top_p, min_p, u], dtype=torch.float64).to(
        rows.device, non_blocking=True
    )
    chunks = triton.cdiv(v, chunk)
    runs = torch.empty((b, v), dtype=torch.float64, device=rows.device)
    figures = torch.empty((b, FIGURES, chunks), dtype=torch.float64, device=rows.device)
    _chunk_figures[(b, chunks)](
        keys, rule, runs, figures, b, v, chunks, CHUNK=chunk, num_warps=WARPS
    )
    out = torch.empty(b, dtype=torch.int64, device=rows.device)
    _choose[(b,)](
        keys, idx, runs, figures, rule, out, b, v, chunks, CHUNK=chunk,
        CP=max(16, triton.next_power_of_2(chunks)), num_warps=WARPS,
    )  # fmt: skip
    return out
