"""Row-invariant products on the GPU: y[M, N] = x[M, K] · W[N, K]ᵀ, bf16 in, fp32 accumulation.

Each weight's reduction plan comes from its (N, K) alone: K is cut into segments of `segment`
columns; each segment is accumulated from zero, one tl.dot per K block in order, and the segments'
sums are added in order (s0 + s1 + s2 ...). Two launch forms realise that one arithmetic:
- whole: one program per (row tile, column tile) walks every segment, adding in registers (prompts,
  and few rows where the tile book times it faster);
- split: one program per (row tile, column tile, segment) stores its fp32 sum, and a second kernel
  adds the segments in order (a few rows: decode and verify), so a one-row product reads the
  weight with as many programs as the card has room for.
A segment's fp32 sum is the same value in both forms (stored exactly), and the additions are the
same, so a row's bits never depend on which form ran or on its company. Row and column tiles and
warps follow M: on the H200 they do not change a bit (docs/exactness.md, 'Measured on the
H200'); the registry checks it. Packed MLX affine weights are dequantized in registers:
w = scale · q + bias, rounded once to bf16.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from ..linear import Partial
from ..quant import QuantizedWeight
from .launch import pdl, pdl_start
from .segments import (
    _affine_segment,
    _affine_whole,
    _dense_segment,
    _dense_whole,
    _segment_total,
    _swapped_segment,
)
from .tiles import (  # noqa: F401 - the plan and launch shapes are part of this module's API
    SEGMENT,
    SPLIT_MAX_ROWS,
    LinearPlan,
    TileBook,
    Tiles,
    candidates,
    gpu_seconds,
    rows_class,
    timing_rows,
    untried,
)
from .unpack import _unpacked, dequantize  # noqa: F401 - dequantize is public here too

try:  # Gluon (Triton's layout-explicit dialect): the 4-bit few-row kernel on Hopper
    from . import gluon_affine
except ImportError:  # an older Triton: the swapped Triton form runs instead (the same sums)
    gluon_affine = None


@triton.jit
def _store(acc, y_ptr, p_ptr, o_m, o_n, M, N, stride_y, pid_s, SPLIT: tl.constexpr):
    mask = (o_m[:, None] < M) & (o_n[None, :] < N)
    if SPLIT:  # this segment's exact fp32 sum, added to the others by _sum_segments
        tl.store(p_ptr + (pid_s * M + o_m)[:, None].to(tl.int64) * N + o_n[None, :], acc, mask=mask)
    else:
        tl.store(
            y_ptr + o_m[:, None] * stride_y + o_n[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=mask,
        )


@triton.jit
def _dense_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    p_ptr,
    M,
    N,
    stride_x,
    stride_w,
    stride_y,
    SEG: tl.constexpr,
    NSEG: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if SPLIT:
        acc = _dense_segment(
            x_ptr,
            w_ptr,
            o_m,
            o_n,
            M,
            N,
            pid_s * SEG,
            stride_x,
            stride_w,
            SEG,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
    else:
        acc = _dense_whole(
            x_ptr, w_ptr, o_m, o_n, M, N, stride_x, stride_w, SEG, NSEG, BLOCK_M, BLOCK_N, BLOCK_K
        )
    _store(acc, y_ptr, p_ptr, o_m, o_n, M, N, stride_y, pid_s, SPLIT)


@triton.jit
def _affine_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    y_ptr,
    p_ptr,
    M,
    N,
    stride_x,
    stride_w,
    stride_s,
    stride_y,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
    SEG: tl.constexpr,
    NSEG: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if SPLIT:
        acc = _affine_segment(
            x_ptr,
            w_ptr,
            s_ptr,
            b_ptr,
            o_m,
            o_n,
            M,
            N,
            pid_s * SEG,
            stride_x,
            stride_w,
            stride_s,
            BITS,
            GROUP,
            GROUPS,
            SEG,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
    else:
        acc = _affine_whole(
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
            BITS,
            GROUP,
            GROUPS,
            SEG,
            NSEG,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
    _store(acc, y_ptr, p_ptr, o_m, o_n, M, N, stride_y, pid_s, SPLIT)


@triton.jit
def _affine_swapped_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    y_ptr,
    p_ptr,
    M,
    N,
    stride_x,
    stride_w,
    stride_s,
    stride_y,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
    SEG: tl.constexpr,
    NSEG: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Few rows with the weights on the MMA's wide side: accᵀ[BLOCK_N, BLOCK_M] = W · xᵀ. The same
    16-column MMAs chained in the same order from zero per segment as `_affine_kernel` (an MMA's
    output element reads only its own row and column), so the same fp32 sums; only the operand
    sides differ, which lets a 64-row weight tile fill the MMA while the rows pad to 16."""
    pdl_start(PDL)
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    first = pid_s if SPLIT else 0
    last = pid_s + 1 if SPLIT else NSEG
    total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for s in range(first, last):
        acc = _swapped_segment(
            x_ptr, w_ptr, s_ptr, b_ptr, o_m, o_n, M, N, s * SEG, stride_x, stride_w, stride_s,
            True, BITS, GROUP, GROUPS, SEG, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
        total = tl.where(s == first, acc, total + acc)  # in segment order; no 0 + first (-0.0)
    mask = (o_m[None, :] < M) & (o_n[:, None] < N)
    if SPLIT:
        tl.store(
            p_ptr + (pid_s * M + o_m)[None, :].to(tl.int64) * N + o_n[:, None], total, mask=mask
        )
    else:
        tl.store(
            y_ptr + o_m[None, :] * stride_y + o_n[:, None],
            total.to(y_ptr.dtype.element_ty),
            mask=mask,
        )


@triton.jit
def _sum_segments(
    p_ptr, y_ptr, M, N, stride_y, NSEG: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    pdl_start(PDL)
    m = tl.program_id(0).to(tl.int64)
    o_n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = o_n < N
    total = _segment_total(p_ptr, m, o_n, mask, M * N, N, NSEG, y_ptr.dtype.element_ty)
    tl.store(y_ptr + m * stride_y + o_n, total, mask=mask)


def _launch(
    kernel,
    x: torch.Tensor,
    weights: tuple,
    weight_strides: tuple,
    n: int,
    out: torch.Tensor | None,
    plan: LinearPlan,
    t: Tiles,
    keep: bool = False,
    **consts,
) -> torch.Tensor | Partial:
    """Runs the whole or the split form of `kernel`, then the in-order sum of the segments (or,
    with `keep`, the segments' sums as a Partial for the op that reads them)."""
    m, k = x.shape
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    nseg = plan.segments(k)
    split = nseg > 1 and m <= SPLIT_MAX_ROWS and not t.whole
    partial = torch.empty((nseg, m, n), dtype=torch.float32, device=x.device) if split else y
    grid = (triton.cdiv(m, t.block_m), triton.cdiv(n, t.block_n), nseg if split else 1)
    kernel[grid](
        x,
        *weights,
        y,
        partial,
        m,
        n,
        x.stride(0),
        *weight_strides,
        y.stride(0),
        **consts,
        SEG=plan.segment,
        NSEG=nseg,
        SPLIT=split,
        BLOCK_M=t.block_m,
        BLOCK_N=t.block_n,
        BLOCK_K=t.step_k(plan),
        num_warps=t.warps,
        num_stages=t.stages,
        **pdl(x.device),
    )
    return _total(partial, out, keep, x.dtype, y) if split else y


def _total(partial: torch.Tensor, out, keep: bool, dtype, y=None) -> torch.Tensor | Partial:
    """The segments' sums added (`_sum`, into `y` or `out`), or kept for their reader (`keep`,
    when no `out` was asked for)."""
    if keep and out is None:
        return Partial(partial, dtype)
    return _sum(partial, out if y is None else y)


def _sum(partial: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The segments' fp32 sums [NSEG, M, N] added in segment order, rounded once to out's dtype."""
    nseg, m, n = partial.shape
    y = torch.empty((m, n), dtype=torch.bfloat16, device=partial.device) if out is None else out
    _sum_segments[(m, triton.cdiv(n, 1024))](
        partial, y, m, n, y.stride(0), NSEG=nseg, BLOCK=1024, **pdl(partial.device)
    )
    return y


def stored(y: torch.Tensor | Partial) -> torch.Tensor:
    """A product's output as its own sum launch stores it: a Partial's segments added in order
    (any view of its rows: [NSEG, M, ...] summed as [NSEG, M, N]); a tensor as it is."""
    if not isinstance(y, Partial):
        return y
    sums = y.sums.reshape(y.sums.shape[0], y.shape[0], -1).contiguous()
    return _sum(sums, sums.new_empty(sums.shape[1:], dtype=y.dtype)).view(y.shape)


def dense_matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    plan: LinearPlan,
    out: torch.Tensor | None = None,
    tiles: Tiles | None = None,
    keep: bool = False,
) -> torch.Tensor | Partial:
    """x [M, K] bf16 · w [N, K]ᵀ -> [M, N] in x's dtype (`keep`: a split form's segment sums
    left to their reader, a Partial)."""
    t = tiles or candidates(x.shape[0], packed=False)[0]
    return _launch(_dense_kernel, x, (w,), (w.stride(0),), w.shape[0], out, plan, t, keep)


def affine_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    biases: torch.Tensor,
    bits: int,
    group_size: int,
    plan: LinearPlan,
    out: torch.Tensor | None = None,
    tiles: Tiles | None = None,
    single_rounding: bool = False,
    keep: bool = False,
    unpacked: torch.Tensor | None = None,
) -> torch.Tensor | Partial:
    """x [M, K] · dequant(packed [N, K*bits/32], scales/biases [N, K/gs])ᵀ -> [M, N]
    (`single_rounding`: quant.single_rounding holds for the weight, so a shape's bf16x2
    dequantization gives its values; otherwise such a shape runs the fp32 dequantization;
    `keep`: a split form's segment sums left to their reader, a Partial; `unpacked`: the
    weight's values held dequantized, which the dequantize-first shape reads)."""
    t = tiles or candidates(x.shape[0], packed=True)[0]
    words = packed.view(torch.int32)
    if t.dequant:
        # The same bf16 values (one fma, one rounding) and the same segments (they follow K alone);
        # the K block may differ, which never changes a bit (the registry checks this shape too).
        w = unpacked
        if w is None:
            w = dequantize(words, scales, biases, bits, group_size, x.dtype)
        return _launch(
            _dense_kernel,
            x,
            (w,),
            (w.stride(0),),
            w.shape[0],
            out,
            LinearPlan.for_weight(*w.shape),
            replace(t, dequant=False),
            keep,
        )
    if t.gluon and gluon_affine is not None:
        rows = t.block_m  # more rows than the shape's tile: consecutive pieces of it
        pieces = [x[r : r + rows] for r in range(0, x.shape[0], rows)]
        if all(
            gluon_affine.applies(p, bits, p.shape[1], plan.segment, t.staged, t.warps, t.ring)
            for p in pieces
        ):
            part = lambda p: gluon_affine.partials(  # noqa: E731
                p, words, scales, biases, bits, group_size, plan.segment, staged=t.staged,
                warps=t.warps, ring=t.ring, hfma=t.hfma and single_rounding, deep=t.deep,
            )  # fmt: skip
            if len(pieces) == 1:
                return _total(part(x), out, keep, x.dtype)
            return _pieces_total(pieces, part, out, packed.shape[0])
    return _launch(
        _affine_swapped_kernel if t.swap else _affine_kernel,
        x,
        (words, scales, biases),
        (words.stride(0), scales.stride(0)),
        packed.shape[0],
        out,
        plan,
        t,
        keep,
        BITS=bits,
        GROUP=group_size,
        GROUPS=max(t.step_k(plan) // group_size, 1),
    )


def _pieces_total(pieces: list[torch.Tensor], part, out, n: int) -> torch.Tensor:
    """Consecutive row pieces' products, each piece's segment sums (`part`) added in order into
    its own rows as soon as they are made: every row's sums are its own, so the pieces change no
    bit, only how often the weight is read (no Partial is kept: a reader gets the rows summed)."""
    m, x = sum(p.shape[0] for p in pieces), pieces[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    r = 0
    for p in pieces:
        _sum(part(p), y[r : r + p.shape[0]])
        r += p.shape[0]
    return y


def _single_rounding(w: QuantizedWeight) -> bool:
    """The weight's quant.single_rounding, computed on its first eager use (it reads the scales
    back); a graph recorded before that runs the fp32 dequantization, the same values."""
    if "single_rounding" in w.__dict__ or not torch.cuda.is_current_stream_capturing():
        return w.single_rounding
    return False


def matmul(
    x: torch.Tensor,
    w: "torch.Tensor | QuantizedWeight",
    book: TileBook | None = None,
    keep: bool = False,
) -> torch.Tensor | Partial:
    """x [M, K] · wᵀ for a dense or packed weight, in the launch shape the tile book picked for
    this product and rows class (the default shape without a book). The plan follows (N, K) alone.
    `keep`: a split form's segment sums are left to the op that reads the product (a Partial)."""
    n, k = w.shape
    if x.shape[0] == 0:  # a pass with no logits rows: nothing to launch, compile or time
        return torch.empty((0, n), dtype=x.dtype, device=x.device)
    packed = isinstance(w, QuantizedWeight)
    plan = LinearPlan.for_weight(n, k, w.group_size if packed else None)
    x = x.contiguous()
    values = w.unpacked(x.dtype) if packed else None  # held: the dequantize-first shape reads it

    def run_on(rows: torch.Tensor, t: Tiles, keep: bool = False) -> torch.Tensor | Partial:
        if packed:
            once = t.hfma and _single_rounding(w)
            return affine_matmul(
                rows, w.packed, w.scales, w.biases, w.bits, w.group_size, plan, tiles=t,
                single_rounding=once, keep=keep, unpacked=values,
            )  # fmt: skip
        return dense_matmul(rows, w, plan, tiles=t, keep=keep)

    m = x.shape[0]
    if book is None:
        return run_on(x, candidates(m, packed)[0], keep)
    key = (rows_class(m), n, k, *((w.bits, w.group_size) if packed else (str(w.dtype),)))
    held = values is not None  # its dequantize-first shape costs less: timed apart
    key += ("held",) if held else ()
    timer, rows = None, timing_rows(m)
    fresh = key not in book.chosen and rows != m
    if fresh and x.is_cuda and not torch.cuda.is_current_stream_capturing():
        probe = x.new_zeros(rows, k)  # the class is timed at its own rows
        timer = lambda t: run_on(probe, t)  # noqa: E731
    t = book.pick(key, m, packed, lambda t: run_on(x, t), timer=timer, held=held)
    return run_on(x, t, keep)
