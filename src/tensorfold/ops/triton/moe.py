"""Grouped expert products on the GPU: each chosen expert's rows through its own weights, over all
the experts a pass chose: one launch for gate and up (writing silu(gate) · up), one for down.

The rows (a row once per expert it chose) are sorted by expert and cut into tiles of one expert
each; a tile's program reduces K with the plan of ops/triton/linear.py for that expert's (N, K)
(every expert of a projection has the same shape, so the same plan): each segment summed from
zero, one tl.dot per K block in order, the segments added in order, rounded once. That is the
whole form of linear.py's products, so a row's bits are those of the same row through that
expert's product alone, whether the expert serves 1 row or 500 (docs/exactness.md, 'Experts').
The tile table is built on the device from the chosen ids (no host sync; one small kernel for a
decode-sized pass): the grid is sized from the row count alone, and tiles past the last expert's
are empty. The gate-and-up launch reads each pair's row of x where it lies (no gathered copy) and
the down launch writes each pair's output at its (row, choice) place (no scatter).

For tiles of at most 16 pairs of 4- or 8-bit experts on Hopper, the tile book may pick the Gluon
form instead (gluon_grouped.py): each segment summed by a program of its own, then `sum_pairs`
adds them in order with the same epilogue; the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..moe import Experts, ExpertStack
from .gates import _swiglu, silu_mul
from .launch import pdl, pdl_start
from .linear import LinearPlan
from .segments import _affine_whole, _dense_whole, _swapped_whole
from .tiles import TileBook, Tiles, grouped_block_m, grouped_candidates

try:  # Gluon: few pairs an expert on Hopper, split over segments (the same sums)
    from . import gluon_grouped
except ImportError:  # an older Triton: the grouped kernel below runs every launch shape
    gluon_grouped = None


@dataclass(frozen=True)
class ExpertTiles:
    """The sorted rows of a pass's (row, expert) pairs and the tiles over them."""

    order: torch.Tensor  # flat slot r·k + j of each sorted pair (by expert, then slot)
    expert: torch.Tensor  # [T] the expert of each tile
    lo: torch.Tensor  # [T] its first sorted pair
    hi: torch.Tensor  # [T] one past its last (hi == lo: an empty tile)
    block_m: int

    @property
    def count(self) -> int:
        return self.expert.shape[0]


# up to this many (row, expert) pairs the table is one launch: a 128-lane decode pass with top-8
# and the shared expert joined (9 choices a row)
TILE_KERNEL_PAIRS = 1152


