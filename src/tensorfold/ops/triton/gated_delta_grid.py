"""The chunk form of the gated delta rule in one launch a layer (`--gdn-form grid`).

The same grid chunks of 64 rows as ops/gated_delta.py `chunk` (its CPU reference): a lane's rows
since its last boundary (the tail kept in its slot) go before its new rows, and each chunk is
computed in the chunked (WY) form from the state at its start. Unlike the `chunk` form's GPU path
(fla's seven kernels and the index work around them), one kernel does everything a pass needs:
a program owns a lane, a value head and one or more value blocks, and walks the lane's chunks in
order, assembling each chunk's rows from the tail and the pass, normalising q and k, writing the
new rows' outputs and, at each whole chunk's end, the state there over the slot's; the last of a
lane's programs to finish writes its new tail.

Prompt rows, decode rows and verify rows all run this kernel with this configuration, so a row is
the same sequence of operations in every pass. What a row of a chunk reads is causal: the
triangular solve substitutes each diagonal block's rows in order, so when it reaches row i the
later rows are still the identity's, whatever rows the pass holds, and joins the blocks with
products of lower-triangular factors; every product that mixes rows multiplies the later ones by
exact zeros (masked before the product); rows past a lane's real ones load as zeros. The
arithmetic is ours, not fla's: its bits differ from the `chunk` form's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...batch import GDNState, LaneIndex
from ..gated_delta import GDNShape, grid_kernel_refuses

EPS = 1e-6  # the l2 norm's epsilon, as ops/norm.py l2_norm
BLOCK_V = 64  # value columns a block (at 32, Triton 3.6 faults on a card: docs/exactness.md)
NUM_WARPS = 4  # fixed: the layouts (so reduction trees) of every pass; beat 8 at every size
FAULT_TAIL_SOLVED = 1  # planted for the checks: a partial chunk's solve skips the tail's rows
FAULT_EARLY_STATE = 2  # planted: the boundary state also advances over an unfinished chunk


@triton.jit
def _rows(
    x_ptr, tail_ptr, p, t0, real, xrow, trow, col, CONV: tl.constexpr, W: tl.constexpr
):  # fmt: skip
    """[64, W] columns col.. of the chunk's rows: from the tail (p < t0) or the pass, else 0."""
    o = col + tl.arange(0, W)[None, :]
    from_x = (real & (p >= t0))[:, None]
    a = tl.load(x_ptr + xrow[:, None] * CONV + o, mask=from_x, other=0.0)
    b = tl.load(tail_ptr + trow[:, None] * CONV + o, mask=(p < t0)[:, None], other=0.0)
    return tl.where(from_x, a, b)


@triton.jit
def _gates(g_ptr, b_ptr, tg_ptr, p, t0, real, xrow, trow, hv, HV: tl.constexpr):
    """The chunk's log-decays and betas [64] in fp32 (0 past the lane's rows)."""
    from_x = real & (p >= t0)
    g = tl.load(g_ptr + xrow * HV + hv, mask=from_x, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + xrow * HV + hv, mask=from_x, other=0.0).to(tl.float32)
    tg = tl.load(tg_ptr + trow * (2 * HV) + hv, mask=p < t0, other=0.0)
    tb = tl.load(tg_ptr + trow * (2 * HV) + HV + hv, mask=p < t0, other=0.0)
    return tl.where(from_x, g, tg), tl.where(from_x, b, tb)


@triton.jit
def _normed(x, eps):
    """x [64, DK] l2-normalised per row in fp32."""
    return x * tl.rsqrt(tl.sum(x * x, axis=1) + eps)[:, None]


@triton.jit
def _state(rec_ptr, slot, hv, o_k, o_v, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr):
    """Pointers [DK, BV] of a program's block of its lane's boundary state."""
    return rec_ptr + ((slot * HV + hv) * DK + o_k[:, None]) * DV + o_v[None, :]


@triton.jit
def _decay(gc, mask):
    """Γ_i/Γ_j = exp(log Γ_i − log Γ_j) where `mask`, exactly 0 elsewhere (never overflows)."""
    return tl.where(mask, tl.exp(tl.where(mask, gc[:, None] - gc[None, :], 0.0)), 0.0)


