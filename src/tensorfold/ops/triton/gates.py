"""The GDN gates and SwiGLU's silu-times-up on the GPU, one program per row (and column
block): a row's arithmetic is the same code whatever else the pass holds.
References: ops.gates.gdn_gates, ops.gates.silu_mul."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..linear import Partial
from .launch import pdl, pdl_start
from .segments import _read, _segment_total, pair


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
    stride_sa,
    stride_sb,
    H: tl.constexpr,
    NSEG: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """NSEG > 0: a and b are products' segment sums, added where they are read."""
    pdl_start(PDL)
    r = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BLOCK)
    mask = o < H
    out = beta_ptr.dtype.element_ty  # the model dtype, the product's own
    a = _read(a_ptr, r, o, mask, stride_sa, stride_a, NSEG, out).to(tl.float32)
    b = _read(b_ptr, r, o, mask, stride_sb, stride_b, NSEG, out).to(tl.float32)
    a_log = tl.load(alog_ptr + o, mask=mask, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + o, mask=mask, other=0.0).to(tl.float32)
    tl.store(g_ptr + r * H + o, _decay(a, a_log, dt), mask=mask)
    tl.store(beta_ptr + r * H + o, _beta(b).to(beta_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _decay(a, a_log, dt):
    """g = -exp(A_log) · softplus(a + dt_bias) in fp32: one body for this kernel and the
    per-token recurrence, which computes its gates where it reads them."""
    z = a + dt
    softplus = tl.where(z > 20.0, z, tl.log(1.0 + tl.exp(z)))  # torch's threshold
    return -tl.exp(a_log) * softplus


@triton.jit
def _beta(b):
    """sigmoid(b) in fp32, before its rounding to the model dtype."""
    return 1.0 / (1.0 + tl.exp(-b))


def gdn_gates(
    a: torch.Tensor | Partial, b: torch.Tensor | Partial, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """As ops.gates.gdn_gates with fp32 g: a, b [rows, Hv] -> g fp32, beta in b's dtype; a and
    b both stored or both of one plan's Partial (`pair`)."""
    (rows, h), dtype = a.shape, b.dtype
    (a, nseg, sa, ra), (b, _, sb, rb) = pair(a, b)
    g = torch.empty((rows, h), dtype=torch.float32, device=a.device)
    beta = torch.empty((rows, h), dtype=dtype, device=b.device)
    _gates[(rows,)](
        a, b, A_log, dt_bias, g, beta, ra, rb, sa, sb, H=h, NSEG=nseg,
        BLOCK=triton.next_power_of_2(h), num_warps=1, **pdl(a.device),
    )  # fmt: skip
    return g, beta


@triton.jit
def _silu_mul(
    g_ptr, u_ptr, y_ptr, W, stride_g, stride_u, stride_sg, stride_su, NSEG: tl.constexpr,
    BLOCK: tl.constexpr, FAULT: tl.constexpr = 0, PDL: tl.constexpr = False,
):  # fmt: skip
    """NSEG 0: gate and up as stored (rows `stride_g` / `stride_u` apart); else their products'
    segment sums (segments `stride_sg` / `stride_su` apart), added in order and rounded to the
    model dtype first, as a product's own sum stores them."""
    pdl_start(PDL)
    r = tl.program_id(0).to(tl.int64)
    o = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = o < W
    if NSEG == 0:
        g = tl.load(g_ptr + r * stride_g + o, mask=mask, other=0.0)
        u = tl.load(u_ptr + r * stride_u + o, mask=mask, other=0.0)
    else:
        out = y_ptr.dtype.element_ty
        g = _segment_total(g_ptr, r, o, mask, stride_sg, stride_g, NSEG, out, FAULT)
        u = _segment_total(u_ptr, r, o, mask, stride_su, stride_u, NSEG, out, FAULT)
    tl.store(y_ptr + r * W + o, _swiglu(g.to(tl.float32), u).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu(g, u):
    """silu(g) · u in fp32 from g (fp32, read from the model dtype) and u (the model dtype): one
    body for this kernel and the expert products' fused gate and up (ops/triton/moe.py)."""
    act = (g / (1.0 + tl.exp(-g))).to(u.dtype)  # silu rounded to the model dtype
    return act.to(tl.float32) * u.to(tl.float32)


def silu_mul(gate, up, fault: int = 0) -> torch.Tensor:
    """As ops.gates.silu_mul; gate and up [rows, W] may be column slices of one product, or of
    its Partial (then their segments are added here; `fault`: the registry's planted forms)."""
    (g, nseg, sg, rg), (u, _, su, ru) = pair(gate, up)
    rows, w = g.shape[-2:]
    y = torch.empty((rows, w), dtype=gate.dtype, device=g.device)
    _silu_mul[(rows, triton.cdiv(w, 2048))](
        g, u, y, w, rg, ru, sg, su, NSEG=nseg, BLOCK=2048, FAULT=fault, num_warps=4,
        **pdl(g.device),
    )  # fmt: skip
    return y
