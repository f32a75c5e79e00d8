"""Paged causal attention on the GPU over fixed super-blocks of keys (docs/exactness.md, 'Attention').

A row's keys are visited in splits of 64 positions from position 0. Each split is closed on its
own (its max, its sum, its weighted values); the splits of a super-block of 256 positions are
folded in order from an empty state, and the super-blocks' results are folded in order into
the row's, all with one merge (`_merge`). Every order-dependent sum of a row is an MMA chain
(the scores, the weighted values, and the row sum as probabilities times ones) and the max is
exact in any order, so a row's bits depend on its query, its keys and its position alone.

A program's rows are packed by GQA: T tokens of one lane times the G query heads of one KV head,
so a K/V block is loaded once for its G heads. Two launch plans compute the one arithmetic:
- serial (prompt passes): a program folds every super-block of its rows in order;
- split (decode, verify, and short chunks over long lanes): one program per (rows, super-block)
  stores that super-block's fp32 (max, sum, weighted values), and a second launch folds them in
  order. A lane's super-blocks past its length exit at once, so the launch a CUDA graph records
  covers the lanes' capacity and serves any lengths.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..attention import KV_SPLIT, SUPER_BLOCK, AttentionTiles
from ..linear import Partial
from .launch import pdl, pdl_start
from .segments import _read

BLOCK_N = KV_SPLIT  # the KV split
WARPS = 4
# Software-pipelining depth of the key loop (loads only: the arithmetic is the same at any depth)
SERIAL_STAGES = 1
SPLIT_STAGES = 2
SERIAL_ROWS = 64  # packed rows a serial program holds
SERIAL_WARPS = 4
SERIAL_COLS = 128  # value columns a serial program holds (at most D): fewer registers than D
SPLIT_ROWS = 16  # packed rows a split program holds
SPLIT_WAVES = 8  # split programs per SM a launch aims at
FOLD_COLS = 64  # value columns a fold program holds (its one row's)
FOLD_WARPS = 1
FOLD_STAGES = 3  # software-pipelining depth of the fold's loop
FOLD_CHUNK = 8  # stored super-blocks a fold step loads at once (the fold is one chain of merges)
# Planted faults, for the registry's controls only (0 in every real launch)
FAULT_LANE_SUM = 1  # a split's row sum reduced across the threads that hold it (follows warps)
FAULT_MERGE_ORDER = 2  # the fold of stored super-blocks in descending order
FAULT_SPLIT_COUNT = 3  # split launches cut a lane into 4 super-blocks whatever its length
PLANTED_BLOCKS = 4


@triton.jit
def _merge(m, l, acc, m_b, l_b, acc_b):
    """Two partial softmaxes of the same rows as one; an empty part (-inf, 0, 0) is an exact
    no-op, and merging into an empty state returns the part exactly."""
    m_new = tl.maximum(m, m_b)
    safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    a = tl.exp(m - safe)
    b = tl.exp(m_b - safe)
    a2 = tl.broadcast_to(a[:, None], acc.shape)
    return m_new, tl.fma(l, a, l_b * b), tl.fma(acc, a2, acc_b * b[:, None])


@triton.jit
def _packed_rows(row0_ptr, rows_ptr, pos0_ptr, tile, y, SUB, GROUP: tl.constexpr, BLOCK_M):
    """Program (tile, y)'s rows: sub-tile y % SUB of the tile's tokens, T = BLOCK_M // GROUP
    tokens times the GROUP query heads of KV head y // SUB (row r: token r // GROUP)."""
    T = BLOCK_M // GROUP
    row0, nrows, pos0 = tl.load(row0_ptr + tile), tl.load(rows_ptr + tile), tl.load(pos0_ptr + tile)
    kvh, tok0 = y // SUB, (y % SUB) * T
    o_m = tl.arange(0, BLOCK_M)
    tok = tok0 + o_m // GROUP
    valid = (o_m < T * GROUP) & (tok < nrows)
    last = pos0 + tl.minimum(nrows, tok0 + T) - 1  # the last position the rows reach
    live = tok0 < nrows
    return kvh, (row0 + tok).to(tl.int64), kvh * GROUP + o_m % GROUP, pos0 + tok, valid, last, live


