"""The GDN layer's causal conv on the GPU over every lane with its state. Many rows: one program
per row and channel block, then one per lane and block that writes the lane's kept rows; a few
rows a lane (decode, verify): one launch, a program per lane and block computing the lane's rows
as one tile with the same body, then its kept rows. An element's arithmetic is the same code
whatever else the pass holds or the tile's shape, so both launch forms give the same bits.
Reference: ops.conv.causal_conv_lanes."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..linear import Partial
from .launch import pdl, pdl_start
from .segments import _read, operand

CONV_BLOCK = 1024
# channels a program of the one-launch form (a lane's rows one tile): small, so that one lane's
# pass spreads over the card (a launch shape only: an element's sum is the same at any block)
LANE_BLOCK = 64
LANE_WARPS = 2  # launch shape only: an element's sum is the same whatever the warps
FUSE_ROWS = 8  # the most rows a lane for the one-launch form: decode and verify passes


@triton.jit
def _conv_tile(
    x_ptr, st_ptr, w_ptr, y_ptr, slots_ptr, taps_ptr, r, live, o_c, C, LANES_HIST, stride_slot,
    stride_x, stride_xs, KS: tl.constexpr, HIST: tl.constexpr, NSEG: tl.constexpr,
):  # fmt: skip
    """Rows r (a vector; `live` masks those past the lane's end) for channels o_c: each element
    the fixed KS-term sum in fp32, then silu, the same expression whatever the tile's shape. Every
    row's taps are loaded together, so a tile of rows waits on one chain of loads, not one a row.
    NSEG > 0: x is the in-projection's segment sums (segments `stride_xs` apart)."""
    mask = live[:, None] & (o_c < C)[None, :]
    acc = tl.zeros(mask.shape, tl.float32)
    for j in tl.static_range(KS):
        src = tl.load(taps_ptr + r * KS + j, mask=live, other=0)  # [lanes' states ; rows]
        in_state = src < LANES_HIST
        # Both candidate rows are read from addresses that always exist; the tap picks one.
        slot = tl.load(slots_ptr + tl.where(in_state, src // HIST, 0))
        p_old = slot * stride_slot + tl.where(in_state, src % HIST, 0) * C
        old = tl.load(st_ptr + p_old[:, None] + o_c[None, :], mask=mask, other=0.0)
        src_x = tl.where(in_state, 0, src - LANES_HIST)[:, None]
        new = _read(
            x_ptr, src_x, o_c[None, :], mask, stride_xs, stride_x, NSEG, y_ptr.dtype.element_ty
        )
        v = tl.where(in_state[:, None], old, new).to(tl.float32)
        w = tl.load(w_ptr + o_c * KS + j, mask=o_c < C, other=0.0).to(tl.float32)[None, :]
        if j == 0:
            acc = w * v
        else:
            acc = acc + w * v
    y = acc / (1.0 + tl.exp(-acc))
    tl.store(y_ptr + r[:, None] * C + o_c[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _keep_rows(
    x_ptr, st_ptr, slots_ptr, writes_ptr, keep_ptr, lane, o_c, C, LANES_HIST, stride_slot,
    stride_x, stride_xs, HIST: tl.constexpr, HIST_P2: tl.constexpr, NSEG: tl.constexpr,
):  # fmt: skip
    """The lane's next conv state for channels o_c, written to its `writes` slot (the state is
    in the model dtype: x's rows as the rows' outputs read them)."""
    o_h = tl.arange(0, HIST_P2)
    src = tl.load(keep_ptr + lane * HIST + o_h, mask=o_h < HIST, other=0)
    in_state = src < LANES_HIST
    ok = (o_h < HIST)[:, None] & (o_c < C)[None, :]
    slot = tl.load(slots_ptr + tl.where(in_state, src // HIST, 0))
    p_old = slot * stride_slot + tl.where(in_state, src % HIST, 0) * C
    old = tl.load(st_ptr + p_old[:, None] + o_c[None, :], mask=ok, other=0.0)
    src_x = tl.where(in_state, 0, src - LANES_HIST)[:, None]
    new = _read(x_ptr, src_x, o_c[None, :], ok, stride_xs, stride_x, NSEG, st_ptr.dtype.element_ty)
    rows = tl.where(in_state[:, None], old, new)
    tl.debug_barrier()  # every source is read, by every thread, before any row is written
    mine = tl.load(writes_ptr + lane)
    tl.store(st_ptr + mine * stride_slot + o_h[:, None] * C + o_c[None, :], rows, mask=ok)


@triton.jit
def _conv_rows(
    x_ptr,
    st_ptr,
    w_ptr,
    y_ptr,
    slots_ptr,
    taps_ptr,
    C,
    LANES_HIST,
    stride_slot,
    stride_x,
    stride_xs,
    KS: tl.constexpr,
    HIST: tl.constexpr,
    NSEG: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    r = tl.program_id(0).to(tl.int64) + tl.arange(0, 1)  # a tile of one row
    o_c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    _conv_tile(
        x_ptr, st_ptr, w_ptr, y_ptr, slots_ptr, taps_ptr, r, r >= 0, o_c, C, LANES_HIST,
        stride_slot, stride_x, stride_xs, KS, HIST, NSEG,
    )  # fmt: skip


@triton.jit
def _conv_keep(
    x_ptr,
    st_ptr,
    slots_ptr,
    writes_ptr,
    keep_ptr,
    C,
    LANES_HIST,
    stride_slot,
    stride_x,
    stride_xs,
    HIST: tl.constexpr,
    HIST_P2: tl.constexpr,
    NSEG: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    lane = tl.program_id(0)
    o_c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    _keep_rows(
        x_ptr, st_ptr, slots_ptr, writes_ptr, keep_ptr, lane, o_c, C, LANES_HIST, stride_slot,
        stride_x, stride_xs, HIST, HIST_P2, NSEG,
    )  # fmt: skip


@triton.jit
def _conv_lane(
    x_ptr, st_ptr, w_ptr, y_ptr, slots_ptr, writes_ptr, taps_ptr, keep_ptr, cu_ptr, C,
    LANES_HIST, stride_slot, stride_x, stride_xs, KS: tl.constexpr, HIST: tl.constexpr,
    HIST_P2: tl.constexpr, NSEG: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """One launch: lane `program_id(0)`'s rows (at most ROWS) as one tile, then its kept rows."""
    pdl_start(PDL)
    lane = tl.program_id(0)
    o_c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    r = tl.load(cu_ptr + lane).to(tl.int64) + tl.arange(0, ROWS)
    end = tl.load(cu_ptr + lane + 1)
    _conv_tile(
        x_ptr, st_ptr, w_ptr, y_ptr, slots_ptr, taps_ptr, r, r < end, o_c, C, LANES_HIST,
        stride_slot, stride_x, stride_xs, KS, HIST, NSEG,
    )  # fmt: skip
    tl.debug_barrier()  # the rows read the lane's state before its kept rows overwrite it
    _keep_rows(
        x_ptr, st_ptr, slots_ptr, writes_ptr, keep_ptr, lane, o_c, C, LANES_HIST, stride_slot,
        stride_x, stride_xs, HIST, HIST_P2, NSEG,
    )  # fmt: skip


def conv_lanes(
    x: torch.Tensor | Partial,
    states: torch.Tensor,
    weight: torch.Tensor,
    slots: torch.Tensor,
    taps: torch.Tensor,
    keep: torch.Tensor,
    writes: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    most_rows: int = 0,
) -> torch.Tensor:
    """As ops.conv.causal_conv_lanes: silu(causal conv) of every lane's rows; each lane's state
    written to its `writes` slot (its own if None). With the lanes' row bounds `cu_seqlens` and
    at most FUSE_ROWS rows a lane (`most_rows`, known to the host), one launch; else two. `x` may
    be the in-projection's Partial: its segments are added where each row is read."""
    (rows, c), dtype = x.shape, x.dtype
    lanes, hist = keep.shape
    x, nseg, stride_xs, stride_x = operand(x)
    y = torch.empty((rows, c), dtype=dtype, device=x.device)
    shared = (c, lanes * hist, states.stride(0), stride_x, stride_xs)
    out = slots if writes is None else writes
    hist_p2 = triton.next_power_of_2(hist)
    if cu_seqlens is not None and 0 < most_rows <= FUSE_ROWS:
        grid = (lanes, triton.cdiv(c, LANE_BLOCK))
        _conv_lane[grid](
            x, states, weight, y, slots, out, taps, keep, cu_seqlens, *shared, KS=weight.shape[1],
            HIST=hist, HIST_P2=hist_p2, NSEG=nseg, BLOCK=LANE_BLOCK,
            ROWS=triton.next_power_of_2(most_rows), num_warps=LANE_WARPS, **pdl(x.device),
        )  # fmt: skip
        return y
    blocks = triton.cdiv(c, CONV_BLOCK)
    _conv_rows[(rows, blocks)](
        x, states, weight, y, slots, taps, *shared, KS=weight.shape[1], HIST=hist,
        NSEG=nseg, BLOCK=CONV_BLOCK, num_warps=4, **pdl(x.device),
    )  # fmt: skip
    _conv_keep[(lanes, blocks)](
        x, states, slots, out, keep, *shared, HIST=hist, HIST_P2=hist_p2, NSEG=nseg,
        BLOCK=CONV_BLOCK, num_warps=4, **pdl(x.device),
    )  # fmt: skip
    return y