def expert_tiles(ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertTiles:
    """Tiles of at most block_m pairs of one expert each, ascending expert id, on the device."""
    if ids.numel() <= TILE_KERNEL_PAIRS:
        return tiles_kernel(ids, num_experts, block_m)
    return tiles_torch(ids, num_experts, block_m)


def tiles_torch(ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertTiles:
    """expert_tiles in torch ops (a dozen small launches; the reference of tiles_kernel)."""
    flat = ids.reshape(-1)
    n = flat.shape[0]
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # integer adds: any order, one result
    starts = torch.cumsum(counts, 0) - counts
    ntiles = (counts + block_m - 1) // block_m
    ends = torch.cumsum(ntiles, 0)
    most = min(num_experts, n) + n // block_m  # Σ ceil(c / B) over the chosen experts
    t = torch.arange(most, device=flat.device)
    e = torch.searchsorted(ends, t, right=True).clamp_max(num_experts - 1)
    lo = starts[e] + (t - (ends[e] - ntiles[e])) * block_m
    hi = torch.where(t < ends[-1], torch.minimum(lo + block_m, starts[e] + counts[e]), lo)
    return ExpertTiles(order, e.to(torch.int32), lo.to(torch.int32), hi.to(torch.int32), block_m)


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _min(a, b):
    return tl.minimum(a, b)


@triton.jit
def _tiles_kernel(
    ids_ptr,
    order_ptr,
    sorted_ptr,
    te_ptr,
    lo_ptr,
    hi_ptr,
    P,
    MOST,
    BLOCK_M: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    o = tl.arange(0, BLOCK_P)
    live = o < P
    ids = tl.load(ids_ptr + o, mask=live, other=0).to(tl.int32)
    # (expert, slot) as one key: the sort orders pairs by expert, then slot (a stable sort)
    key = tl.sort(tl.where(live, ids * BLOCK_P + o, 2147483647), 0)
    e, slot = key // BLOCK_P, key % BLOCK_P
    tl.store(order_ptr + o, slot.to(tl.int64), mask=live)
    tl.store(sorted_ptr + o, e, mask=live)
    tl.debug_barrier()  # each pair reads its neighbours' experts back
    prev = tl.load(sorted_ptr + o - 1, mask=live & (o > 0), other=-1)
    after = tl.load(sorted_ptr + o + 1, mask=(o + 1) < P, other=-1)
    start = tl.associative_scan(tl.where(live & (prev != e), o, 0), 0, _max)
    end = tl.associative_scan(tl.where(live & (after != e), o + 1, P), 0, _min, reverse=True)
    first = live & ((o - start) % BLOCK_M == 0)  # a tile starts every BLOCK_M pairs of an expert
    t = tl.cumsum(first.to(tl.int32), 0) - 1
    tl.store(te_ptr + t, e, mask=first)
    tl.store(lo_ptr + t, o, mask=first)
    tl.store(hi_ptr + t, tl.minimum(o + BLOCK_M, end), mask=first)
    o_t = tl.arange(0, BLOCK_T)
    empty = (o_t >= tl.sum(first.to(tl.int32), 0)) & (o_t < MOST)
    zero = tl.zeros((BLOCK_T,), tl.int32)
    tl.store(te_ptr + o_t, zero, mask=empty)
    tl.store(lo_ptr + o_t, zero, mask=empty)
    tl.store(hi_ptr + o_t, zero, mask=empty)


def tiles_kernel(ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertTiles:
    """expert_tiles in one launch of one program (a decode-sized pass): the same table as
    tiles_torch (empty tiles read expert 0 here, never used)."""
    flat = ids.reshape(-1)
    n = flat.shape[0]
    most = min(num_experts, n) + n // block_m
    dev = flat.device
    order = torch.empty(n, dtype=torch.long, device=dev)
    scratch = torch.empty(n, dtype=torch.int32, device=dev)
    e, lo, hi = (torch.empty(most, dtype=torch.int32, device=dev) for _ in range(3))
    if n:
        _tiles_kernel[(1,)](
            flat,
            order,
            scratch,
            e,
            lo,
            hi,
            n,
            most,
            BLOCK_M=block_m,
            BLOCK_P=triton.next_power_of_2(n),
            BLOCK_T=triton.next_power_of_2(most),
            num_warps=4,
            **pdl(dev),
        )
    return ExpertTiles(order, e, lo, hi, block_m)


@triton.jit
def _expert_product(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    e,
    rows,
    o_n,
    M,
    N,
    stride_x,
    stride_we,
    stride_w,
    stride_se,
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
    SWAP: tl.constexpr,
):
    """Rows `rows` of x (those < M) through expert e's matrix: the whole form's fp32 sum (SWAP:
    with the weights on the MMA's wide side, the same sums)."""
    w_e = w_ptr + e * stride_we
    if SWAP:
        s_e, b_e = s_ptr + e * stride_se, b_ptr + e * stride_se
        acc = _swapped_whole(
            x_ptr, w_e, s_e, b_e, rows, o_n, M, N, stride_x, stride_w, stride_s, PACKED,
            BITS, GROUP, GROUPS, SEG, NSEG, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
    elif PACKED:
        s_e, b_e = s_ptr + e * stride_se, b_ptr + e * stride_se
        acc = _affine_whole(
            x_ptr, w_e, s_e, b_e, rows, o_n, M, N, stride_x, stride_w, stride_s,
            BITS, GROUP, GROUPS, SEG, NSEG, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
    else:
        acc = _dense_whole(
            x_ptr, w_e, rows, o_n, M, N, stride_x, stride_w, SEG, NSEG, BLOCK_M, BLOCK_N, BLOCK_K
        )  # fmt: skip
    return acc


@triton.jit
def _grouped_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    w2_ptr,
    s2_ptr,
    b2_ptr,
    y_ptr,
    order_ptr,
    tile_e,
    tile_lo,
    tile_hi,
    N,
    X_ROWS,
    stride_x,
    stride_we,
    stride_w,
    stride_se,
    stride_s,
    stride_y,
    TOP_K: tl.constexpr,
    GATHER: tl.constexpr,
    SCATTER: tl.constexpr,
    SWIGLU: tl.constexpr,
    PACKED: tl.constexpr,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
    SEG: tl.constexpr,
    NSEG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SWAP: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    pid_t, pid_n = tl.program_id(0), tl.program_id(1)
    e = tl.load(tile_e + pid_t).to(tl.int64)
    lo, hi = tl.load(tile_lo + pid_t), tl.load(tile_hi + pid_t)
    if hi > lo:
        o_m = lo + tl.arange(0, BLOCK_M)
        o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        inside = o_m < hi
        if GATHER:  # pair p reads row order[p] // k of x; rows past the tile read nothing (>= M)
            slot = tl.load(order_ptr + o_m, mask=inside, other=0)
            rows, limit = tl.where(inside, slot // TOP_K, X_ROWS), X_ROWS
        else:
            rows, limit = o_m, hi
        acc = _expert_product(
            x_ptr, w_ptr, s_ptr, b_ptr, e, rows, o_n, limit, N, stride_x, stride_we, stride_w,
            stride_se, stride_s, PACKED, BITS, GROUP, GROUPS, SEG, NSEG, BLOCK_M, BLOCK_N, BLOCK_K,
            SWAP,
        )  # fmt: skip
        out = acc.to(y_ptr.dtype.element_ty)
        if SWIGLU:  # up's product; both rounded to the model dtype before silu · up, as unfused
            up = _expert_product(
                x_ptr, w2_ptr, s2_ptr, b2_ptr, e, rows, o_n, limit, N, stride_x, stride_we,
                stride_w, stride_se, stride_s, PACKED, BITS, GROUP, GROUPS, SEG, NSEG, BLOCK_M,
                BLOCK_N, BLOCK_K, SWAP,
            )  # fmt: skip
            u = up.to(y_ptr.dtype.element_ty)
            out = _swiglu(out.to(tl.float32), u).to(y_ptr.dtype.element_ty)
        dest = o_m
        if SCATTER:  # pair p's output goes to its (row, choice) slot
            dest = tl.load(order_ptr + o_m, mask=inside, other=0)
        mask = inside[:, None] & (o_n[None, :] < N)
        tl.store(y_ptr + dest[:, None] * stride_y + o_n[None, :], out, mask=mask)


@triton.jit
def _sum_pairs(
    p_ptr,
    y_ptr,
    order_ptr,
    PAIRS,
    N,
    stride_y,
    NSEG: tl.constexpr,
    SWIGLU: tl.constexpr,
    SCATTER: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Pair p's segment sums added in segment order and rounded once (SWIGLU: gate's and up's,
    each rounded, then silu · up, as the grouped kernel's epilogue), stored at row p (SCATTER:
    at its (row, choice) slot order[p])."""
    pdl_start(PDL)
    p = tl.program_id(0).to(tl.int64)
    o_n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = o_n < N
    width = N
    if SWIGLU:
        width = 2 * N
    row = p_ptr + p * width
    acc = tl.load(row + o_n, mask=mask, other=0.0)
    for s in range(1, NSEG):
        acc += tl.load(row + s * PAIRS * width + o_n, mask=mask, other=0.0)
    out = acc.to(y_ptr.dtype.element_ty)
    if SWIGLU:
        up = tl.load(row + N + o_n, mask=mask, other=0.0)
        for s in range(1, NSEG):
            up += tl.load(row + s * PAIRS * width + N + o_n, mask=mask, other=0.0)
        out = _swiglu(out.to(tl.float32), up.to(y_ptr.dtype.element_ty)).to(y_ptr.dtype.element_ty)
    dest = p
    if SCATTER:
        dest = tl.load(order_ptr + p)
    tl.store(y_ptr + dest * stride_y + o_n, out, mask=mask)


def sum_pairs(
    part: torch.Tensor, order: torch.Tensor, n: int, dtype, swiglu: bool, scatter: bool
) -> torch.Tensor:
    """[pairs, N] in `dtype` from segment sums [NSEG, pairs, N or 2N] (gluon_grouped.partials)."""
    nseg, pairs, _ = part.shape
    y = torch.empty((pairs, n), dtype=dtype, device=part.device)
    block = min(1024, triton.next_power_of_2(n))
    _sum_pairs[(pairs, triton.cdiv(n, block))](
        part, y, order, pairs, n, y.stride(0), NSEG=nseg, SWIGLU=swiglu, SCATTER=scatter,
        BLOCK=block, **pdl(part.device),
    )  # fmt: skip
    return y


def _parts(stack: ExpertStack):
    w = stack.weight.view(torch.int32) if stack.packed else stack.weight
    return (w, stack.scales, stack.biases) if stack.packed else (w, w, w)


def grouped_matmul(
    xs: torch.Tensor,
    stack: ExpertStack,
    tiles: ExpertTiles,
    shape: Tiles | None = None,
    gather_k: int = 0,
    scatter: bool = False,
    up: ExpertStack | None = None,
) -> torch.Tensor:
    """xs [P, K] (pairs sorted by expert) · W_eᵀ per tile -> [P, N] in xs's dtype. gather_k = k:
    xs is x [M, K] and pair p reads row order[p] // k; scatter: pair p's output is written at row
    order[p]; up: the fused gate and up, silu(xs · W_eᵀ) · (xs · U_eᵀ), `stack` the gate.
    `shape`: the launch shape (columns, warps, stages, swapped form), never the arithmetic."""
    t = shape or grouped_candidates(tiles.block_m)[0]
    n, k = stack.shape
    plan = LinearPlan.for_weight(n, k, stack.group_size if stack.packed else None)
    xs = xs.contiguous()
    if up is not None and not _one_format(stack, up):
        raise ValueError("gate and up stacks must have one format and layout")
    if t.gluon and gluon_grouped is not None:
        if gluon_grouped.applies(xs, stack, tiles.block_m, plan.segment, t.staged):
            part = gluon_grouped.partials(xs, stack, tiles, plan.segment, gather_k, up, t.staged)
            return sum_pairs(part, tiles.order, n, xs.dtype, up is not None, scatter)
    y = torch.empty((tiles.order.shape[0], n), dtype=xs.dtype, device=xs.device)
    w, s, b = _parts(stack)
    w2, s2, b2 = _parts(up) if up is not None else (w, s, b)
    groups = max(plan.block_k // stack.group_size, 1) if stack.packed else 1
    grid = (tiles.count, triton.cdiv(n, t.block_n))
    _grouped_kernel[grid](
        xs, w, s, b, w2, s2, b2, y, tiles.order, tiles.expert, tiles.lo, tiles.hi, n, xs.shape[0],
        xs.stride(0), w.stride(0), w.stride(1), s.stride(0), s.stride(1), y.stride(0),
        TOP_K=max(gather_k, 1), GATHER=gather_k > 0, SCATTER=scatter, SWIGLU=up is not None,
        PACKED=stack.packed, BITS=stack.bits or 16, GROUP=stack.group_size or 16, GROUPS=groups,
        SEG=plan.segment, NSEG=plan.segments(k), BLOCK_M=tiles.block_m, BLOCK_N=t.block_n,
        BLOCK_K=plan.block_k, SWAP=t.swap, num_warps=t.warps, num_stages=t.stages,
        **pdl(xs.device),
    )  # fmt: skip
    return y


def expert_swiglu(
    x: torch.Tensor, ids: torch.Tensor, experts: Experts, book: TileBook | None = None
) -> torch.Tensor:
    """[M, k, H]: ops.moe.expert_swiglu's result on the GPU with no host sync: the tile table, the
    gate and up in one grouped launch (silu · up written), down in one writing each (row, choice).
    `book` picks each launch's shape by timing the candidates once (never the arithmetic)."""
    m, k = ids.shape
    tiles = expert_tiles(ids, experts.num_experts, grouped_block_m(m * k))

    def launch(part: str, xs, stack: ExpertStack, **kw) -> torch.Tensor:
        run = lambda t: grouped_matmul(xs, stack, tiles, t, **kw)  # noqa: E731
        if book is None:
            return run(None)
        fmt = (stack.bits, stack.group_size) if stack.packed else (str(stack.weight.dtype),)
        key = ("moe", tiles.block_m, *stack.shape, *fmt, part)
        options = grouped_candidates(tiles.block_m)
        return run(book.pick(key, m * k, stack.packed, run, options))

    if _one_format(experts.gate, experts.up):
        h = launch("gate-up", x, experts.gate, gather_k=k, up=experts.up)
    else:  # a mixed file with gate and up at different bits: two launches and silu_mul
        h = silu_mul(
            launch("gate", x, experts.gate, gather_k=k), launch("up", x, experts.up, gather_k=k)
        )
    return launch("down", h, experts.down, scatter=True).view(m, k, -1)


def _one_format(a: ExpertStack, b: ExpertStack) -> bool:
    same = (a.packed, a.bits, a.group_size, a.weight.stride()) == (
        b.packed,
        b.bits,
        b.group_size,
        b.weight.stride(),
    )
    return same and (not a.packed or a.scales.stride() == b.scales.stride())


def expert_swiglu_unfused(x: torch.Tensor, ids: torch.Tensor, experts: Experts) -> torch.Tensor:
    """The same result in the earlier form (the torch tile table, a gathered copy of x, gate and
    up apart, silu_mul, down, a scatter): the registry's witness that the fused form's bits are
    these."""
    m, k = ids.shape
    tiles = tiles_torch(ids, experts.num_experts, grouped_block_m(m * k))
    xs = x[tiles.order // k]
    h = silu_mul(grouped_matmul(xs, experts.gate, tiles), grouped_matmul(xs, experts.up, tiles))
    y = grouped_matmul(h, experts.down, tiles)
    out = torch.empty_like(y)
    out[tiles.order] = y
    return out.view(m, k, -1)
