"""Small fused kernels of a layer: the GDN conv over every lane with its state, the GDN gates, and
SwiGLU's silu-times-up. One program per row (and channel block); the arithmetic of a row is the
same code whatever else the pass holds, so it is chunk- and company-invariant by construction.
References: ops.conv.causal_conv_lanes, ops.gates.gdn_gates, ops.gates.silu_mul."""

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
    mine = tl.load(slots_ptr + lane)
    tl.store(st_ptr + mine * stride_slot + o_h[:, None] * C + o_c[None, :], rows, mask=ok)


def conv_lanes(
    x: torch.Tensor,
    states: torch.Tensor,
    weight: torch.Tensor,
    slots: torch.Tensor,
    taps: torch.Tensor,
    keep: torch.Tensor,
) -> torch.Tensor:
    """As ops.conv.causal_conv_lanes: silu(causal conv) of every lane's rows; states updated in place."""
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


@triton.jit
def _gates(
    a_ptr,
    b_ptr,
    alog_ptr,
    dt_ptr,
    g_ptr,
    beta_ptr,
    stride_a,
    stride_b,
    H: tl.constexpr,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BLOCK)
    mask = o < H
    a = tl.load(a_ptr + r * stride_a + o, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + r * stride_b + o, mask=mask, other=0.0).to(tl.float32)
    a_log = tl.load(alog_ptr + o, mask=mask, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + o, mask=mask, other=0.0).to(tl.float32)
    z = a + dt
    softplus = tl.where(z > 20.0, z, tl.log(1.0 + tl.exp(z)))  # torch's threshold
    tl.store(g_ptr + r * H + o, -tl.exp(a_log) * softplus, mask=mask)
    tl.store(
        beta_ptr + r * H + o, (1.0 / (1.0 + tl.exp(-b))).to(beta_ptr.dtype.element_ty), mask=mask
    )


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """As ops.gates.gdn_gates with fp32 g: a, b [rows, Hv] -> g fp32, beta in b's dtype."""
    rows, h = a.shape
    if a.stride(1) != 1 or b.stride(1) != 1:
        a, b = a.contiguous(), b.contiguous()
    g = torch.empty((rows, h), dtype=torch.float32, device=a.device)
    beta = torch.empty((rows, h), dtype=b.dtype, device=b.device)
    _gates[(rows,)](
        a,
        b,
        A_log,
        dt_bias,
        g,
        beta,
        a.stride(0),
        b.stride(0),
        H=h,
        BLOCK=triton.next_power_of_2(h),
        num_warps=1,
    )
    return g, beta


@triton.jit
def _silu_mul(g_ptr, u_ptr, y_ptr, W, stride_g, stride_u, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    o = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = o < W
    g = tl.load(g_ptr + r * stride_g + o, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + r * stride_u + o, mask=mask, other=0.0)
    tl.store(y_ptr + r * W + o, _swiglu(g, u).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu(g, u):
    """silu(g) · u in fp32 from g (fp32, read from the model dtype) and u (the model dtype): one
    body for this kernel and the expert products' fused gate and up (ops/triton/moe.py)."""
    act = (g / (1.0 + tl.exp(-g))).to(u.dtype)  # silu rounded to the model dtype
    return act.to(tl.float32) * u.to(tl.float32)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """As ops.gates.silu_mul; gate and up [rows, W] may be column slices of one product."""
    rows, w = gate.shape
    if gate.stride(1) != 1 or up.stride(1) != 1:
        gate, up = gate.contiguous(), up.contiguous()
    y = torch.empty((rows, w), dtype=gate.dtype, device=gate.device)
    _silu_mul[(rows, triton.cdiv(w, 2048))](
        gate, up, y, w, gate.stride(0), up.stride(0), BLOCK=2048, num_warps=4
    )
    return y
