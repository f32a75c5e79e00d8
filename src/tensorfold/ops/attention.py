"""Causal attention over a paged KV cache, with a fixed KV split (docs/exactness.md, 'Attention').

Keys are visited in splits of `KV_SPLIT` positions and merged by an online softmax in split
order; query rows go through in tiles of `Q_TILE`. Every product has one fixed shape, every
split is reduced the same way, and a split past a row's position leaves that row untouched,
so a row's output depends only on its own query and the keys up to its position: not on how
many rows came with it, which chunk it arrived in, or whether it is a prompt or a decode row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..batch import ForwardBatch, Segment
from .gates import untailed
from .linear import pad_rows

KV_SPLIT = 64
# The GPU's super-block: 4 splits. A row's splits are folded in order within each super-block of
# SUPER_BLOCK positions from position 0, and the super-blocks' results are folded in order
# (docs/exactness.md, 'Attention'): a fixed size, so its boundaries never move with the context.
SUPER_BLOCK = 256
Q_TILE = 16
# The GPU's query tile for a pass in which some lane brings more than Q_TILE rows (a row's
# arithmetic is the same in either tile: docs/exactness.md, 'Attention')
PROMPT_TILE = 64


def tile_rows(longest: int) -> int:
    """The query tile of a pass whose longest lane brings `longest` rows."""
    return PROMPT_TILE if longest > Q_TILE else Q_TILE


@dataclass(frozen=True)
class AttentionTiles:
    """The pass's query tiles for the GPU kernel. Per tile: first row in the pass, valid rows,
    position of the first row, base of its lane's table in `kv_rows`."""

    row0: torch.Tensor
    rows: torch.Tensor
    pos0: torch.Tensor
    table_base: torch.Tensor
    kv_rows: (
        torch.Tensor
    )  # every lane's cache rows, concatenated (position p of a lane at base + p)
    size: int = Q_TILE  # rows a tile: Q_TILE, or PROMPT_TILE for passes with long lanes
    longest: int = Q_TILE  # valid rows of the fullest tile (<= size): the launch's sub-tiles
    keys: int = SUPER_BLOCK  # positions of the longest lane (an upper bound): its super-blocks
    # tiles that may hold more than one row (0: count every tile): decode tiles beside a prompt
    # piece hold one row over a short lane, so the GPU's split of the keys is sized by the rest
    wide: int = 0

    @staticmethod
    def build(segments: tuple[Segment, ...], device, size: int | None = None) -> "AttentionTiles":
        if size is None:
            size = tile_rows(max((s.length for s in segments), default=0))
        if size not in (Q_TILE, PROMPT_TILE):
            raise ValueError(f"attention tiles are {Q_TILE} or {PROMPT_TILE} rows, not {size}")
        row0, rows, pos0, base, tables, offset = [], [], [], [], [], 0
        keys = max((s.start + s.length for s in segments), default=1)
        for seg in segments:
            for start in range(0, seg.length, size):
                row0.append(seg.row0 + start)
                rows.append(min(size, seg.length - start))
                pos0.append(seg.start + start)
                base.append(offset)
            tables.append(seg.kv_rows)
            offset += seg.kv_rows.shape[0]
        # host lists copied without waiting for the device's queued work
        as_t = lambda v: torch.tensor(v, dtype=torch.int32).to(device, non_blocking=True)  # noqa: E731
        return AttentionTiles(
            as_t(row0),
            as_t(rows),
            as_t(pos0),
            as_t(base),
            torch.cat(tables).to(device=device, dtype=torch.int32),
            size,
            max(rows, default=1),
            keys,
            sum(1 for r in rows if r > 1),
        )