@triton.jit
def _span(last, SUPER: tl.constexpr, BLOCK_N: tl.constexpr, FAULT: tl.constexpr):
    """Positions of a super-block."""
    if FAULT == 3:  # planted: 4 super-blocks a lane, their size following its length
        return tl.cdiv(last + 1, 4 * BLOCK_N) * BLOCK_N
    return SUPER + 0 * last


@triton.jit
def _split(
    q, k_ptr, v_ptr, kv_ptr, start, last, pos, kvh, stride_kv, scale, ones, cols,
    D: tl.constexpr, BLOCK_N: tl.constexpr, FAULT: tl.constexpr,
):  # fmt: skip
    """One split's (max, sum, weighted values of columns `cols`) from nothing; rows it does not
    reach get (-inf, 0, 0)."""
    o_d = tl.arange(0, D)
    kpos = start + tl.arange(0, BLOCK_N)
    kv_row = tl.load(kv_ptr + kpos, mask=kpos <= last, other=0).to(tl.int64)
    k = tl.load(k_ptr + kv_row[:, None] * stride_kv + kvh * D + o_d[None, :])
    v = tl.load(v_ptr + kv_row[:, None] * stride_kv + kvh * D + cols[None, :])
    s = tl.dot(q, tl.trans(k)) * scale
    s = tl.where(kpos[None, :] <= pos[:, None], s, float("-inf"))
    m_b = tl.max(s, axis=1)
    p = tl.exp(s - tl.where(m_b == float("-inf"), 0.0, m_b)[:, None])
    if FAULT == 1:  # planted: fp32 weights summed in the lanes' tree (follows the warps)
        l_b = tl.sum(p, axis=1)
        p = p.to(v.dtype)
    else:  # the row sum as an MMA chain over the split's keys: one order whatever the warps
        p = p.to(v.dtype)
        l_b = tl.max(tl.dot(p, ones), axis=1)
    return m_b, l_b, tl.dot(p, v)


@triton.jit
def _super_block(
    q, k_ptr, v_ptr, kv_ptr, lo, span, last, pos, kvh, stride_kv, scale, cols,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COLS: tl.constexpr,
    FAULT: tl.constexpr,
):  # fmt: skip
    """The fold of the splits of positions [lo, lo + span) that the rows reach, from empty."""
    ones = tl.full((BLOCK_N, 16), 1.0, v_ptr.dtype.element_ty)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, COLS), tl.float32)
    for start in range(lo, tl.minimum(lo + span, last + 1), BLOCK_N):
        m_b, l_b, o_b = _split(
            q, k_ptr, v_ptr, kv_ptr, start, last, pos, kvh, stride_kv, scale, ones, cols, D,
            BLOCK_N, FAULT,
        )  # fmt: skip
        m, l, acc = _merge(m, l, acc, m_b, l_b, o_b)
    return m, l, acc


@triton.jit
def _finish(
    acc, l, rows, heads, valid, cols, o_ptr, stride_q, g_ptr, stride_gr, stride_gh, stride_gs, D,
    GATED, GSEG,
):  # fmt: skip
    """acc / l rounded, times the output gate's sigmoid rounded as torch rounds them; stored.
    GSEG > 0: the gate is its product's segment sums (`stride_gs` apart), added here."""
    out = (acc / l[:, None]).to(o_ptr.dtype.element_ty)
    if GATED:
        at = g_ptr + rows[:, None] * stride_gr + heads[:, None] * stride_gh
        g = _read(at, 0, cols[None, :], valid[:, None], stride_gs, 0, GSEG, o_ptr.dtype.element_ty)
        g = g.to(tl.float32)
        sig = (1.0 / (1.0 + tl.exp(-g))).to(o_ptr.dtype.element_ty)
        out = (out.to(tl.float32) * sig.to(tl.float32)).to(o_ptr.dtype.element_ty)
    off = rows[:, None] * stride_q + heads[:, None] * D + cols[None, :]
    tl.store(o_ptr + off, out, mask=valid[:, None])


