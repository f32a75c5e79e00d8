"""The gated delta rule on the GPU for every lane of a pass: one per-token recurrence kernel.

One launch runs each lane's rows in order, reading its state at its slot and writing it back there
or to another slot (a verify pass keeps the state it started from; no gather or scatter). A
program owns one (lane, value head, 16-wide V block): the state block [dk, 16] stays in registers
for the lane's whole run, and the next row's q, k, v, gate and beta are loaded (q and k
normalised, the decay taken) while the current row is computed, so a step waits on the state's
own chain of arithmetic, not on memory or on work the state does not decide. The same
kernel and configuration serve prompt and decode rows, and a step's arithmetic never depends on
how many rows the lane brings or on other lanes, so a token's state never depends on its chunk or
its company (registry: chunks of 37 = one call, a lane beside another = alone).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..linear import Partial
from .gates import _beta, _decay
from .launch import pdl, pdl_start
from .segments import _read, pair

BLOCK_V = (
    16  # value columns per program: the whole configuration is fixed (it decides reduction trees)
)
# Launch order only (never arithmetic): True puts a (lane, head)'s value blocks next to each other
# in the grid, so programs running together read neighbouring 64-byte pieces of the state's rows.
BLOCKS_FIRST = True


@triton.jit
def _row(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, r, hk, h, o_k, o_v, stride_q, stride_k, stride_v,
    stride_g, stride_b, stride_sg, stride_sb, a_log, dt, scale, K: tl.constexpr,
    V: tl.constexpr, RAW: tl.constexpr, NSEG: tl.constexpr, OUT: tl.constexpr,
):  # fmt: skip
    """Row r's inputs for value head h, in fp32 (r is always a valid row: no masks needed):
    q and k l2-normalised (q scaled) and the decay exp(g), everything a step takes that the
    state does not decide, so the next row's is ready while this one's state chain runs.
    RAW: g_ptr and beta_ptr hold the gates' inputs a and b (NSEG > 0: their product's segment
    sums, added here), and the gates are computed here with their own kernel's body
    (ops/triton/gates.py), beta rounded to the model dtype OUT as that kernel stores it."""
    r = r.to(tl.int64)
    b_q = tl.load(q_ptr + r * stride_q + hk * K + o_k).to(tl.float32)
    b_k = tl.load(k_ptr + r * stride_k + hk * K + o_k).to(tl.float32)
    b_v = tl.load(v_ptr + r * stride_v + h * V + o_v).to(tl.float32)
    b_g = _read(g_ptr, r, h, True, stride_sg, stride_g, NSEG, OUT).to(tl.float32)
    b_b = _read(beta_ptr, r, h, True, stride_sb, stride_b, NSEG, OUT).to(tl.float32)
    if RAW:
        b_g = _decay(b_g, a_log, dt)
        b_b = _beta(b_b).to(OUT).to(tl.float32)
    b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + 1e-6) * scale  # l2-normalised q, scaled
    b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + 1e-6)
    return b_q, b_k, b_v, tl.exp(b_g), b_b


@triton.jit
def _recurrence(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    alog_ptr,
    dt_ptr,
    o_ptr,
    h_ptr,
    slot_ptr,
    out_ptr,
    cu_ptr,
    stride_q,
    stride_k,
    stride_v,
    stride_g,
    stride_b,
    stride_sg,
    stride_sb,
    stride_o,
    scale,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    BLOCKS_FIRST: tl.constexpr,
    RAW: tl.constexpr,
    NSEG: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    if BLOCKS_FIRST:
        iv, h, i = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    else:
        i, h, iv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos = tl.load(cu_ptr + i).to(tl.int32)
    eos = tl.load(cu_ptr + i + 1).to(tl.int32)
    last = tl.maximum(eos - 1, 0)  # prefetches are clamped to the lane's last row
    hk = h // (HV // HK)  # value head h reads key head h // (HV / HK)
    o_k = tl.arange(0, K)
    o_v = iv * BV + tl.arange(0, BV)
    slot = tl.load(slot_ptr + i).to(tl.int64)
    p_h = h_ptr + (slot * HV + h) * (K * V) + o_k[:, None] * V + o_v[None, :]
    b_h = tl.load(p_h)
    a_log, dt = 0.0, 0.0
    if RAW:
        a_log = tl.load(alog_ptr + h).to(tl.float32)
        dt = tl.load(dt_ptr + h).to(tl.float32)
    b_q, b_k, b_v, b_g, b_b = _row(
        q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, tl.minimum(bos, last), hk, h, o_k, o_v, stride_q,
        stride_k, stride_v, stride_g, stride_b, stride_sg, stride_sb, a_log, dt, scale, K, V, RAW,
        NSEG, o_ptr.dtype.element_ty,
    )  # fmt: skip
    t = bos
    while t < eos:  # a while loop: the lane's bounds are loaded values
        n_q, n_k, n_v, n_g, n_b = _row(
            q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, tl.minimum(t + 1, last), hk, h, o_k, o_v,
            stride_q, stride_k, stride_v, stride_g, stride_b, stride_sg, stride_sb, a_log, dt,
            scale, K, V, RAW, NSEG, o_ptr.dtype.element_ty,
        )  # fmt: skip
        b_h = b_h * b_g  # S ← exp(g) · S (b_g holds the decay exp(g))
        delta = (b_v - tl.sum(b_h * b_k[:, None], 0)) * b_b  # β (v − Sᵀk)
        b_h = b_h + b_k[:, None] * delta[None, :]  # S ← S + k δᵀ
        b_o = tl.sum(b_h * b_q[:, None], 0)  # o = Sᵀq
        tl.store(o_ptr + t.to(tl.int64) * stride_o + h * V + o_v, b_o.to(o_ptr.dtype.element_ty))
        b_q, b_k, b_v, b_g, b_b = n_q, n_k, n_v, n_g, n_b
        t += 1
    out = tl.load(out_ptr + i).to(tl.int64)  # the slot the state is left in (mostly `slot`)
    tl.store(h_ptr + (out * HV + h) * (K * V) + o_k[:, None] * V + o_v[None, :], b_h)


def gated_delta_lanes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | Partial,
    beta: torch.Tensor | Partial,
    states: torch.Tensor,
    slots: torch.Tensor,
    cu_seqlens: torch.Tensor,
    zeroed: bool = False,
    blocks_first: bool = BLOCKS_FIRST,
    writes: torch.Tensor | None = None,
    gate_params: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """q, k [T, Hk, dk], v [T, Hv, dv], g (log-decay), beta [T, Hv]; states [slots, Hv, dk, dv] fp32.

    Rows of lane i are cu_seqlens[i]:cu_seqlens[i+1]; its state is read at states[slots[i]] and
    written to states[writes[i]] (in place if None). Returns o [T, Hv, dv] in v's dtype
    (`zeroed`: rows outside every lane are zeros). With `gate_params` (A_log, dt_bias), g and beta
    are the gates' inputs a and b (rows may be strided; or both of one plan's Partial, their
    segments added where they are read): the gates are computed in the kernel, with the same bits
    as ops.triton.gates.gdn_gates (one launch fewer a layer).
    """
    rows, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    if dk & (dk - 1) or dv & (dv - 1) or hv % hk:
        raise ValueError(
            f"recurrence needs power-of-two head dims and Hv divisible by Hk, got dk={dk} dv={dv} "
            f"Hk={hk} Hv={hv}"
        )
    if not states.is_contiguous() or states.dtype != torch.float32:
        raise ValueError("recurrent states must be contiguous fp32 [slots, Hv, dk, dv]")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(2) != 1 or t.stride(1) != t.shape[2]:
            raise ValueError(f"{name} must have contiguous heads within a row")
    if gate_params is None:
        g = g.float()
        a_log = dt = g  # unread
    elif beta.dtype != v.dtype:  # the kernel rounds beta to the outputs' dtype
        raise ValueError(f"the gates' inputs are {beta.dtype}, the values {v.dtype}")
    else:
        a_log, dt = gate_params
    (g, nseg, sg, rg), (beta, _, sb, rb) = pair(g, beta)
    o = (torch.zeros if zeroed else torch.empty)((rows, hv, dv), dtype=v.dtype, device=v.device)
    bv = min(BLOCK_V, dv)
    lanes = slots.shape[0]
    grid = (dv // bv, hv, lanes) if blocks_first else (lanes, hv, dv // bv)
    _recurrence[grid](
        q, k, v, g, beta, a_log, dt, o, states, slots, slots if writes is None else writes,
        cu_seqlens, q.stride(0), k.stride(0), v.stride(0), rg, rb, sg, sb, o.stride(0),
        dk**-0.5, HK=hk, HV=hv, K=dk, V=dv, BV=bv, BLOCKS_FIRST=blocks_first,
        RAW=gate_params is not None, NSEG=nseg, num_warps=1, num_stages=1, **pdl(q.device),
    )  # fmt: skip
    return o
