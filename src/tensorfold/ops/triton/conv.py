"""The GDN layer's causal conv on the GPU over every lane with its state: one program per row
and channel block, so a row's arithmetic is the same code whatever else the pass holds.
Reference: ops.conv.causal_conv_lanes."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CONV_BLOCK = 1024


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
    KS: tl.constexpr,
    HIST: tl.constexpr,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    o_c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = o_c < C
    acc = tl.zeros((BLOCK,), tl.float32)
    for j in tl.static_range(KS):
        src = tl.load(taps_ptr + r * KS + j)  # a row of [lanes' states ; this pass's rows]
        in_state = src < LANES_HIST
        # Both candidate rows are read from addresses that always exist; the tap picks one.
        slot = tl.load(slots_ptr + tl.where(in_state, src // HIST, 0))
        old = tl.load(
            st_ptr + slot * stride_slot + tl.where(in_state, src % HIST, 0) * C + o_c,
            mask=mask,
            other=0.0,
        )
        new = tl.load(
            x_ptr + tl.where(in_state, 0, src - LANES_HIST) * stride_x + o_c, mask=mask, other=0.0
        )
        v = tl.where(in_state, old, new).to(tl.float32)
        w = tl.load(w_ptr + o_c * KS + j, mask=mask, other=0.0).to(tl.float32)
        if j == 0:
            acc = w * v
        else:
            acc = acc + w * v
    y = acc / (1.0 + tl.exp(-acc))
    tl.store(y_ptr + r * C + o_c, y.to(y_ptr.dtype.element_ty), mask=mask)


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
    HIST: tl.constexpr,
    HIST_P2: tl.constexpr,
    BLOCK: tl.constexpr,
):
    lane = tl.program_id(0)
    o_c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    o_h = tl.arange(0, HIST_P2)
    src = tl.load(keep_ptr + lane * HIST + o_h, mask=o_h < HIST, other=0)
    in_state = src < LANES_HIST
    ok = (o_h < HIST)[:, None] & (o_c < C)[None, :]
    slot = tl.load(slots_ptr + tl.where(in_state, src // HIST, 0))
    p_old = slot * stride_slot + tl.where(in_state, src % HIST, 0) * C
    old = tl.load(st_ptr + p_old[:, None] + o_c[None, :], mask=ok, other=0.0)
    new = tl.load(
        x_ptr + (tl.where(in_state, 0, src - LANES_HIST) * stride_x)[:, None] + o_c[None, :],
        mask=ok,
        other=0.0,
    )
    rows = tl.where(in_state[:, None], old, new)  # every source is read before any row is written
    mine = tl.load(writes_ptr + lane)
    tl.store(st_ptr + mine * stride_slot + o_h[:, None] * C + o_c[None, :], rows, mask=ok)


def conv_lanes(
    x: torch.Tensor,
    states: torch.Tensor,
    weight: torch.Tensor,
    slots: torch.Tensor,
    taps: torch.Tensor,
    keep: torch.Tensor,
    writes: torch.Tensor | None = None,
) -> torch.Tensor:
    """As ops.conv.causal_conv_lanes: silu(causal conv) of every lane's rows; each lane's state
    written to its `writes` slot (its own if None)."""
    rows, c = x.shape
    lanes, hist = keep.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    y = torch.empty((rows, c), dtype=x.dtype, device=x.device)
    blocks = triton.cdiv(c, CONV_BLOCK)
    _conv_rows[(rows, blocks)](
        x,
        states,
        weight,
        y,
        slots,
        taps,
        c,
        lanes * hist,
        states.stride(0),
        x.stride(0),
        KS=weight.shape[1],
        HIST=hist,
        BLOCK=CONV_BLOCK,
        num_warps=4,
    )
    _conv_keep[(lanes, blocks)](
        x,
        states,
        slots,
        slots if writes is None else writes,
        keep,
        c,
        lanes * hist,
        states.stride(0),
        x.stride(0),
        HIST=hist,
        HIST_P2=triton.next_power_of_2(hist),
        BLOCK=CONV_BLOCK,
        num_warps=4,
    )
    return y