@triton.jit
def _diagonal_blocks(a):
    """The four 16 × 16 blocks on the diagonal of a [64, 64] tensor, as [4, 16, 16] (each sum
    has one nonzero term, so it is exact)."""
    b = tl.arange(0, 4)
    blocks = tl.permute(tl.reshape(a, (4, 16, 4, 16)), (0, 2, 1, 3))  # [row block, col block, ..]
    same = (b[:, None] == b[None, :])[:, :, None, None]
    return tl.sum(tl.where(same, blocks, 0.0), axis=1)


@triton.jit
def _block_diagonal(d):
    """[64, 64] with the [4, 16, 16] blocks d on its diagonal, zeros elsewhere."""
    b = tl.arange(0, 4)
    same = (b[:, None] == b[None, :])[:, :, None, None]
    wide = tl.where(same, tl.broadcast_to(d[:, None, :, :], (4, 4, 16, 16)), 0.0)
    return tl.reshape(tl.permute(wide, (0, 2, 1, 3)), (64, 64))


@triton.jit
def _inverse(a):
    """(I + a)⁻¹ of a strictly lower [64, 64] a. Each 16 × 16 diagonal block by forward
    substitution, its rows in order (row i = e_i − Σ_{j<i} a_ij · row j: when row i is solved the
    later rows are still the identity's); then, with D those inverses and L a's part below them,
    (I + a)⁻¹ = (I + D L)⁻¹ D = D − N (D − N (D − N D)) for N = D L, as N⁴ = 0. Every product
    multiplies lower-triangular factors: a row reads only rows at or above it."""
    r = tl.arange(0, 16)
    eye = (r[:, None] == r[None, :]).to(tl.float32)[None, :, :]
    blocks = _diagonal_blocks(a)  # [4, 16, 16]
    inv = tl.broadcast_to(eye, (4, 16, 16))
    for i in range(1, 16):
        at_i = (r == i)[None, :, None]
        ai = tl.sum(tl.where(at_i, blocks, 0.0), axis=1)  # [4, 16]: row i of each block
        row = tl.sum(ai[:, :, None] * inv, axis=1)
        inv = tl.where(at_i, eye - row[:, None, :], inv)
    d = _block_diagonal(inv)
    rb = tl.arange(0, 64) // 16
    n = tl.dot(d, tl.where(rb[:, None] > rb[None, :], a, 0.0), input_precision="tf32")
    x = d - tl.dot(n, d, input_precision="tf32")
    x = d - tl.dot(n, x, input_precision="tf32")
    return d - tl.dot(n, x, input_precision="tf32")