def gated_attention_lanes(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: ForwardBatch,
    scale: float,
    gate: torch.Tensor,
) -> torch.Tensor:
    """Every lane of a pass: q, gate [n, Hq, D] (n >= the pass's rows; rows past them are
    padding), K/V of the pass already written. Returns attention(q) * sigmoid(gate) as [n, Hq*D]."""
    n = q.shape[0]
    out = torch.zeros_like(q)
    for seg in batch.segments:
        out[seg.rows] = paged_attention(
            q[seg.rows], k_cache, v_cache, seg.kv_rows, batch.positions[seg.rows], scale
        )
    # Over every row at once, padding included: the elementwise ops meet no scalar tail.
    return out.reshape(n, -1) * untailed(torch.sigmoid, gate.reshape(n, -1))


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_rows: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention of one sequence's query rows over its cached keys.

    q [n, Hq, D] (rows of one sequence), k_cache/v_cache [S, Hkv, D] flat cache rows,
    kv_rows [P] the cache row of every position 0..P-1 of this sequence (P > max(positions)),
    positions [n] absolute position of each query row. K/V of the rows themselves must
    already be written. Returns [n, Hq, D] in q's dtype.
    """
    n, hq, d = q.shape
    hkv = k_cache.shape[1]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.empty_like(q)
    qp = pad_rows(q, Q_TILE)
    pos_p = torch.cat([positions, positions.new_full(((-n) % Q_TILE,), -1)])
    for start in range(0, n, Q_TILE):
        stop = min(start + Q_TILE, n)
        tile = _attend_tile(
            qp[start : start + Q_TILE].to(acc),
            pos_p[start : start + Q_TILE],
            k_cache,
            v_cache,
            kv_rows,
            scale,
            hkv,
        )
        out[start:stop] = tile[: stop - start].to(q.dtype)
    return out


def _attend_tile(q, pos, k_cache, v_cache, kv_rows, scale, hkv):
    t, hq, d = q.shape
    group = hq // hkv
    # [Hq, T, D]: one product of one shape per query head, whatever the heads' grouping, so a
    # head's bits do not depend on how many heads share its KV head (a tensor split may hold one).
    qh = q.permute(1, 0, 2)
    m = qh.new_full((hq, t), float("-inf"))
    l = qh.new_zeros((hq, t))
    o = qh.new_zeros((hq, t, d))
    last = int(pos.max())
    for split in range(0, last + 1, KV_SPLIT):
        key_pos = torch.arange(split, split + KV_SPLIT, device=q.device)
        idx = kv_rows[split : split + KV_SPLIT]
        if idx.shape[0] < KV_SPLIT:  # the tail of the page table: read any row, mask it below
            idx = torch.cat([idx, idx.new_zeros(KV_SPLIT - idx.shape[0])])
        k = k_cache[idx].to(q.dtype).repeat_interleave(group, dim=1).permute(1, 2, 0)  # [Hq, D, S]
        v = v_cache[idx].to(q.dtype).repeat_interleave(group, dim=1).permute(1, 0, 2)  # [Hq, S, D]
        visible = key_pos[None, :] <= pos[:, None]  # [T, S]
        scores = torch.matmul(qh, k) * scale
        scores = scores.masked_fill(~visible, float("-inf"))
        m_new = torch.maximum(m, scores.amax(-1))
        active = (split <= pos)[None, :].expand_as(m)  # rows this split reaches
        m_safe = torch.where(active, m_new, torch.zeros_like(m_new))
        p = untailed(torch.exp, scores - m_safe[..., None])
        alpha = untailed(torch.exp, m - m_safe)
        l_new = l * alpha + p.sum(-1)
        o_new = o * alpha[..., None] + torch.matmul(p, v)
        m = torch.where(active, m_new, m)
        l = torch.where(active, l_new, l)
        o = torch.where(active[..., None], o_new, o)
    res = o / l.clamp_min(torch.finfo(o.dtype).tiny)[..., None]
    return res.permute(1, 0, 2)


def superblock_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_rows: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    weights: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """The GPU kernel's arithmetic (ops/triton/attention.py) in plain torch, the reference its
    checks compare with. Arguments as `paged_attention`'s; every sum in q's dtype (fp32 or
    fp64), the probabilities rounded to `weights` before they weigh values and are summed, as
    the kernel rounds them to the cache's dtype. Each 64-key split is closed on its own (its
    max, sum and weighted values); a super-block folds its splits in order from an empty state;
    the row folds its super-blocks in order with the same merge. Rows go through in tiles of one
    shape, so a row's bits on the CPU depend on nothing but its query, keys and position."""
    n = q.shape[0]
    out = torch.empty_like(q)
    qp = pad_rows(q, Q_TILE)
    pos_p = torch.cat([positions, positions.new_full(((-n) % Q_TILE,), -1)])
    for start in range(0, n, Q_TILE):
        stop = min(start + Q_TILE, n)
        part = (qp[start : start + Q_TILE], pos_p[start : start + Q_TILE])
        out[start:stop] = _superblock_tile(*part, k_cache, v_cache, kv_rows, scale, weights)[
            : stop - start
        ].to(q.dtype)
    return out


def _superblock_tile(q, pos, k_cache, v_cache, kv_rows, scale, weights):
    qh = q.permute(1, 0, 2)  # [Hq, T, D]: one product shape per head, as in _attend_tile
    row = _empty(qh)
    for block in range(0, int(pos.max()) + 1, SUPER_BLOCK):
        inner = _empty(qh)
        for split in range(block, min(block + SUPER_BLOCK, int(pos.max()) + 1), KV_SPLIT):
            part = _closed_split(qh, pos, split, k_cache, v_cache, kv_rows, scale, weights)
            inner = _merge(inner, part)
        row = _merge(row, inner)
    m, l, o = row
    return (o / l[..., None]).permute(1, 0, 2)


def _empty(qh):
    hq, t, d = qh.shape
    return qh.new_full((hq, t), float("-inf")), qh.new_zeros((hq, t)), qh.new_zeros((hq, t, d))


def _closed_split(qh, pos, split, k_cache, v_cache, kv_rows, scale, weights):
    """One split's (max, sum, weighted values) from nothing: a masked row gets (-inf, 0, 0)."""
    group = qh.shape[0] // k_cache.shape[1]
    idx = kv_rows[split : split + KV_SPLIT]
    if idx.shape[0] < KV_SPLIT:  # the tail of the page table: read any row, mask it below
        idx = torch.cat([idx, idx.new_zeros(KV_SPLIT - idx.shape[0])])
    k = k_cache[idx].to(qh.dtype).repeat_interleave(group, dim=1).permute(1, 2, 0)
    v = v_cache[idx].to(qh.dtype).repeat_interleave(group, dim=1).permute(1, 0, 2)
    key_pos = torch.arange(split, split + KV_SPLIT, device=qh.device)
    scores = (torch.matmul(qh, k) * scale).masked_fill(
        ~(key_pos[None, :] <= pos[:, None]), float("-inf")
    )
    m = scores.amax(-1)
    p = untailed(torch.exp, scores - torch.where(m == float("-inf"), 0.0, m)[..., None])
    p = p.to(weights).to(qh.dtype)
    return m, p.sum(-1), torch.matmul(p, v)


def _merge(state, part):
    """The one merge of two partial softmaxes: the kernel's `_merge`."""
    (m, l, o), (m_b, l_b, o_b) = state, part
    m_new = torch.maximum(m, m_b)
    safe = torch.where(m_new == float("-inf"), 0.0, m_new)
    a, b = untailed(torch.exp, m - safe), untailed(torch.exp, m_b - safe)
    return m_new, l * a + l_b * b, o * a[..., None] + o_b * b[..., None]
