"""The per-row kernels of the mixture-of-experts block: the routing (softmax, top-k with ties to
the lowest id, renormalised weights) and the weighted sum of a row's experts with the gated shared
expert, one launch each. One program per row (and column block): a row's arithmetic is the same
code whatever else the pass holds. References: ops.moe.route and ops.moe.combine; the order of
every step is docs/exactness.md's ('Experts').
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..linear import Partial
from ..moe import Route
from .launch import pdl, pdl_start
from .segments import _read, operand, tl_dtype

COMBINE_BLOCK = 1024


def _precise() -> bool:
    """libdevice's exp on the device (CUDA's expf, which torch's kernels call; its range reduction
    uses explicit fmas, kept with fusion off); Triton's interpreter has none (numpy's stands in)."""
    return os.environ.get("TRITON_INTERPRET") != "1"


@triton.jit
def _exp(x, PRECISE: tl.constexpr):
    if PRECISE:
        y = libdevice.exp(x)  # not tl.exp's bare ex2.approx: the router's ranks rest on it
    else:
        y = tl.exp(x)
    return y


@triton.jit
def _route_kernel(
    logits_ptr,
    ids_ptr,
    w_ptr,
    E,
    stride_l,
    stride_s,
    TOP_K: tl.constexpr,
    LAST: tl.constexpr,
    BLOCK_E: tl.constexpr,
    PRECISE: tl.constexpr,
    NSEG: tl.constexpr = 0,
    OUT: tl.constexpr = tl.float32,
    PDL: tl.constexpr = False,
):
    """NSEG > 0: the logits are the router's segment sums, added and rounded to OUT here."""
    pdl_start(PDL)
    r = tl.program_id(0).to(tl.int64)
    o_e = tl.arange(0, BLOCK_E)
    ids_row = ids_ptr + r * (TOP_K + (LAST >= 0))  # LAST >= 0: one more id a row, after the k
    live = o_e < E
    x = _read(logits_ptr, r, o_e, live, stride_s, stride_l, NSEG, OUT).to(tl.float32)
    x = tl.where(live, x, float("-inf"))
    ex = _exp(x - tl.max(x, 0), PRECISE)
    probs = tl.div_rn(ex, tl.sum(ex, 0))
    left = tl.where(live, probs, -1.0)  # probabilities are >= 0: the padding is never chosen
    top = tl.zeros((BLOCK_E,), tl.float32)
    chosen = o_e < 0
    total = tl.sum(top, 0)
    for j in tl.static_range(TOP_K):
        best = tl.max(left, 0)
        pick = tl.min(tl.where(left == best, o_e, BLOCK_E), 0)  # a tie goes to the lowest id
        if j == 0:
            total = best
        else:
            total = total + best  # summed in rank order
        top = tl.where(o_e == pick, best, top)
        chosen = chosen | (o_e == pick)
        left = tl.where(o_e == pick, -1.0, left)
    place = tl.cumsum(chosen.to(tl.int32), 0) - 1  # the chosen experts written in ascending id
    tl.store(ids_row + place, o_e.to(tl.int64), mask=chosen)
    tl.store(w_ptr + r * TOP_K + place, tl.div_rn(top, total), mask=chosen)
    if LAST >= 0:
        tl.store(ids_row + TOP_K + o_e, (o_e * 0 + LAST).to(tl.int64), mask=o_e == 0)


def route(logits: torch.Tensor | Partial, top_k: int, last: int | None = None) -> Route:
    """ops.moe.route on the GPU in one launch: ids [M, k] ascending (int64; with `last`, [M, k + 1]
    ending in it), weights [M, k] fp32. `logits` may be the router's Partial (its segments added
    here, as the product's own sum would store them)."""
    (m, e), out = logits.shape, tl_dtype(logits.dtype)
    logits, nseg, stride_s, stride_l = operand(logits)
    ids = torch.empty((m, top_k + (last is not None)), dtype=torch.long, device=logits.device)
    weights = torch.empty((m, top_k), dtype=torch.float32, device=logits.device)
    if m:
        block = triton.next_power_of_2(e)
        _route_kernel[(m,)](
            logits, ids, weights, e, stride_l, stride_s, TOP_K=top_k,
            LAST=-1 if last is None else last, BLOCK_E=block, PRECISE=_precise(), NSEG=nseg,
            OUT=out, num_warps=4 if block >= 512 else 1, **pdl(logits.device),
        )  # fmt: skip
    return Route(ids, weights)


@triton.jit
def _combine_kernel(
    routed_ptr,
    w_ptr,
    shared_ptr,
    logit_ptr,
    out_ptr,
    H,
    stride_routed,
    stride_shared,
    stride_logit,
    stride_ls,
    TOP_K: tl.constexpr,
    BLOCK: tl.constexpr,
    PRECISE: tl.constexpr,
    NSEG: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):
    """NSEG > 0: the shared gate's logit is its product's segment sums, added here."""
    pdl_start(PDL)
    r = tl.program_id(0).to(tl.int64)
    o = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = o < H
    acc = tl.zeros((BLOCK,), tl.float32)
    for j in tl.static_range(TOP_K):
        w = tl.load(w_ptr + r * TOP_K + j)
        y = tl.load(routed_ptr + r * stride_routed + j * H + o, mask=mask, other=0.0)
        y = y.to(tl.float32)
        if j == 0:
            acc = w * y
        else:
            acc = acc + w * y  # ascending expert id (fused multiply-adds are off)
    g = _read(logit_ptr, r, 0, True, stride_ls, stride_logit, NSEG, out_ptr.dtype.element_ty)
    g = g.to(tl.float32)
    gate = tl.div_rn(1.0, 1.0 + _exp(-g, PRECISE))
    s = tl.load(shared_ptr + r * stride_shared + o, mask=mask, other=0.0).to(tl.float32)
    acc = acc + gate * s  # the shared expert last
    tl.store(out_ptr + r * H + o, acc.to(out_ptr.dtype.element_ty), mask=mask)


def combine(
    routed: torch.Tensor,
    weights: torch.Tensor,
    shared: torch.Tensor,
    shared_logit: torch.Tensor | Partial,
) -> torch.Tensor:
    """ops.moe.combine on the GPU in one launch: routed [M, k, H] in ascending id (rows may be
    wider: the first k of k + 1 choices), weights [M, k] fp32, shared [M, H], shared_logit [M, 1]
    (a column of a wider product is fine, or of its Partial)."""
    m, k, h = routed.shape
    if routed.stride(2) != 1 or routed.stride(1) != h:  # rows may be wider (the shared expert's)
        routed = routed.contiguous()
    weights = weights.contiguous()
    if shared.stride(1) != 1:
        shared = shared.contiguous()
    out = torch.empty((m, h), dtype=routed.dtype, device=routed.device)
    logit, nseg, stride_ls, stride_logit = operand(shared_logit)
    if m:
        _combine_kernel[(m, triton.cdiv(h, COMBINE_BLOCK))](
            routed,
            weights,
            shared,
            logit,
            out,
            h,
            routed.stride(0),
            shared.stride(0),
            stride_logit,
            stride_ls,
            TOP_K=k,
            BLOCK=COMBINE_BLOCK,
            PRECISE=_precise(),
            NSEG=nseg,
            num_warps=4,
            enable_fp_fusion=False,  # mul.rn then add.rn (no fma, no flush to zero), as the reference
            **pdl(routed.device),
        )
    return out
