"""The gated delta rule on the GPU in grid chunks of 64 rows: fla's chunk kernels, pinned.

Each lane's rows since its last grid boundary (its tail, kept in the state slot) are put before
its new rows, and the lane's rows run through fla's chunked (WY) forward from its boundary state
(ops/gated_delta.py has the design and its CPU reference). fla's chunk kernel computes a row from
its chunk's start state and the chunk's rows up to itself only (measured, docs/exactness.md): the
rows past a lane's last real row, padding or leftovers, never reach a real row. A call that ends on
a boundary hands back that boundary's fp32 state, so a pass runs in two calls: the lanes' whole
chunks (their last boundary's state comes back), then the rows of their unfinished chunks from it.

Two layouts, the same kernels and configurations: an eager pass packs the lanes' rows with
`cu_seqlens` (host lengths); a CUDA-graph pass of `lanes` × `rows` uses one padded chunk pair per
lane, its tail length read on the device, so nothing in it depends on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...batch import CHUNK, GDNState
from ..gated_delta import GDNShape
from .gated_delta_fla import chunk_forward

EPS = 1e-6  # the l2 norm's epsilon, as ops/norm.py l2_norm
FAULT_HALVES = 1  # planted for the checks: q and k's squares summed in two halves


@triton.jit
def _assemble(
    x_ptr, g_ptr, b_ptr, tail_ptr, tgates_ptr, src_x, src_tail,
    q_ptr, k_ptr, v_ptr, go_ptr, bo_ptr, eps,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    FAULT: tl.constexpr,
):  # fmt: skip
    """One row of the packed sequence from the pass's row `src_x` or the tail row `src_tail`
    (-1: none, the row is zeros): q and k l2-normed per head in fp32 and rounded to the model
    dtype, v, g and beta copied. One program per row, one fixed layout: a row's bits never depend
    on the other rows. FAULT == FAULT_HALVES (planted only) sums the squares in two halves."""
    r = tl.program_id(0).to(tl.int64)
    xi, ti = tl.load(src_x + r), tl.load(src_tail + r)
    conv: tl.constexpr = 2 * HK * DK + HV * DV
    xr, tr = xi, ti  # -1: no source
    xi, ti = tl.maximum(xi, 0), tl.maximum(ti, 0)
    o_qk = tl.arange(0, 2 * HK)[:, None] * DK + tl.arange(0, DK)[None, :]
    qk = tl.load(x_ptr + xi * conv + o_qk, mask=(o_qk * 0 + xr) >= 0, other=0.0).to(tl.float32)
    qk += tl.load(tail_ptr + ti * conv + o_qk, mask=(o_qk * 0 + tr) >= 0, other=0.0).to(tl.float32)
    if FAULT == 1:  # FAULT_HALVES
        half = (tl.arange(0, DK) < DK // 2)[None, :]
        lo = tl.sum(tl.where(half, qk * qk, 0.0), axis=1)
        ss = lo + tl.sum(tl.where(half, 0.0, qk * qk), axis=1)
    else:
        ss = tl.sum(qk * qk, axis=1)
    qk = qk * tl.rsqrt(ss + eps)[:, None]
    head = tl.arange(0, 2 * HK)[:, None]
    dst = r * (HK * DK) + (head % HK) * DK + tl.arange(0, DK)[None, :]
    tl.store(q_ptr + dst, qk.to(q_ptr.dtype.element_ty), mask=head < HK)
    tl.store(k_ptr + dst, qk.to(k_ptr.dtype.element_ty), mask=head >= HK)
    o_v = tl.arange(0, HV * DV)
    v = tl.load(x_ptr + xi * conv + 2 * HK * DK + o_v, mask=(o_v * 0 + xr) >= 0, other=0.0)
    v += tl.load(tail_ptr + ti * conv + 2 * HK * DK + o_v, mask=(o_v * 0 + tr) >= 0, other=0.0)
    tl.store(v_ptr + r * (HV * DV) + o_v, v)
    o_h = tl.arange(0, HV)
    g = tl.load(g_ptr + xi * HV + o_h, mask=(o_h * 0 + xr) >= 0, other=0.0).to(tl.float32)
    g += tl.load(tgates_ptr + ti * (2 * HV) + o_h, mask=(o_h * 0 + tr) >= 0, other=0.0)
    beta = tl.load(b_ptr + xi * HV + o_h, mask=(o_h * 0 + xr) >= 0, other=0.0).to(tl.float32)
    beta += tl.load(tgates_ptr + ti * (2 * HV) + HV + o_h, mask=(o_h * 0 + tr) >= 0, other=0.0)
    tl.store(go_ptr + r * HV + o_h, g)
    tl.store(bo_ptr + r * HV + o_h, beta)


def assemble(x, g, beta, states: GDNState, s: GDNShape, src_x, src_tail, fault: int = 0):
    """fla's inputs [1, T, H, d] / [1, T, Hv] of a packed sequence whose row i is the pass's row
    src_x[i] or the tail row src_tail[i] (flat slot · 64 + row)."""
    t, dev = src_x.shape[0], x.device
    q = torch.empty(1, t, s.num_k_heads, s.k_head_dim, dtype=x.dtype, device=dev)
    k, v = (
        torch.empty_like(q),
        torch.empty(1, t, s.num_v_heads, s.v_head_dim, dtype=x.dtype, device=dev),
    )
    gg = torch.empty(1, t, s.num_v_heads, dtype=torch.float32, device=dev)
    bb = torch.empty_like(gg)
    if t:
        _assemble[(t,)](
            x, g, beta, states.tail, states.tail_gates, src_x, src_tail, q, k, v, gg, bb, EPS,
            s.num_k_heads, s.num_v_heads, s.k_head_dim, s.v_head_dim, fault, num_warps=4,
        )  # fmt: skip
    return q, k, v, gg, bb


@dataclass(frozen=True)
class LanePlan:
    """An eager pass's GDN bookkeeping, from host lengths (built once per pass, shared by layers).
    Per lane its rows from its boundary are split into whole chunks (part A) and the unfinished
    chunk's rows (part B); the packed sequence holds all parts A, then all parts B."""

    src_x: torch.Tensor  # [packed] the pass row of each packed row, or -1
    src_tail: torch.Tensor  # [packed] its tail row (slot * 64 + row), or -1
    new_dst: torch.Tensor  # [n] the packed row of each row of the pass
    rows_a: int  # packed rows of parts A
    rows_b: int
    cu_a: torch.Tensor  # [lanes_a + 1] boundaries of parts A within the packed rows
    chunks_a: torch.Tensor  # [chunks, 2] fla's chunk indices of parts A
    offsets_a: torch.Tensor  # [lanes_a + 1] fla's chunk offsets of parts A
    slots_a: torch.Tensor  # [lanes_a] their state slots
    cu_b: torch.Tensor  # same for parts B, within the packed rows after rows_a
    chunks_b: torch.Tensor
    offsets_b: torch.Tensor
    slots_b: torch.Tensor
    b_from_a: torch.Tensor  # [lanes_b] index into A's final states, or -1: the slot's state
    keep_x: torch.Tensor  # [·] pass rows that become tail rows
    keep_dst: torch.Tensor  # [·] the tail row (slot * 64 + row) each goes to

    @classmethod
    def build(cls, lanes: list[tuple[int, int, int]], device) -> LanePlan:
        """lanes: (slot, start position, rows) per lane, in the pass's row order."""
        total_a = sum(((start % CHUNK + n) // CHUNK) * CHUNK for _, start, n in lanes)
        parts_a, parts_b, src, new_dst, keep_x, keep_dst = [], [], {}, [], [], []
        pos_a, pos_b, row0 = 0, total_a, 0
        for slot, start, n in lanes:
            t0 = start % CHUNK
            whole = ((t0 + n) // CHUNK) * CHUNK
            rest = t0 + n - whole
            packed = list(range(pos_a, pos_a + whole)) + list(range(pos_b, pos_b + rest))
            for i in range(t0):
                src[packed[i]] = (-1, slot * CHUNK + i)
            for i in range(n):
                src[packed[t0 + i]] = (row0 + i, -1)
            new_dst += packed[t0:]
            # the unfinished chunk's rows from this pass (its earlier rows are in place)
            first = max(whole, t0)
            keep_x += [row0 + i - t0 for i in range(first, t0 + n)]
            keep_dst += [slot * CHUNK + i - whole for i in range(first, t0 + n)]
            if whole:
                parts_a.append((slot, whole))
            if rest:
                parts_b.append((slot, rest, len(parts_a) - 1 if whole else -1))
            pos_a, pos_b, row0 = pos_a + whole, pos_b + rest, row0 + n
        as_t = lambda v: torch.tensor(v, dtype=torch.long).to(device, non_blocking=True)  # noqa: E731
        cu_a, ch_a, off_a = _fla_index([n for _, n in parts_a])
        cu_b, ch_b, off_b = _fla_index([n for _, n, _ in parts_b])
        order = [src[i] for i in range(pos_b)]
        return cls(
            as_t([a for a, _ in order]), as_t([b for _, b in order]), as_t(new_dst),
            total_a, pos_b - total_a,
            as_t(cu_a), as_t(ch_a).view(-1, 2), as_t(off_a), as_t([s for s, _ in parts_a]),
            as_t(cu_b), as_t(ch_b).view(-1, 2), as_t(off_b), as_t([s for s, _, _ in parts_b]),
            as_t([a for _, _, a in parts_b]), as_t(keep_x), as_t(keep_dst),
        )  # fmt: skip


def _fla_index(lengths: list[int]) -> tuple[list[int], list[int], list[int]]:
    """cu_seqlens, chunk indices (sequence, chunk) and chunk offsets of packed sequences."""
    cu, chunks, offsets = [0], [], [0]
    for i, n in enumerate(lengths):
        cu.append(cu[-1] + n)
        count = -(-n // CHUNK)
        chunks += [x for c in range(count) for x in (i, c)]
        offsets.append(offsets[-1] + count)
    return cu, chunks, offsets


def _keep_tail(states: GDNState, x, g, beta, rows, dst) -> None:
    """The pass rows `rows` become the tail rows `dst` (flat slot · 64 + row)."""
    conv, hv = x.shape[-1], g.shape[-1]
    states.tail.view(-1, conv).index_copy_(0, dst, x[rows])
    gates = torch.stack([g[rows].to(states.tail_gates.dtype), beta[rows].to(g.dtype)], dim=1)
    states.tail_gates.view(-1, 2, hv).index_copy_(0, dst, gates)


def eager_lanes(
    x, g, beta, states: GDNState, s: GDNShape, plan: LanePlan, fault: int = 0
) -> torch.Tensor:
    """An eager pass: the packed parts A, then parts B from A's boundary states."""
    q, k, v, gg, bb = assemble(x, g, beta, states, s, plan.src_x, plan.src_tail, fault)
    o = torch.empty_like(v[0])
    rec, final_a = states.recurrent, None
    if plan.rows_a:
        a = slice(0, plan.rows_a)
        ins = (t[:, a] for t in (q, k, v, gg, bb))
        out, final_a = chunk_forward(
            *ins, rec[plan.slots_a], plan.cu_a, plan.chunks_a, plan.offsets_a
        )
        o[a] = out[0]
    if plan.rows_b:
        b = slice(plan.rows_a, plan.rows_a + plan.rows_b)
        h0 = rec[plan.slots_b]
        if final_a is not None:
            from_a = (plan.b_from_a >= 0)[:, None, None, None]
            h0 = torch.where(from_a, final_a[plan.b_from_a.clamp(min=0)], h0)
        ins = (t[:, b].contiguous() for t in (q, k, v, gg, bb))
        out, _ = chunk_forward(*ins, h0, plan.cu_b, plan.chunks_b, plan.offsets_b)
        o[b] = out[0]
    if final_a is not None:
        rec.index_copy_(0, plan.slots_a, final_a)
    _keep_tail(states, x, g, beta, plan.keep_x, plan.keep_dst)
    return o[plan.new_dst]


def _lane_sources(slots, tails, rows: int, span: int):
    """src_x / src_tail of a graph pass's padded layout, on the device."""
    lanes, dev = slots.shape[0], slots.device
    r = torch.arange(span, device=dev)[None, :]
    t = tails[:, None]
    lane = torch.arange(lanes, device=dev)[:, None]
    from_x = (r >= t) & (r < t + rows)
    src_x = torch.where(from_x, lane * rows + r - t, -1)
    src_tail = torch.where(r < t, slots[:, None] * CHUNK + r, -1)
    return src_x.view(-1), src_tail.view(-1)


def _padded_call(q, k, v, g, beta, h0, lanes: int):
    """One chunk of 64 rows per lane, as packed sequences: the eager passes' kernel variant,
    every index built on the device."""
    dev = q.device
    cu = torch.arange(lanes + 1, device=dev) * CHUNK
    chunks = torch.stack([torch.arange(lanes, device=dev), cu[:-1] * 0], dim=1)
    return chunk_forward(q, k, v, g, beta, h0, cu, chunks, torch.arange(lanes + 1, device=dev))


def graph_lanes(x, g, beta, states: GDNState, s: GDNShape, slots, tails, rows: int) -> torch.Tensor:
    """A pass of len(slots) lanes of `rows` rows each (rows ≤ 64), every shape fixed: each lane's
    tail and rows fill a padded pair of chunks (one when rows == 1) at the tail length `tails`
    [lanes] read on the device; the first chunk runs from the boundary state, the second from the
    first's end, and the boundary state advances where the lane's rows reach past 64. Rows past a
    lane's real ones are zeros: no real row reads them."""
    lanes, span = slots.shape[0], CHUNK * (1 if rows == 1 else 2)
    src_x, src_tail = _lane_sources(slots, tails, rows, span)
    ins = [
        t.view(lanes, span, *t.shape[2:]) for t in assemble(x, g, beta, states, s, src_x, src_tail)
    ]
    h0 = states.recurrent[slots]
    first = [t[:, :CHUNK].flatten(0, 1)[None].contiguous() for t in ins]
    out, final = _padded_call(*first, h0, lanes)
    out = out.view(lanes, CHUNK, *out.shape[2:])
    if span > CHUNK:
        second = [t[:, CHUNK:].flatten(0, 1)[None].contiguous() for t in ins]
        out2, _ = _padded_call(*second, final, lanes)
        out = torch.cat([out, out2.view(lanes, CHUNK, *out2.shape[2:])], dim=1)
    reach = tails + rows  # the lane's rows from its boundary
    crossed = (reach >= CHUNK)[:, None, None, None]
    states.recurrent.index_copy_(0, slots, torch.where(crossed, final, h0))
    # each new row at its place in the lane's chunk (rows ≤ 64: no two share a place)
    step = torch.arange(rows, device=x.device)[None, :]
    place = (tails[:, None] + step).view(-1)
    rows_of = torch.arange(x.shape[0], device=x.device)
    _keep_tail(states, x, g, beta, rows_of, slots.repeat_interleave(rows) * CHUNK + place % CHUNK)
    packed = (torch.arange(lanes, device=x.device) * span).repeat_interleave(rows) + place
    return out.reshape(lanes * span, *out.shape[2:])[packed]


def gated_delta_lanes(x, g, beta, states: GDNState, shape: GDNShape, lanes) -> torch.Tensor:
    """Every lane of a pass (x = [q | k | v] as the conv left them); o [n, Hv, dv] in x's dtype."""
    if lanes.gdn is not None:
        return eager_lanes(x, g, beta, states, shape, lanes.gdn)
    rows = x.shape[0] // lanes.slots.shape[0]
    return graph_lanes(x, g, beta, states, shape, lanes.slots, lanes.tails, rows)
