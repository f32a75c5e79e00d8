"""The chunk form of the gated delta rule, row by row where a pass brings few rows
(`--gdn-form rows`): a decode or verify step computes its new rows only, not the whole chunk.

The same grid chunks of 64 rows and the same boundary state and tail as the grid form
(ops/triton/gated_delta_grid.py), another arithmetic. The chunk's corrected values
V' = (I + A)⁻¹ β (V − Γ K S) are found by substitution instead of an inverse, in 16-row blocks:

    v'_i = β_i (v_i − γ_i Sᵀk_i) − Σ_{j in earlier blocks} A_ij v'_j − Σ_{j<i in i's block} A_ij v'_j

the first sum one product of the block's rows against the chunk's V' so far, the second row by
row in order. Each tail row keeps its v'_j (in the model dtype, in the value columns of its tail
row, where the grid form keeps the raw v), so a step that brings row i reads v'_j for j < i
instead of computing them again. A row is the same sequence of operations in every pass: each
product is a 16-row tile against the chunk's 64 rows (a row's values never depend on the other
rows of its tile), each sum over rows runs the block's 16 or the chunk's 64 in one fixed tree,
and every row past a lane's real ones, or later than the row, meets an exact zero. Outputs are
O = (Γ Q) S + ((Q Kᵀ) ⊙ Γ_i/Γ_j, j ≤ i) V' and the state at a chunk's end
S' = Γ_63 S + (K Γ_63/Γ)ᵀ V', as in the grid form.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...batch import GDNState, LaneIndex
from ..gated_delta import GDNShape
from .gated_delta_grid import _gates, _keep_tail, _normed, _rows, _state, pass_output

EPS = 1e-6  # the l2 norm's epsilon, as ops/norm.py l2_norm
BLOCK_V = 64  # value columns a program
NUM_WARPS = 4  # fixed: the layouts (so reduction trees) of every pass
FAULT_TAIL_SKIPPED = 1  # planted for the checks: a row's in-block sum skips the tail's rows
FAULT_EARLY_STATE = 2  # planted: the boundary state also advances over an unfinished chunk


@triton.jit
def _block(x, b, W: tl.constexpr):
    """Rows 16b .. 16b + 15 of a [64, W] tile as [16, W] (one nonzero term a sum: exact)."""
    pick = (tl.arange(0, 4) == b)[:, None, None]
    return tl.sum(tl.where(pick, tl.reshape(x, (4, 16, W)), 0.0), axis=0)


@triton.jit
def _block_vec(x, b):
    """Entries 16b .. 16b + 15 of a [64] vector (exact)."""
    pick = (tl.arange(0, 4) == b)[:, None]
    return tl.sum(tl.where(pick, tl.reshape(x, (4, 16)), 0.0), axis=0)


@triton.jit
def _put(x, rows, b, W: tl.constexpr):
    """The [64, W] tile x with rows 16b .. 16b + 15 replaced by `rows` [16, W]."""
    pick = (tl.arange(0, 4) == b)[:, None, None]
    return tl.reshape(tl.where(pick, rows[None, :, :], tl.reshape(x, (4, 16, W))), (64, W))


@triton.jit
def _diag16(a, b):
    """Columns 16b .. 16b + 15 of a [16, 64] tile as [16, 16] (exact)."""
    pick = (tl.arange(0, 4) == b)[None, :, None]
    return tl.sum(tl.where(pick, tl.reshape(a, (16, 4, 16)), 0.0), axis=1)


@triton.jit
def _decay(gi, gj, mask):
    """Γ_i/Γ_j [16, 64] for the block's rows i against the chunk's rows j where `mask`, exactly 0
    elsewhere (the masked exponent never overflows)."""
    return tl.where(mask, tl.exp(tl.where(mask, gi[:, None] - gj[None, :], 0.0)), 0.0)


@triton.jit
def _substitute(base, ad, vb, lo, hi, FAULT: tl.constexpr):
    """Rows lo .. hi − 1 of the block's V' [16, BV] in order: v'_i = base_i − Σ_{j<i} ad_ij v'_j,
    each rounded to the model dtype as it is found (a later step reads it as its tail would)."""
    r = tl.arange(0, 16)
    dt = vb.dtype
    v = vb.to(tl.float32)
    if FAULT == 1:  # FAULT_TAIL_SKIPPED: the tail's rows of the block left out of the sums
        v = tl.where((r < lo)[:, None], 0.0, v)
    for i in range(lo, hi):
        at = r == i
        ai = tl.sum(tl.where(at[:, None], ad, 0.0), axis=0)  # [16]: row i of ad
        bi = tl.sum(tl.where(at[:, None], base, 0.0), axis=0)  # [BV]
        vi = (bi - tl.sum(ai[:, None] * v, axis=0)).to(dt).to(tl.float32)
        v = tl.where(at[:, None], vi[None, :], v)
    return v.to(dt)


@triton.jit
def _row_chunks(
    x_ptr, g_ptr, b_ptr, tail_ptr, tg_ptr, rec_ptr, o_ptr,
    slots_ptr, tails_ptr, bounds_ptr, arrivals_ptr, eps, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BV: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """A program per (lane, value head, value block of BV columns). Per chunk the pass reaches:
    the chunk's keys, gates and V' so far (the tail's), then each 16-row block holding new rows:
    their V' by substitution, their outputs; at a whole chunk's end the state there."""
    lane, pid = tl.program_id(0), tl.program_id(1)
    NB: tl.constexpr = DV // BV
    hv, vb = pid // NB, pid % NB
    hk = hv // (HV // HK)
    CONV: tl.constexpr = 2 * HK * DK + HV * DV
    VCOL = 2 * HK * DK + hv * DV + vb * BV  # the block's columns: a pass's v, a tail row's v'
    dt = o_ptr.dtype.element_ty
    slot = tl.load(slots_ptr + lane).to(tl.int64)
    t0 = tl.load(tails_ptr + lane).to(tl.int32)
    row0 = tl.load(bounds_ptr + lane).to(tl.int64)
    total = t0 + (tl.load(bounds_ptr + lane + 1) - row0).to(tl.int32)
    r, rb = tl.arange(0, 64), tl.arange(0, 16)
    o_k, o_v = tl.arange(0, DK), vb * BV + tl.arange(0, BV)
    cols = tl.arange(0, BV)[None, :]
    p_s = _state(rec_ptr, slot, hv, o_k, o_v, HV, DK, DV)
    for c in range(0, tl.cdiv(total, 64)):
        p = c * 64 + r  # positions from the boundary
        real = p < total
        new = real & (p >= t0)
        rows = tl.minimum(total - c * 64, 64)
        xrow = row0 + (p - t0).to(tl.int64)
        trow = slot * 64 + p
        k = _rows(x_ptr, tail_ptr, p, t0, real, xrow, trow, (HK + hk) * DK, CONV, DK)
        k = _normed(k.to(tl.float32), eps).to(dt)
        g, beta = _gates(g_ptr, b_ptr, tg_ptr, p, t0, real, xrow, trow, hv, HV)
        gc = tl.cumsum(g, axis=0)  # log Γ_i
        sd = tl.load(p_s).to(dt)  # [DK, BV]: the state at the chunk's start
        tail = tail_ptr + (slot * 64 + r)[:, None] * CONV + VCOL + cols  # the chunk's places
        vn = tl.load(tail, mask=(p < t0)[:, None], other=0.0)  # [64, BV]: V' found so far
        first = tl.maximum(t0 - c * 64, 0)  # the chunk's first new row
        for b in range(first // 16, tl.cdiv(rows, 16)):
            pb = c * 64 + b * 16 + rb  # the block's rows, read for it alone (fewer registers)
            newb = (pb >= t0) & (pb < total)
            xb = row0 + (pb - t0).to(tl.int64)
            kb = _rows(
                x_ptr, tail_ptr, pb, t0, pb < total, xb, slot * 64 + pb, (HK + hk) * DK, CONV, DK
            )
            kb = _normed(kb.to(tl.float32), eps).to(dt)
            qb = tl.load(x_ptr + xb[:, None] * CONV + hk * DK + o_k[None, :], mask=newb[:, None])
            qb = _normed(qb.to(tl.float32), eps).to(dt)
            vb_ = tl.load(x_ptr + xb[:, None] * CONV + VCOL + cols, mask=newb[:, None], other=0.0)
            gb, betab = _block_vec(gc, b), _block_vec(beta, b)
            a = tl.dot(kb, tl.trans(k)) * _decay(gb, gc, pb[:, None] > p[None, :])
            a = a * betab[:, None]  # A_ij [16, 64]
            sk = tl.dot(kb, sd)  # Sᵀk_i
            base = betab[:, None] * (vb_.to(tl.float32) - tl.exp(gb)[:, None] * sk)
            earlier = tl.where((r < b * 16)[None, :], a, 0.0).to(dt)
            base = tl.where(b > 0, base - tl.dot(earlier, vn), base)
            ad = _diag16(a, b)  # A's diagonal block: the rows of i's own block
            lo = tl.maximum(first - b * 16, 0)
            hi = tl.minimum(rows - b * 16, 16)
            vn = _put(vn, _substitute(base, ad, _block(vn, b, BV), lo, hi, FAULT), b, BV)
            attn = (tl.dot(qb, tl.trans(k)) * _decay(gb, gc, pb[:, None] >= p[None, :])).to(dt)
            o = tl.dot(qb, sd) * tl.exp(gb)[:, None] + tl.dot(attn, vn)
            p_o = o_ptr + (xb[:, None] * HV + hv) * DV + o_v[None, :]
            tl.store(p_o, (o * scale).to(dt), mask=newb[:, None])
        ends = rows == 64
        if FAULT == 2:  # FAULT_EARLY_STATE
            ends = rows > 0
        if ends:  # S' = Γ_63 S + (K Γ_63/Γ)ᵀ V'
            last = tl.sum(tl.where(r == rows - 1, gc, 0.0), axis=0)
            carried = (vn.to(tl.float32) * tl.where(real, tl.exp(last - gc), 0.0)[:, None]).to(dt)
            tl.store(p_s, tl.load(p_s) * tl.exp(last) + tl.dot(tl.trans(k), carried))
        else:  # the unfinished chunk's new rows keep their v' (this program's columns alone)
            tl.store(tail, vn, mask=new[:, None])
        tl.debug_barrier()  # the next chunk reads the state other threads wrote
    # New tail rows in places another program may still read (the old tail's, reused past a
    # boundary) wait for the last program to arrive; any others are written at once, each head's
    # part by one of its programs (a decode step waits for no other program)
    if (t0 > 0) & (total > 64) & (total % 64 > 0):
        before = tl.atomic_add(arrivals_ptr + lane, 1, sem="acq_rel")
        if before == HV * NB - 1:  # the last of the lane's programs: every head's keys, gates
            tl.store(arrivals_ptr + lane, 0)
            _keep_tail(
                x_ptr, g_ptr, b_ptr, tail_ptr, tg_ptr, slot, t0, total, row0, CONV, HV, 2 * HK * DK
            )
    elif vb == 0:
        _own_tail(x_ptr, g_ptr, b_ptr, tail_ptr, tg_ptr, slot, t0, total, row0, hv, hk,
                  hv % (HV // HK) == 0, CONV, HK, HV, DK)  # fmt: skip


@triton.jit
def _own_tail(
    x_ptr, g_ptr, b_ptr, tail_ptr, tg_ptr, slot, t0, total, row0, hv, hk, keys,
    CONV: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr,
):  # fmt: skip
    """A value head's part of its lane's new tail rows: their gates, and where `keys` (its key
    head's first value head) that key head's q and k (no step reads a tail row's q, but a
    lane's fingerprint hashes its tail rows whole, so they never hold a slot's old values)."""
    d = tl.arange(0, DK)
    for p in range(tl.maximum(t0, total // 64 * 64), total):
        src, dst = row0 + (p - t0), slot * 64 + p % 64
        if keys:
            for part in tl.static_range(2):
                at = (part * HK + hk) * DK + d
                tl.store(tail_ptr + dst * CONV + at, tl.load(x_ptr + src * CONV + at))
        tl.store(tg_ptr + dst * (2 * HV) + hv, tl.load(g_ptr + src * HV + hv).to(tl.float32))
        beta = tl.load(b_ptr + src * HV + hv).to(tl.float32)
        tl.store(tg_ptr + dst * (2 * HV) + HV + hv, beta)


def rows_lanes(
    x,
    g,
    beta,
    states: GDNState,
    s: GDNShape,
    lanes: LaneIndex,
    fault: int = 0,
    block_v: int | None = None,
) -> torch.Tensor:
    """Every lane of a pass (x = [q | k | v] as the conv left them); o [n, Hv, dv] in x's dtype.
    One launch: the slot's boundary state advances, the new tail rows keep their keys, gates and
    v' inside the kernel. `block_v` other than BLOCK_V is for the benchmarks only (the value
    block's width decides the layouts, so the reduction trees)."""
    dk, dv = s.k_head_dim, s.v_head_dim
    o = pass_output(x, states, s, lanes, "rows")
    n, hv, count = x.shape[0], s.num_v_heads, lanes.slots.shape[0]
    bv = min(block_v or BLOCK_V, dv)
    if n and count:
        _row_chunks[(count, hv * (dv // bv))](
            x.contiguous(), g.contiguous(), beta.contiguous(), states.tail, states.tail_gates,
            states.recurrent, o, lanes.slots, lanes.tails, lanes.cu_seqlens, states.arrivals,
            EPS, dk**-0.5, s.num_k_heads, hv, dk, dv, bv, fault, num_warps=NUM_WARPS,
        )  # fmt: skip
    return o
