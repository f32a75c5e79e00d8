"""The arithmetic of one product's reduction plan on the GPU: one K segment summed from zero
(one tl.dot per K block, in order, into one fp32 accumulator), the whole chain (every segment,
added in order), and the segments' stored sums added in order (`_segment_total`: the split form's
second step, run by its own launch or inside the op that reads the product). The products of
linear.py and the expert products of moe.py run these."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..linear import Partial
from .unpack import _unpacked


@triton.jit
def _dense_segment(
    x_ptr,
    w_ptr,
    o_m,
    o_n,
    M,
    N,
    k_begin,
    stride_x,
    stride_w,
    SEG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    o_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(SEG // BLOCK_K):
        k0 = k_begin + i * BLOCK_K
        b_x = tl.load(
            x_ptr + o_m[:, None] * stride_x + (k0 + o_k)[None, :], mask=o_m[:, None] < M, other=0.0
        )
        b_w = tl.load(
            w_ptr + o_n[:, None] * stride_w + (k0 + o_k)[None, :], mask=o_n[:, None] < N, other=0.0
        )
        acc = tl.dot(b_x, tl.trans(b_w), acc)
    return acc


@triton.jit
def _affine_segment(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    o_m,
    o_n,
    M,
    N,
    k_begin,
    stride_x,
    stride_w,
    stride_s,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
    SEG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    o_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(SEG // BLOCK_K):
        k0 = k_begin + i * BLOCK_K
        b_x = tl.load(
            x_ptr + o_m[:, None] * stride_x + (k0 + o_k)[None, :], mask=o_m[:, None] < M, other=0.0
        )
        b_w = _unpacked(
            w_ptr,
            s_ptr,
            b_ptr,
            o_n,
            N,
            k0,
            stride_w,
            stride_s,
            BITS,
            GROUP,
            GROUPS,
            BLOCK_N,
            BLOCK_K,
        )
        acc = tl.dot(b_x, b_w.to(x_ptr.dtype.element_ty), acc)
    return acc


@triton.jit
def _dense_whole(
    x_ptr,
    w_ptr,
    o_m,
    o_n,
    M,
    N,
    stride_x,
    stride_w,
    SEG: tl.constexpr,
    NSEG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Every segment of the plan, each summed from zero, added in order: the whole form's sum
    (the expert products of ops/triton/moe.py run it too)."""
    acc = _dense_segment(
        x_ptr, w_ptr, o_m, o_n, M, N, 0, stride_x, stride_w, SEG, BLOCK_M, BLOCK_N, BLOCK_K
    )
    for s in range(1, NSEG):
        acc += _dense_segment(
            x_ptr,
            w_ptr,
            o_m,
            o_n,
            M,
            N,
            s * SEG,
            stride_x,
            stride_w,
            SEG,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
    return acc


@triton.jit
def _affine_whole(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    o_m,
    o_n,
    M,
    N,
    stride_x,
    stride_w,
    stride_s,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
    SEG: tl.constexpr,
    NSEG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """`_dense_whole` for packed weights."""
    acc = _affine_segment(
        x_ptr, w_ptr, s_ptr, b_ptr, o_m, o_n, M, N, 0, stride_x, stride_w, stride_s,
        BITS, GROUP, GROUPS, SEG, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    for s in range(1, NSEG):
        acc += _affine_segment(
            x_ptr, w_ptr, s_ptr, b_ptr, o_m, o_n, M, N, s * SEG, stride_x, stride_w, stride_s,
            BITS, GROUP, GROUPS, SEG, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
    return acc


@triton.jit
def _swapped_segment(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    o_m,
    o_n,
    M,
    N,
    k_begin,
    stride_x,
    stride_w,
    stride_s,
    PACKED: tl.constexpr,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
    SEG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One segment with the weights on the MMA's wide side: accᵀ [BLOCK_N, BLOCK_M] = W · xᵀ,
    the same 16-column MMAs chained in the same order as `_dense_segment` / `_affine_segment`
    (an output element reads only its own row and column: the same fp32 sums)."""
    o_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for i in range(SEG // BLOCK_K):
        k0 = k_begin + i * BLOCK_K
        b_x = tl.load(
            x_ptr + o_m[None, :] * stride_x + (k0 + o_k)[:, None], mask=o_m[None, :] < M, other=0.0
        )
        if PACKED:
            b_w = _unpacked(
                w_ptr, s_ptr, b_ptr, o_n, N, k0, stride_w, stride_s, BITS, GROUP, GROUPS,
                BLOCK_N, BLOCK_K,
            )  # fmt: skip
            acc = tl.dot(tl.trans(b_w.to(x_ptr.dtype.element_ty)), b_x, acc)
        else:
            b_w = tl.load(
                w_ptr + o_n[:, None] * stride_w + (k0 + o_k)[None, :],
                mask=o_n[:, None] < N,
                other=0.0,
            )
            acc = tl.dot(b_w, b_x, acc)
    return acc


@triton.jit
def _swapped_whole(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    o_m,
    o_n,
    M,
    N,
    stride_x,
    stride_w,
    stride_s,
    PACKED: tl.constexpr,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
    SEG: tl.constexpr,
    NSEG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """The whole form's sum in the swapped form, returned as [BLOCK_M, BLOCK_N] (a transpose
    moves values, it adds nothing)."""
    acc = _swapped_segment(
        x_ptr, w_ptr, s_ptr, b_ptr, o_m, o_n, M, N, 0, stride_x, stride_w, stride_s, PACKED,
        BITS, GROUP, GROUPS, SEG, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    for s in range(1, NSEG):
        acc += _swapped_segment(
            x_ptr, w_ptr, s_ptr, b_ptr, o_m, o_n, M, N, s * SEG, stride_x, stride_w, stride_s,
            PACKED, BITS, GROUP, GROUPS, SEG, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
    return tl.trans(acc)


@triton.jit
def _segment_total(
    p_ptr, row, o, mask, stride_s, stride_m, NSEG: tl.constexpr, OUT: tl.constexpr,
    FAULT: tl.constexpr = 0,
):  # fmt: skip
    """Columns `o` of row `row` of a product from its segments' stored fp32 sums (segment s at
    p_ptr + s·stride_s + row·stride_m), added in segment order as the whole form adds them and
    rounded once to OUT. Planted (the registry's controls): FAULT 1 adds them in reverse, FAULT
    2 returns the fp32 total unrounded (a fused reader rounding at another point)."""
    if FAULT == 1:
        acc = tl.load(p_ptr + (NSEG - 1) * stride_s + row * stride_m + o, mask=mask, other=0.0)
        for s in range(1, NSEG):
            acc += tl.load(
                p_ptr + (NSEG - 1 - s) * stride_s + row * stride_m + o, mask=mask, other=0.0
            )
    else:
        acc = tl.load(p_ptr + row * stride_m + o, mask=mask, other=0.0)
        for s in range(1, NSEG):  # in segment order, as the whole form adds them
            acc += tl.load(p_ptr + s * stride_s + row * stride_m + o, mask=mask, other=0.0)
    if FAULT != 2:
        acc = acc.to(OUT)
    return acc


@triton.jit
def _read(p_ptr, row, o, mask, stride_s, stride_m, NSEG: tl.constexpr, OUT: tl.constexpr):
    """Columns `o` of row `row` of a product's output as the op reading it takes them: NSEG 0,
    as stored (rows `stride_m` apart); else its segments' sums added as `_segment_total` adds
    them, rounded to OUT (the model dtype), the value the product's own sum would store."""
    if NSEG == 0:  # a static branch: one return, whose type may differ between the two
        value = tl.load(p_ptr + row * stride_m + o, mask=mask, other=0.0)
    else:
        value = _segment_total(p_ptr, row, o, mask, stride_s, stride_m, NSEG, OUT)
    return value


def tl_dtype(dtype: torch.dtype) -> tl.dtype:
    """Triton's name of a model dtype, for a kernel whose pointers do not carry it."""
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[
        dtype
    ]


def operand(y: torch.Tensor | Partial) -> tuple[torch.Tensor, int, int, int]:
    """What a kernel reading a product's output takes (`_segment_total`'s callers): (the
    tensor, its segments (0: the stored output), the segments' stride, the rows' stride), the
    last dimension contiguous."""
    t = y.sums if isinstance(y, Partial) else y
    if t.stride(-1) != 1:
        t = t.contiguous()
    if isinstance(y, Partial):
        return t, t.shape[0], t.stride(0), t.stride(1)
    return t, 0, 0, t.stride(0)


def pair(x: torch.Tensor | Partial, y: torch.Tensor | Partial) -> tuple[tuple, tuple]:
    """Two outputs one kernel reads with one segment count (`operand` each): both stored or both
    sums of one plan's segments."""
    ox, oy = operand(x), operand(y)
    if ox[1] != oy[1]:
        raise TypeError("a kernel takes its two operands both stored or both of one plan's sums")
    return ox, oy
