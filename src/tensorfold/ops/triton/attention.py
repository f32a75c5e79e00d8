"""Paged causal attention on the GPU with a fixed KV split (docs/exactness.md, 'Attention').

One program owns a tile of consecutive query rows of one lane and one query head (16 rows in
decode passes, 64 in passes with a long lane), and walks the lane's keys in splits of BLOCK_N
positions, in order. Each split is reduced on its own (its max, its sum, its weighted values) and
merged into the running result; a split past a row's position merges as an exact no-op. Every
order-dependent sum of a row is an MMA chain over the split's keys (the scores, the weighted
values, and the row sum as probabilities times ones); the max is exact in any order. So a row's
bits do not depend on the tile's rows or on how the warps share it: not on the row's company, its
chunk, or whether it is a prompt or a decode row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..attention import KV_SPLIT, AttentionTiles

BLOCK_N = KV_SPLIT  # the KV split
WARPS = 4


@triton.jit
def _attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    row0_ptr,
    rows_ptr,
    pos0_ptr,
    base_ptr,
    table_ptr,
    scale,
    stride_q,
    stride_kv,
    g_ptr,
    stride_g_row,
    stride_g_head,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GATED: tl.constexpr,
    LANE_SUM: tl.constexpr = False,
):
    tile, h = tl.program_id(0), tl.program_id(1)
    kvh = h // GROUP
    row0, nrows = tl.load(row0_ptr + tile), tl.load(rows_ptr + tile)
    pos0, base = tl.load(pos0_ptr + tile), tl.load(base_ptr + tile)
    o_m, o_d = tl.arange(0, BLOCK_M), tl.arange(0, D)
    valid = o_m < nrows
    rows = (row0 + o_m).to(tl.int64)
    pos = pos0 + o_m
    q = tl.load(
        q_ptr + rows[:, None] * stride_q + h * D + o_d[None, :], mask=valid[:, None], other=0.0
    )
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    ones = tl.full((BLOCK_N, 16), 1.0, v_ptr.dtype.element_ty)
    last = pos0 + nrows - 1
    start = 0
    while start <= last:
        kpos = start + tl.arange(0, BLOCK_N)
        kv_row = tl.load(table_ptr + base + kpos, mask=kpos <= last, other=0).to(tl.int64)
        k = tl.load(k_ptr + kv_row[:, None] * stride_kv + kvh * D + o_d[None, :])
        v = tl.load(v_ptr + kv_row[:, None] * stride_kv + kvh * D + o_d[None, :])
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(kpos[None, :] <= pos[:, None], s, float("-inf"))
        m_b = tl.max(s, axis=1)
        m_b_safe = tl.where(m_b == float("-inf"), 0.0, m_b)
        p = tl.exp(s - m_b_safe[:, None])
        if LANE_SUM:  # planted fault only: fp32 weights summed in the lanes' tree (follows warps)
            l_b = tl.sum(p, axis=1)
            p = p.to(v.dtype)
        else:  # the row sum as an MMA chain over the split's keys: one order whatever the warps
            p = p.to(v.dtype)
            l_b = tl.max(tl.dot(p, ones), axis=1)
        o_b = tl.dot(p, v)
        m_new = tl.maximum(m_i, m_b)
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        a = tl.exp(m_i - m_new_safe)
        b = tl.exp(m_b - m_new_safe)
        l_i = l_i * a + l_b * b
        acc = acc * a[:, None] + o_b * b[:, None]
        m_i = m_new
        start += BLOCK_N
    out = (acc / l_i[:, None]).to(o_ptr.dtype.element_ty)
    if GATED:  # the output gate: bf16(out) * bf16(sigmoid(gate)), each rounded as torch rounds them
        g = tl.load(
            g_ptr + rows[:, None] * stride_g_row + h * stride_g_head + o_d[None, :],
            mask=valid[:, None],
            other=0.0,
        ).to(tl.float32)
        sig = (1.0 / (1.0 + tl.exp(-g))).to(o_ptr.dtype.element_ty)
        out = (out.to(tl.float32) * sig.to(tl.float32)).to(o_ptr.dtype.element_ty)
    tl.store(o_ptr + rows[:, None] * stride_q + h * D + o_d[None, :], out, mask=valid[:, None])


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tiles: AttentionTiles,
    scale: float,
    gate: torch.Tensor | None = None,
    lane_sum: bool = False,
) -> torch.Tensor:
    """q [N, Hq, D] (all rows of the pass), caches [S, Hkv, D]; returns [N, Hq, D], times
    sigmoid(gate [N, Hq, D], any row and head strides) when a gate is given. `lane_sum` is a
    planted fault only (the registry's control)."""
    n, hq, d = q.shape
    group = hq // k_cache.shape[1]
    q = q.contiguous()
    out = torch.empty_like(q)  # every row belongs to a tile
    g = gate if gate is not None else q
    grid = (tiles.row0.shape[0], hq)
    _attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        tiles.row0,
        tiles.rows,
        tiles.pos0,
        tiles.table_base,
        tiles.kv_rows,
        scale,
        q.stride(0),
        k_cache.stride(0),
        g,
        g.stride(0),
        g.stride(1),
        GROUP=group,
        D=d,
        BLOCK_M=tiles.size,
        BLOCK_N=BLOCK_N,
        GATED=gate is not None,
        LANE_SUM=lane_sum,
        num_warps=WARPS,
    )
    return out