@triton.jit
def _serial_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, row0_ptr, rows_ptr, pos0_ptr, base_ptr, table_ptr, scale,
    stride_q, stride_kv, g_ptr, stride_gr, stride_gh, stride_gs, SUB,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    COLS: tl.constexpr, SUPER: tl.constexpr, GATED: tl.constexpr, FAULT: tl.constexpr,
    GSEG: tl.constexpr = 0, PDL: tl.constexpr = False,
):  # fmt: skip
    """Program (tile, y, c): every super-block of its rows folded in order, for value columns
    [c * COLS, (c + 1) * COLS) (a column's fold is its own; the scores are over all of D)."""
    pdl_start(PDL)
    tile, y, c = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kvh, rows, heads, pos, valid, last, live = _packed_rows(
        row0_ptr, rows_ptr, pos0_ptr, tile, y, SUB, GROUP, BLOCK_M
    )
    o_d = tl.arange(0, D)
    cols = c * COLS + tl.arange(0, COLS)
    q_off = rows[:, None] * stride_q + heads[:, None] * D + o_d[None, :]
    q = tl.load(q_ptr + q_off, mask=valid[:, None], other=0.0)
    kv_ptr = table_ptr + tl.load(base_ptr + tile)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, COLS), tl.float32)
    blocks = tl.where(live, tl.cdiv(last + 1, SUPER), 0)
    for j in range(0, blocks):
        m_j, l_j, acc_j = _super_block(
            q, k_ptr, v_ptr, kv_ptr, j * SUPER, SUPER, last, pos, kvh, stride_kv, scale, cols,
            D, BLOCK_M, BLOCK_N, COLS, FAULT,
        )  # fmt: skip
        m, l, acc = _merge(m, l, acc, m_j, l_j, acc_j)
    if live:
        _finish(
            acc, l, rows, heads, valid, cols, o_ptr, stride_q, g_ptr, stride_gr, stride_gh,
            stride_gs, D, GATED, GSEG,
        )  # fmt: skip


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, row0_ptr, rows_ptr, pos0_ptr, base_ptr, table_ptr, scale,
    stride_q, stride_kv, g_ptr, stride_gr, stride_gh, stride_gs, SUB, part_ptr, ml_ptr, HQ, NSB,
    Z, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SUPER: tl.constexpr, GATED: tl.constexpr, FAULT: tl.constexpr, GSEG: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Program (tile, y, z): super-blocks z, z + Z, ... of its rows, each stored as an fp32 part;
    a lane with one super-block is finished here (merged into empty, exactly the serial fold)."""
    pdl_start(PDL)
    tile, y, z = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kvh, rows, heads, pos, valid, last, live = _packed_rows(
        row0_ptr, rows_ptr, pos0_ptr, tile, y, SUB, GROUP, BLOCK_M
    )
    span = _span(last, SUPER, BLOCK_N, FAULT)
    blocks = tl.where(live, tl.cdiv(last + 1, span), 0)
    if z < blocks:
        o_d = tl.arange(0, D)
        q_off = rows[:, None] * stride_q + heads[:, None] * D + o_d[None, :]
        q = tl.load(q_ptr + q_off, mask=valid[:, None], other=0.0)
        kv_ptr = table_ptr + tl.load(base_ptr + tile)
        for j in range(z, blocks, Z):
            m_j, l_j, acc_j = _super_block(
                q, k_ptr, v_ptr, kv_ptr, j * span, span, last, pos, kvh, stride_kv, scale, o_d,
                D, BLOCK_M, BLOCK_N, D, FAULT,
            )  # fmt: skip
            if blocks == 1:
                m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
                l = tl.zeros((BLOCK_M,), tl.float32)
                acc = tl.zeros((BLOCK_M, D), tl.float32)
                m, l, acc = _merge(m, l, acc, m_j, l_j, acc_j)
                _finish(
                    acc, l, rows, heads, valid, o_d, o_ptr, stride_q, g_ptr, stride_gr,
                    stride_gh, stride_gs, D, GATED, GSEG,
                )  # fmt: skip
            else:
                slot = (rows * HQ + heads) * NSB + j
                tl.store(part_ptr + slot[:, None] * D + o_d[None, :], acc_j, mask=valid[:, None])
                tl.store(ml_ptr + slot * 2, m_j, mask=valid)
                tl.store(ml_ptr + slot * 2 + 1, l_j, mask=valid)


@triton.jit
def _fold_kernel(
    o_ptr, row0_ptr, rows_ptr, pos0_ptr, stride_q, g_ptr, stride_gr, stride_gh, stride_gs,
    part_ptr, ml_ptr, HQ, NSB, TS,
    D: tl.constexpr, BLOCK_N: tl.constexpr, COLS: tl.constexpr, SUPER: tl.constexpr,
    GATED: tl.constexpr, FAULT: tl.constexpr, CHUNK: tl.constexpr, GSEG: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Program (tile, y, c): the stored super-blocks of one row (token y // HQ of the tile, query
    head y % HQ) folded in ascending order, for value columns [c * COLS, (c + 1) * COLS). A row a
    program: the fold is one chain of merges, so chains run side by side rather than padded rows
    in one chain. The merges are those of the split program of TS tokens that stored them (its
    super-blocks past the row's position are empty parts: exact no-ops)."""
    pdl_start(PDL)
    tile, y, c = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row0, nrows, pos0 = tl.load(row0_ptr + tile), tl.load(rows_ptr + tile), tl.load(pos0_ptr + tile)
    tok, head = y // HQ, y % HQ
    last = pos0 + tl.minimum(nrows, (tok // TS) * TS + TS) - 1  # the storing program's reach
    blocks = tl.where(tok < nrows, tl.cdiv(last + 1, _span(last, SUPER, BLOCK_N, FAULT)), 0)
    if blocks > 1:
        o_m = tl.arange(0, 1)
        rows = (row0 + tok + o_m).to(tl.int64)
        heads = head + o_m
        valid = o_m == 0
        cols = c * COLS + tl.arange(0, COLS)
        m = tl.full((1,), float("-inf"), tl.float32)
        l = tl.zeros((1,), tl.float32)
        acc = tl.zeros((1, COLS), tl.float32)
        base = (rows * HQ + heads) * NSB
        for i0 in range(0, blocks, CHUNK):
            # CHUNK stored super-blocks a step, unrolled: their loads do not wait on the fold
            for t in tl.static_range(CHUNK):
                i = i0 + t
                j = i
                if FAULT == 2:  # planted: the fold in descending order
                    j = blocks - 1 - i
                ok = i < blocks
                there = tl.where(ok, valid, False)
                slot = base + j
                m_j = tl.load(ml_ptr + slot * 2, mask=there, other=float("-inf"))
                l_j = tl.load(ml_ptr + slot * 2 + 1, mask=there, other=0.0)
                acc_j = tl.load(
                    part_ptr + slot[:, None] * D + cols[None, :], mask=there[:, None], other=0.0
                )
                m_n, l_n, acc_n = _merge(m, l, acc, m_j, l_j, acc_j)
                m, l, acc = tl.where(ok, m_n, m), tl.where(ok, l_n, l), tl.where(ok, acc_n, acc)
        _finish(
            acc, l, rows, heads, valid, cols, o_ptr, stride_q, g_ptr, stride_gr, stride_gh,
            stride_gs, D, GATED, GSEG,
        )  # fmt: skip


def packed_rows(group: int, block_m: int) -> int:
    """Tokens a program of `block_m` packed rows holds (at least one: a wider group widens it)."""
    return max(1, block_m // group)


def _block_m(group: int, rows: int) -> int:
    return max(rows, triton.next_power_of_2(group))


def sm_count(device: torch.device) -> int:
    """The card's SM count, read once per device (every launch asks)."""
    if device.type != "cuda":
        return 8  # the interpreter's runs on the CPU
    return _sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


PARTIAL_BYTES = 1 << 30  # short chunks over long lanes take the split plan within this


def busy_tiles(tiles: AttentionTiles) -> int:
    """Tiles that carry the work: those that may hold more than one row (a prompt piece's beside
    decoding lanes' single rows), or every tile when none does."""
    return tiles.wide or tiles.row0.shape[0]


def choose_plan(tiles: AttentionTiles, hq: int, d: int, device, rows: int | None = None) -> str:
    """'split' for decode and verify tiles, and for prompt tiles too few to fill the card over
    lanes of more than a few super-blocks (`rows`: the pass's, whose parts the split keeps);
    else 'serial'. The plans compute the same bits, so this choice is free."""
    if tiles.size <= 16:
        return "split"
    n = rows if rows is not None else tiles.row0.shape[0] * tiles.size
    parts = n * hq * triton.cdiv(tiles.keys, SUPER_BLOCK) * (d + 2) * 4
    few = busy_tiles(tiles) * hq < sm_count(device) and tiles.keys > 4 * SUPER_BLOCK
    return "split" if few and parts <= PARTIAL_BYTES else "serial"


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tiles: AttentionTiles,
    scale: float,
    gate: torch.Tensor | Partial | None = None,
    fault: int = 0,
    plan: str | None = None,
    zeroed: bool = False,
) -> torch.Tensor:
    """q [N, Hq, D] (all rows of the pass), caches [S, Hkv, D]; returns [N, Hq, D], times
    sigmoid(gate [N, Hq, D], any row and head strides, or its product's Partial, added here) when
    a gate is given (`zeroed`: rows in no tile are zeros). `plan` forces 'serial' or 'split'
    (checks only); `fault` is a planted fault (the registry's controls)."""
    n, hq, d = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    q = q.contiguous()
    out = torch.zeros_like(q) if zeroed else torch.empty_like(q)
    g, gseg, stride_gs = (q if gate is None else gate), 0, 0
    if isinstance(gate, Partial):  # segment 0's view: the rows' and heads' strides
        g, gseg, stride_gs = gate.sums[0], gate.sums.shape[0], gate.sums.stride(0)
    plan = plan or choose_plan(tiles, hq, d, q.device, n)
    block_m = _block_m(group, SERIAL_ROWS if plan == "serial" else SPLIT_ROWS)
    sub = triton.cdiv(min(tiles.size, tiles.longest), packed_rows(group, block_m))
    grid = (tiles.row0.shape[0], hkv * sub)
    common = (q, k_cache, v_cache, out, tiles.row0, tiles.rows, tiles.pos0, tiles.table_base)
    common += (tiles.kv_rows, scale, q.stride(0), k_cache.stride(0), g, g.stride(0), g.stride(1))
    common += (stride_gs,)
    consts = dict(GROUP=group, D=d, BLOCK_M=block_m, BLOCK_N=BLOCK_N, SUPER=SUPER_BLOCK)
    consts.update(GATED=gate is not None, FAULT=fault, GSEG=gseg, **pdl(q.device))
    if plan == "serial":
        cols = min(SERIAL_COLS, d)
        _serial_kernel[grid + (d // cols,)](
            *common, sub, COLS=cols, **consts, num_warps=SERIAL_WARPS, num_stages=SERIAL_STAGES
        )
        return out
    blocks = triton.cdiv(tiles.keys, SUPER_BLOCK) + (PLANTED_BLOCKS if fault else 0)
    part = torch.empty((n, hq, blocks, d), dtype=torch.float32, device=q.device)
    ml = torch.empty((n, hq, blocks, 2), dtype=torch.float32, device=q.device)
    # the keys' split sized by the tiles with work (other programs past their super-blocks exit)
    waves = triton.cdiv(SPLIT_WAVES * sm_count(q.device), busy_tiles(tiles) * grid[1])
    z = max(1, min(blocks, waves))
    _split_kernel[grid + (z,)](
        *common, sub, part, ml, hq, blocks, z, **consts, num_warps=WARPS, num_stages=SPLIT_STAGES
    )
    if blocks > 1:
        cols = min(FOLD_COLS, d)
        tokens = min(tiles.size, tiles.longest)
        _fold_kernel[(grid[0], tokens * hq, d // cols)](
            out, tiles.row0, tiles.rows, tiles.pos0, q.stride(0), g, g.stride(0), g.stride(1),
            stride_gs, part, ml, hq, blocks, packed_rows(group, block_m), D=d, BLOCK_N=BLOCK_N,
            COLS=cols, SUPER=SUPER_BLOCK, GATED=gate is not None, FAULT=fault, CHUNK=FOLD_CHUNK,
            GSEG=gseg,
            num_warps=FOLD_WARPS, num_stages=FOLD_STAGES, **pdl(q.device),
        )  # fmt: skip
    return out
