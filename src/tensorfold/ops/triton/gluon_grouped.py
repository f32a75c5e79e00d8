"""Grouped expert products of few pairs an expert (an MoE model's decode and verify passes) in
the Gluon kernel of gluon_affine.py: one program per (expert tile, weight tile, segment), the
expert's weights on the MMA's wide side and the tile's pairs (at most 16) on its narrow side,
each segment's fp32 sum stored at its pair's row. `moe.sum_pairs` then adds a pair's segments in
order and rounds once (and, for the fused gate and up, rounds both and takes silu · up), so a
pair's bits are those of the whole form of moe.py's grouped kernel: the same MMAs chained in the
same K order from zero, the same segments added in the same order (docs/exactness.md, 'Experts').

Split over segments and weight tiles, a decode step's eight experts fill the card: at the
35B-A3B's gate and up (512 × 2,048 each) 8 experts × 16 weight tiles × 2 segments = 256 programs,
where moe.py's kernel runs one program per (expert, column block) over the whole K.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..moe import ExpertStack
from . import gluon_affine
from .gluon_affine import BN, STEP_K, _swapped_body, _x_layout
from .gluon_tiles import _pdl_start
from .launch import pdl


@gluon.jit
def _grouped_swapped(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    w2_ptr,
    s2_ptr,
    b2_ptr,
    p_ptr,
    order_ptr,
    tile_e,
    tile_lo,
    tile_hi,
    PAIRS,
    N,
    stride_x,
    stride_we,
    stride_w,
    stride_se,
    stride_s,
    TOP_K: gl.constexpr,
    GATHER: gl.constexpr,
    UP: gl.constexpr,
    BITS: gl.constexpr,
    GROUP: gl.constexpr,
    SEG: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    MT: gl.constexpr,
    X_LAYOUT: gl.constexpr,
    FAULT: gl.constexpr,
    STAGED: gl.constexpr,
    num_warps: gl.constexpr,
    PDL: gl.constexpr = False,
):
    """Expert tile pid_t's pairs through weight tile pid_n, segment pid_s of its expert (UP: the
    tiles past gate's are up's, their sums stored beside gate's in a row of 2N)."""
    _pdl_start(PDL)
    pid_t, pid_n, pid_s = gl.program_id(0), gl.program_id(1), gl.program_id(2)
    e = gl.load(tile_e + pid_t).to(gl.int64)
    lo = gl.load(tile_lo + pid_t)
    hi = gl.load(tile_hi + pid_t)
    if hi > lo:  # tiles past the last expert's are empty
        p_row = pid_s * PAIRS + lo
        if UP:
            blocks = (N + BN - 1) // BN
            if pid_n < blocks:
                _swapped_body(
                    x_ptr, order_ptr, lo, hi - lo, w_ptr + e * stride_we, s_ptr + e * stride_se,
                    b_ptr + e * stride_se, p_ptr, p_row, 2 * N, N, stride_x, stride_w, stride_s,
                    pid_n, pid_s, TOP_K, GATHER, BITS, GROUP, SEG, BN, BK, MT, X_LAYOUT, FAULT,
                    STAGED, num_warps,
                )  # fmt: skip
            else:
                _swapped_body(
                    x_ptr, order_ptr, lo, hi - lo, w2_ptr + e * stride_we, s2_ptr + e * stride_se,
                    b2_ptr + e * stride_se, p_ptr + N, p_row, 2 * N, N, stride_x, stride_w,
                    stride_s, pid_n - blocks, pid_s, TOP_K, GATHER, BITS, GROUP, SEG, BN, BK, MT,
                    X_LAYOUT, FAULT, STAGED, num_warps,
                )  # fmt: skip
        else:
            _swapped_body(
                x_ptr, order_ptr, lo, hi - lo, w_ptr + e * stride_we, s_ptr + e * stride_se,
                b_ptr + e * stride_se, p_ptr, p_row, N, N, stride_x, stride_w, stride_s, pid_n,
                pid_s, TOP_K, GATHER, BITS, GROUP, SEG, BN, BK, MT, X_LAYOUT, FAULT, STAGED,
                num_warps,
            )  # fmt: skip


MOST_PAIRS = 16  # pairs a tile may hold: the MMA's narrow side


def applies(
    xs: torch.Tensor, stack: ExpertStack, block_m: int, segment: int, staged: bool = False
) -> bool:
    """Whether the Gluon kernel runs these grouped products: packed 4- or 8-bit experts (the widths
    the MoE registry checks on the card), tiles of at most 16 pairs, and what gluon_affine's kernel
    needs (bf16 rows, whole steps, Hopper)."""
    return (
        stack.packed
        and stack.bits in (4, 8)
        and block_m <= MOST_PAIRS
        and gluon_affine.fits(xs, stack.bits, stack.shape[1], segment, staged)
    )


def partials(
    xs: torch.Tensor,
    stack: ExpertStack,
    tiles,
    segment: int,
    gather_k: int = 0,
    up: ExpertStack | None = None,
    staged: bool = False,
    fault: int = 0,
) -> torch.Tensor:
    """Segment sums [K / segment, pairs, N] in fp32 of every pair through its expert (`up`: gate's
    and up's side by side, [.., 2N]); gather_k, tiles: as moe.grouped_matmul's; `fault`: the
    registry's planted controls (gluon_affine.partials)."""
    words = stack.weight.view(torch.int32)
    e, n, _ = words.shape
    k = xs.shape[1]
    nseg = k // segment
    pairs = tiles.order.shape[0]
    two = up is not None
    part = torch.empty((nseg, pairs, (2 if two else 1) * n), dtype=torch.float32, device=xs.device)
    w2, s2, b2 = (up.weight.view(torch.int32), up.scales, up.biases) if two else (words, stack.scales, stack.biases)  # fmt: skip
    mt = 8 if tiles.block_m <= 8 else 16
    bk = STEP_K[stack.bits]
    grid = (tiles.count, (2 if two else 1) * triton.cdiv(n, BN), nseg)
    _grouped_swapped[grid](
        xs, words, stack.scales, stack.biases, w2, s2, b2, part, tiles.order, tiles.expert,
        tiles.lo, tiles.hi, pairs, n, xs.stride(0), words.stride(0), words.stride(1),
        stack.scales.stride(0), stack.scales.stride(1), TOP_K=max(gather_k, 1),
        GATHER=gather_k > 0, UP=two, BITS=stack.bits, GROUP=stack.group_size, SEG=segment, BN=BN,
        BK=bk, MT=mt, X_LAYOUT=_x_layout(mt, bk), FAULT=fault, STAGED=staged, num_warps=4,
        **pdl(xs.device),
    )  # fmt: skip
    return part
