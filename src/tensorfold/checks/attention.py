"""The registry's attention entry: the paged super-block kernel against the super-block torch
reference (fp64), its rules (a decode row = the same row in a prompt pass, at positions on both
sides of the super-block edges; tiles, plans, chunks and company change no bit; GQA groups of
1 to 8), and the planted faults that must turn those checks red."""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from ..batch import Segment
from ..ops import attention as ref_attention
from ..ops.attention import SUPER_BLOCK, AttentionTiles
from ..ops.triton import attention
from .moe import rel as _rel

S = SUPER_BLOCK


def _case(small: bool, group: int = 4, length: int | None = None):
    hkv, d = (2, 64) if small else (4, 256)
    length = length or (600 if small else 4 * S + 100)
    rows = 2 * length + 64
    kc = torch.randn(rows, hkv, d, device="cuda").to(torch.bfloat16)
    vc = torch.randn(rows, hkv, d, device="cuda").to(torch.bfloat16)
    slots = torch.randperm(rows, device="cuda")[:length]
    # scores of standard deviation 4: a split's probabilities span many binades, so a row sum
    # in another order rounds differently (with unit scores the sums are mostly exact)
    q = (torch.randn(length, hkv * group, d, device="cuda") * 4).to(torch.bfloat16)
    return q, kc, vc, slots, d


def _tiles(start: int, length: int, slots, size: int | None = None) -> AttentionTiles:
    return AttentionTiles.build(
        (Segment(0, start, 0, length, slots[: start + length]),), "cuda", size
    )


def _decode_rows(impl, q, kc, vc, slots, scale, whole, where: str) -> list[str]:
    bad = []
    n = q.shape[0]
    for t in sorted({0, 37, S - 1, S, S + 1, 2 * S + 63, n // 2, n - 1} & set(range(n))):
        if not torch.equal(impl(q[t : t + 1], kc, vc, _tiles(t, 1, slots), scale)[0], whole[t]):
            bad.append(f"{where}decode row {t} differs from the same row in the prompt pass")
    return bad


def check_attention(impl, small: bool) -> list[str]:
    q, kc, vc, slots, d = _case(small)
    n, scale = q.shape[0], d**-0.5
    whole = impl(q, kc, vc, _tiles(0, n, slots), scale)
    ref = ref_attention.superblock_attention(
        q.double().cpu(), kc.double().cpu(), vc.double().cpu(), slots.cpu(), torch.arange(n), scale
    )
    bad = [] if _rel(whole.float().cpu(), ref) < 1e-2 else ["attention off the fp64 reference"]
    gate = torch.randn(n, q.shape[1], 2 * d, device="cuda").to(torch.bfloat16)[..., d:]
    gated = impl(q, kc, vc, _tiles(0, n, slots), scale, gate=gate)
    if _rel(gated.float(), (whole * torch.sigmoid(gate)).float()) > 1e-2:
        bad.append("the fused output gate is off out * sigmoid(gate)")
    bad += _decode_rows(impl, q, kc, vc, slots, scale, whole, "")
    if not torch.equal(impl(q, kc, vc, _tiles(0, n, slots, size=16), scale), whole):
        bad.append("the prompt in 16-row tiles (split plan) differs from it in 64-row tiles")
    cut = 37 * (n // 74)  # the prompt's second chunk: its tiles start off the first's grid
    if not torch.equal(impl(q[cut:], kc, vc, _tiles(cut, n - cut, slots), scale), whole[cut:]):
        bad.append(f"the prompt's rows from {cut}, as a second chunk, differ from one pass")
    tail = n - 50  # a short chunk over a long lane: either plan, the same bytes
    if not torch.equal(impl(q[tail:], kc, vc, _tiles(tail, 50, slots), scale), whole[tail:]):
        bad.append("a short last chunk differs from the same rows in one pass")
    bad += _company(impl, q, kc, vc, slots, scale, whole)
    for group in (1, 2, 6, 8):  # GQA groups other than the case's 4
        q2, kc2, vc2, slots2, _ = _case(small, group, length=2 * S + 80)
        w2 = impl(q2, kc2, vc2, _tiles(0, q2.shape[0], slots2), scale)
        bad += _decode_rows(impl, q2, kc2, vc2, slots2, scale, w2, f"group {group}: ")
    return bad


def _company(impl, q, kc, vc, slots, scale, whole) -> list[str]:
    """Decode rows of a lane at 100 positions and one at the prompt's end in one pass: each equals
    its row in the prompt pass (lanes of different lengths share the launch)."""
    n = q.shape[0]
    short = 99
    segs = (
        Segment(0, short, 0, 1, slots[: short + 1]),
        Segment(1, n - 1, 1, 1, slots[:n]),
    )
    tiles = AttentionTiles.build(segs, "cuda")
    both = impl(torch.stack([q[short], q[n - 1]]), kc, vc, tiles, scale)
    if torch.equal(both[0], whole[short]) and torch.equal(both[1], whole[n - 1]):
        return []
    return ["two lanes of different lengths in one decode pass differ from their prompt rows"]


def _no_mask(q, kc, vc, tiles, scale, gate=None):
    """Planted: each row also sees the keys of the next tile-size - 1 positions (no causal mask
    within reach; the lane's table is extended so every read stays in bounds)."""
    ahead = tiles.size - 1
    table = torch.cat([tiles.kv_rows, tiles.kv_rows[-1:].expand(ahead)])
    blind = dataclasses.replace(
        tiles, pos0=tiles.pos0 + ahead, kv_rows=table, keys=tiles.keys + ahead
    )
    return attention.paged_attention(q, kc, vc, blind, scale, gate=gate)


def _stale_row(q, kc, vc, tiles, scale, gate=None):
    """Planted: a decode row that reads its own position before its K/V row is written."""
    if tiles.rows.shape[0] == 1 and int(tiles.rows[0]) == 1:
        row = int(tiles.kv_rows[int(tiles.pos0[0])])
        saved = kc[row].clone()
        kc[row] = 0
        out = attention.paged_attention(q, kc, vc, tiles, scale, gate=gate)
        kc[row] = saved
        return out
    return attention.paged_attention(q, kc, vc, tiles, scale, gate=gate)


def _in_split_launches(fault: int) -> Callable:
    """Planted: `fault` in the split plan's launches (decode, verify, short chunks) only."""

    def run(q, kc, vc, tiles, scale, gate=None):
        split = attention.choose_plan(tiles, q.shape[1], q.shape[2], q.device) == "split"
        return attention.paged_attention(q, kc, vc, tiles, scale, gate, fault if split else 0)

    return run


ENTRIES: list[tuple[str, str, str, str, Callable]] = [  # (name, reference, shapes, rule, check)
    ("attention.paged", "ops.attention.superblock_attention (fp64)", "head dim 64-256, GQA groups 1-8+", "ref 1e-2, decode, plans, chunks, lanes", check_attention),
]  # fmt: skip
IMPLS = {"attention.paged": attention.paged_attention}
CONTROLS = [  # (kernel, what is planted, faulty implementation)
    ("attention.paged", "a missing mask", _no_mask),
    ("attention.paged", "a stale cache row", _stale_row),
    ("attention.paged", "a warp-split row sum in decode tiles", _in_split_launches(attention.FAULT_LANE_SUM)),
    ("attention.paged", "stored super-blocks folded in another order", _in_split_launches(attention.FAULT_MERGE_ORDER)),
    ("attention.paged", "super-blocks of a number, not a size", _in_split_launches(attention.FAULT_SPLIT_COUNT)),
]  # fmt: skip