@triton.jit
def _keep_tail(
    x_ptr, g_ptr, b_ptr, tail_ptr, tg_ptr, slot, t0, total, row0,
    CONV: tl.constexpr, HV: tl.constexpr, COLS: tl.constexpr,
):  # fmt: skip
    """The pass's rows in the lane's unfinished chunk become its tail rows (slot · 64 + place):
    their first COLS columns (all CONV here; the rows form keeps its own v' past the keys), with
    their log-decays and betas in fp32."""
    cols = tl.arange(0, 1024)
    heads = tl.arange(0, triton.next_power_of_2(HV))
    for p in range(tl.maximum(t0, total // 64 * 64), total):
        src, dst = row0 + (p - t0), slot * 64 + p % 64
        for c in tl.static_range(0, COLS, 1024):
            m = c + cols < COLS
            row = tl.load(x_ptr + src * CONV + c + cols, mask=m)
            tl.store(tail_ptr + dst * CONV + c + cols, row, mask=m)
        m = heads < HV
        g = tl.load(g_ptr + src * HV + heads, mask=m).to(tl.float32)
        b = tl.load(b_ptr + src * HV + heads, mask=m).to(tl.float32)
        tl.store(tg_ptr + dst * (2 * HV) + heads, g, mask=m)
        tl.store(tg_ptr + dst * (2 * HV) + HV + heads, b, mask=m)


@triton.jit
def _value_block(
    x_ptr, tail_ptr, rec_ptr, o_ptr, p, t0, real, xrow, trow, slot, hv, vb, ends, scale,
    inv, w, q, k, attn, gc, gamma, beta, last, CONV: tl.constexpr, HK: tl.constexpr,
    HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """One value block's part of a chunk: V' = U − W S, the outputs of the rows the pass brought,
    and, where the chunk ends, the state at its end written over the slot's."""
    dt = o_ptr.dtype.element_ty
    o_k, o_v = tl.arange(0, DK), vb * BV + tl.arange(0, BV)
    p_s = _state(rec_ptr, slot, hv, o_k, o_v, HV, DK, DV)
    s = tl.load(p_s)  # [DK, BV] fp32: the state at the chunk's start
    v = _rows(x_ptr, tail_ptr, p, t0, real, xrow, trow, 2 * HK * DK + hv * DV + vb * BV, CONV, BV)
    u = tl.dot(inv, (v.to(tl.float32) * beta[:, None]).to(dt))
    v_new = (u - tl.dot(w, s.to(dt))).to(dt)  # V' = U − W S
    o = tl.dot(q, s.to(dt)) * gamma[:, None] + tl.dot(attn, v_new)
    p_o = o_ptr + (xrow[:, None] * HV + hv) * DV + o_v[None, :]
    tl.store(p_o, (o * scale).to(dt), mask=(real & (p >= t0))[:, None])
    if ends:  # the state at the chunk's end: S' = Γ_63 S + (K Γ_63/Γ)ᵀ V'
        carried = (v_new.to(tl.float32) * tl.where(real, tl.exp(last - gc), 0.0)[:, None]).to(dt)
        tl.store(p_s, s * tl.exp(last) + tl.dot(tl.trans(k), carried))


@triton.jit
def _grid_chunks(
    x_ptr, g_ptr, b_ptr, tail_ptr, tg_ptr, rec_ptr, o_ptr,
    slots_ptr, tails_ptr, bounds_ptr, arrivals_ptr, eps, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BV: tl.constexpr, SUB: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """A program per (lane, value head, group of SUB value blocks of BV columns): the chunk's
    value-independent part (q, k, the solve, W, the attention within the chunk) once, then each
    of its value blocks. The slot's state is read at each chunk's start and written at each
    whole chunk's end, so it advances to the lane's last boundary and no further."""
    lane, pid = tl.program_id(0), tl.program_id(1)
    GROUPS: tl.constexpr = DV // (BV * SUB)
    hv, grp = pid // GROUPS, pid % GROUPS
    hk = hv // (HV // HK)
    CONV: tl.constexpr = 2 * HK * DK + HV * DV
    dt = o_ptr.dtype.element_ty
    slot = tl.load(slots_ptr + lane).to(tl.int64)
    t0 = tl.load(tails_ptr + lane).to(tl.int32)
    row0 = tl.load(bounds_ptr + lane).to(tl.int64)
    total = t0 + (tl.load(bounds_ptr + lane + 1) - row0).to(tl.int32)
    r = tl.arange(0, 64)
    for c in range(0, tl.cdiv(total, 64)):
        below, upto = r[:, None] > r[None, :], r[:, None] >= r[None, :]
        p = c * 64 + r  # positions from the boundary
        real = p < total
        rows = tl.minimum(total - c * 64, 64)
        xrow = row0 + (p - t0).to(tl.int64)
        trow = slot * 64 + p
        # in the order that keeps the fewest [64, ·] tiles live (the kernel runs near its registers)
        k = _rows(x_ptr, tail_ptr, p, t0, real, xrow, trow, (HK + hk) * DK, CONV, DK)
        k = _normed(k.to(tl.float32), eps).to(dt)
        g, beta = _gates(g_ptr, b_ptr, tg_ptr, p, t0, real, xrow, trow, hv, HV)
        gc = tl.cumsum(g, axis=0)  # log Γ_i
        a = tl.dot(k, tl.trans(k)) * _decay(gc, below) * beta[:, None]
        if FAULT == 1:  # FAULT_TAIL_SOLVED: the tail's rows of a partial chunk left out
            a = tl.where(((p < t0) & (rows < 64))[:, None], 0.0, a)
        inv = _inverse(a).to(dt)
        gamma = tl.exp(gc)
        w = tl.dot(inv, (k.to(tl.float32) * (beta * gamma)[:, None]).to(dt)).to(dt)
        q = _rows(x_ptr, tail_ptr, p, t0, real, xrow, trow, hk * DK, CONV, DK)
        q = _normed(q.to(tl.float32), eps).to(dt)
        attn = (tl.dot(q, tl.trans(k)) * _decay(gc, upto)).to(dt)
        ends = rows == 64
        if FAULT == 2:  # FAULT_EARLY_STATE
            ends = rows > 0
        last = tl.sum(tl.where(r == rows - 1, gc, 0.0), axis=0)  # log Γ of the chunk's last row
        for j in tl.static_range(SUB):
            _value_block(
                x_ptr, tail_ptr, rec_ptr, o_ptr, p, t0, real, xrow, trow, slot, hv,
                grp * SUB + j, ends, scale, inv, w, q, k, attn, gc, gamma, beta, last,
                CONV, HK, HV, DK, DV, BV,
            )  # fmt: skip
        tl.debug_barrier()  # the next chunk reads the state other threads wrote
    # The lane's tail rows may be rewritten only once all its programs have read them: the last
    # to arrive (its count and every earlier one's ordered after their loads) writes them all.
    before = tl.atomic_add(arrivals_ptr + lane, 1, sem="acq_rel")
    if before == HV * GROUPS - 1:
        tl.store(arrivals_ptr + lane, 0)  # the next pass counts from zero
        _keep_tail(x_ptr, g_ptr, b_ptr, tail_ptr, tg_ptr, slot, t0, total, row0, CONV, HV, CONV)


def pass_output(x, states: GDNState, s: GDNShape, lanes: LaneIndex, form: str) -> torch.Tensor:
    """The outputs [n, Hv, dv] a pass of our chunk kernels writes, after naming what they cannot
    run: the layer's shape, rows of another width, a pool without arrival counts for its lanes."""
    refused = grid_kernel_refuses(s)
    if refused:
        raise ValueError(refused)
    if x.shape[-1] != 2 * s.key_dim + s.value_dim:
        raise ValueError(f"rows of {x.shape[-1]} values, not the layer's q | k | v")
    count = lanes.slots.shape[0]
    if states.arrivals is None or count > states.arrivals.shape[0]:
        raise ValueError(f"the {form} form needs a pool's arrival counts for {count} lanes")
    # every row of a pass belongs to a lane and is written, unless a graph pads a lane's rows
    shape = (x.shape[0], s.num_v_heads, s.v_head_dim)
    return (torch.zeros if lanes.padded else torch.empty)(shape, dtype=x.dtype, device=x.device)


def grid_lanes(
    x,
    g,
    beta,
    states: GDNState,
    s: GDNShape,
    lanes: LaneIndex,
    fault: int = 0,
    block_v: int | None = None,
    num_warps: int | None = None,
    blocks_per_program: int = 1,
) -> torch.Tensor:
    """Every lane of a pass (x = [q | k | v] as the conv left them); o [n, Hv, dv] in x's dtype.
    One launch: the slot's boundary state advances and the rows of each lane's unfinished chunk
    become its tail inside the kernel. A program computes a chunk's value-independent part once
    for `blocks_per_program` value blocks of `block_v` columns: more blocks a program, fewer
    programs and less repeated work (many lanes), fewer a program, more of the card for few lanes.
    Values other than the defaults (BLOCK_V, NUM_WARPS, read at the call) are for the benchmarks
    only until a card shows their bits equal (the warps decide reduction trees)."""
    dk, dv = s.k_head_dim, s.v_head_dim
    o = pass_output(x, states, s, lanes, "grid")
    n, hv, count = x.shape[0], s.num_v_heads, lanes.slots.shape[0]
    bv, num_warps = min(block_v or BLOCK_V, dv), num_warps or NUM_WARPS
    per = min(blocks_per_program, dv // bv)
    if n and count:
        _grid_chunks[(count, hv * (dv // (bv * per)))](
            x.contiguous(), g.contiguous(), beta.contiguous(), states.tail, states.tail_gates,
            states.recurrent, o, lanes.slots, lanes.tails, lanes.cu_seqlens, states.arrivals,
            EPS, dk**-0.5, s.num_k_heads, hv, dk, dv, bv, per, fault, num_warps=num_warps,
        )  # fmt: skip
    return o
