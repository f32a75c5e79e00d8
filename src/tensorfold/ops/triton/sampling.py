"""Sampled tokens of many rows at once on the GPU: `ops.sampling.sample_row`'s rule (its
reference), one sort of all the rows and one program a row, so a pass's sampled lanes cost one
sort, one kernel and one sync together, not a sort and four syncs each.

A stable sort's order is a function of the row alone, so sorting every row together gives each
row its own order; the softmax sums, the kept prefix and the draw then run in one program a row
in a fixed order (the blocks in turn, a fixed tree within a block): a row's token never depends
on the other rows or on their number. The sums' order is not torch's: on the GPU a token may
differ from `sample_row`'s where the draw falls within rounding of a boundary."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # sorted values a step: the whole configuration is fixed (it decides the sums' order)
GROUP = 32  # rows sorted together: their fp64 copies, sorted values and ids (~190 MB at 248k)


@triton.jit
def _choose(vals_ptr, idx_ptr, n_ptr, top_p_ptr, min_p_ptr, u_ptr, out_ptr, V, BLOCK: tl.constexpr):
    """Row r's token from its values sorted largest first (logits / temperature, fp64): the
    softmax of the first n (top-k), the longest prefix within top-p and min-p (at least one),
    and the first of it whose running sum passes u times the prefix's sum. Every sum runs in
    one fixed order (blocks in turn, a fixed tree within a block): a row's token never depends
    on the other rows."""
    r = tl.program_id(0).to(tl.int64)
    row = vals_ptr + r * V
    n = tl.load(n_ptr + r)
    top_p, min_p, u = tl.load(top_p_ptr + r), tl.load(min_p_ptr + r), tl.load(u_ptr + r)
    top = tl.load(row)
    o = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for b in range(0, n, BLOCK):
        v = tl.load(row + b + o, mask=b + o < n, other=float("-inf"))
        acc += tl.exp(v - top)
    total = tl.sum(acc, axis=0)
    first = 1.0 / total  # the largest value's probability
    p_limit = tl.where(top_p < 1.0, top_p, float("inf"))  # top_p 1: no limit
    # the kept prefix: probabilities fall along the sorted row, so top-p and min-p keep a prefix
    zero = tl.zeros([], dtype=tl.float64)
    before, kept_sum, kept_n = zero, zero, n
    for b in range(0, n, BLOCK):
        inside = b + o < n
        v = tl.load(row + b + o, mask=inside, other=float("-inf"))
        p = tl.exp(v - top) / total
        run = tl.cumsum(p, axis=0)
        keep = (run - p + before < p_limit) & (p >= min_p * first)  # min_p 0: every p
        keep = keep | (b + o == 0)  # the most likely token always
        kept_n = tl.minimum(kept_n, tl.min(tl.where(inside & ~keep, b + o, n), axis=0))
        kept_sum += tl.sum(tl.where(b + o < kept_n, p, 0.0), axis=0)
        before += tl.sum(p, axis=0)
    target = u * kept_sum
    # the first kept position whose running sum passes the target (the last kept one if none)
    choice = kept_n - 1
    running = zero
    for b in range(0, kept_n, BLOCK):
        inside = b + o < kept_n
        v = tl.load(row + b + o, mask=inside, other=float("-inf"))
        p = tl.where(inside, tl.exp(v - top) / total, 0.0)
        cdf = tl.cumsum(p, axis=0) + running
        hit = tl.min(tl.where(inside & (cdf > target), b + o, kept_n), axis=0)
        choice = tl.minimum(choice, hit)
        running += tl.sum(p, axis=0)
    tl.store(out_ptr + r, tl.load(idx_ptr + r * V + choice))


def choose(rows: torch.Tensor, temperature, top_k, top_p, min_p, u) -> torch.Tensor:
    """Tokens [B] of rows [B, V] in fp64 (each through its request's rule), every other argument
    B values: the batched `sample_row` rule."""
    b, v = rows.shape
    dev = rows.device
    f64 = lambda xs: torch.tensor(xs, dtype=torch.float64, device=dev)  # noqa: E731
    x = rows / f64(temperature)[:, None]
    vals, idx = torch.sort(x, dim=-1, descending=True, stable=True)
    n = torch.tensor([k if 0 < k < v else v for k in top_k], dtype=torch.int32, device=dev)
    out = torch.empty(b, dtype=torch.int64, device=dev)
    _choose[(b,)](vals, idx, n, f64(top_p), f64(min_p), f64(u), out, v, BLOCK=BLOCK, num_warps=4)
    return out
