"""Grouped expert products on the GPU: each chosen expert's rows through its own weights, in one
launch per projection over all the experts a pass chose.

The rows (a row once per expert it chose) are sorted by expert and cut into tiles of one expert
each; a tile's program reduces K with the plan of ops/triton/linear.py for that expert's (N, K)
(every expert of a projection has the same shape, so the same plan): each segment summed from
zero, one tl.dot per K block in order, the segments added in order, rounded once. That is the
whole form of linear.py's products, so a row's bits are those of the same row through that
expert's product alone, whether the expert serves 1 row or 500 (docs/exactness.md, 'Experts').
The tile table is built on the device from the chosen ids (no host sync): the grid is sized
from the row count alone, and tiles past the last expert's are empty.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..moe import Experts, ExpertStack
from . import fused
from .linear import LinearPlan
from .segments import _affine_whole, _dense_whole


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


def expert_tiles(ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertTiles:
    """Tiles of at most block_m pairs of one expert each, ascending expert id, on the device."""
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
def _grouped_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    y_ptr,
    tile_e,
    tile_lo,
    tile_hi,
    N,
    stride_x,
    stride_we,
    stride_w,
    stride_se,
    stride_s,
    stride_y,
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
    pid_t, pid_n = tl.program_id(0), tl.program_id(1)
    e = tl.load(tile_e + pid_t).to(tl.int64)
    lo, hi = tl.load(tile_lo + pid_t), tl.load(tile_hi + pid_t)
    if hi > lo:
        o_m = lo + tl.arange(0, BLOCK_M)
        o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        w_e = w_ptr + e * stride_we
        if PACKED:
            s_e, b_e = s_ptr + e * stride_se, b_ptr + e * stride_se
            acc = _affine_whole(
                x_ptr,
                w_e,
                s_e,
                b_e,
                o_m,
                o_n,
                hi,
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
        else:
            acc = _dense_whole(
                x_ptr,
                w_e,
                o_m,
                o_n,
                hi,
                N,
                stride_x,
                stride_w,
                SEG,
                NSEG,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
            )
        mask = (o_m[:, None] < hi) & (o_n[None, :] < N)
        tl.store(
            y_ptr + o_m[:, None] * stride_y + o_n[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=mask,
        )


def grouped_matmul(
    xs: torch.Tensor, stack: ExpertStack, tiles: ExpertTiles, block_n: int = 64
) -> torch.Tensor:
    """xs [P, K] (pairs sorted by expert) · W_eᵀ per tile -> [P, N] in xs's dtype."""
    n, k = stack.shape
    plan = LinearPlan.for_weight(n, k, stack.group_size if stack.packed else None)
    xs = xs.contiguous()
    y = torch.empty((xs.shape[0], n), dtype=xs.dtype, device=xs.device)
    w = stack.weight.view(torch.int32) if stack.packed else stack.weight
    s, b = (stack.scales, stack.biases) if stack.packed else (w, w)
    groups = max(plan.block_k // stack.group_size, 1) if stack.packed else 1
    grid = (tiles.count, triton.cdiv(n, block_n))
    _grouped_kernel[grid](
        xs,
        w,
        s,
        b,
        y,
        tiles.expert,
        tiles.lo,
        tiles.hi,
        n,
        xs.stride(0),
        w.stride(0),
        w.stride(1),
        s.stride(0),
        s.stride(1),
        y.stride(0),
        PACKED=stack.packed,
        BITS=stack.bits or 16,
        GROUP=stack.group_size or 16,
        GROUPS=groups,
        SEG=plan.segment,
        NSEG=plan.segments(k),
        BLOCK_M=tiles.block_m,
        BLOCK_N=block_n,
        BLOCK_K=plan.block_k,
        num_warps=4,
        num_stages=3,
    )
    return y


def expert_swiglu(x: torch.Tensor, ids: torch.Tensor, experts: Experts) -> torch.Tensor:
    """[M, k, H]: ops.moe.expert_swiglu's result on the GPU, three grouped products and the
    SwiGLU kernel, with no host sync."""
    m, k = ids.shape
    tiles = expert_tiles(ids, experts.num_experts, 16 if m * k <= 512 else 64)
    xs = x[tiles.order // k]
    h = fused.silu_mul(
        grouped_matmul(xs, experts.gate, tiles), grouped_matmul(xs, experts.up, tiles)
    )
    y = grouped_matmul(h, experts.down, tiles)
    out = torch.empty_like(y)
    out[tiles.order] = y
    return out.view(m, k, -1)
