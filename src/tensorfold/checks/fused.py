"""The registry's entries for a product's segment sums added inside the op that reads them
(checks/registry.py runs them): the residual add + norm and silu · up; a GDN layer's
in-projection read by the conv, the gates, the recurrence and the gated norm; an attention
layer's q (and output gate), k and v read by the q norm, the keys' norm with its KV write and
the attention (and the q and k norms in one launch against two); an MoE block's router and
shared gate read by the routing and the weighted sum. Each must give the bits of the product's
own sum launch followed by the plain op, at 1, 7 and 40 or 64 rows, with planted faults the
check must catch (the segments added in reverse; the total left unrounded)."""

from __future__ import annotations

import functools
from typing import Callable

import torch

from ..batch import Segment
from ..ops.attention import AttentionTiles
from ..ops.dispatch import lane_index
from ..ops.linear import Partial
from ..ops.rope import rope_tables
from ..ops.triton import attention, conv, gates, linear, moe_rows, norm
from ..ops.triton.gated_delta import gated_delta_lanes


def _crafted(rows: int, widths: list[int]) -> Partial:
    """Random segment sums [4, rows, Σ widths] whose first column of every part shows the order
    at any width: (2^24 + 1) + 1 - 2^24 is 0 in order and 2 reversed."""
    sums = torch.randn(4, rows, sum(widths), device="cuda") * 0.3
    order = torch.tensor([2.0**24, 1.0, 1.0, -(2.0**24)], device="cuda")[:, None]
    for start in (sum(widths[:i]) for i in range(len(widths))):
        sums[:, :, start] = order
    return Partial(sums, torch.bfloat16)


def check_fused_sums(impl, small: bool) -> list[str]:
    add_rms, silu_mul = impl
    width, bad = (512 if small else 4096), []
    weight = torch.randn(width, device="cuda") * 0.1
    for rows in (1, 7, 64):
        kept = _crafted(rows, [width, width])
        stored = linear.stored(kept)  # the product's own sum launch
        gate, up = kept.split([width, width])
        h = torch.randn(rows, width, device="cuda").to(torch.bfloat16)
        want = norm.add_rms_norm(h, stored[:, :width], weight, 1e-6, 1.0)
        if not all(map(torch.equal, add_rms(h, gate, weight, 1e-6, 1.0), want)):
            bad.append(f"add + norm of a partial at {rows} rows differs from the summed product")
        if not torch.equal(
            silu_mul(gate, up), gates.silu_mul(stored[:, :width], stored[:, width:])
        ):
            bad.append(f"silu · up of a partial at {rows} rows differs from the summed product")
    return bad


def _lanes(rows: int):
    """`rows` rows as lanes of at most 8 rows (decode and verify passes), each its own slot."""
    segs, row0 = [], 0
    while row0 < rows:
        n = min(8, rows - row0)
        segs.append(Segment(len(segs), 5, row0, n, torch.arange(5 + n)))
        row0 += n
    return lane_index(tuple(segs), "cuda", 4)


def check_in_projection(reads, small: bool) -> list[str]:
    """A GDN layer's in-projection [mixed | z | a | b] as segment sums (`reads` hands them to
    the readers: as they are, or a planted fault), against the same ops on its summed output."""
    hk, hv, d = (2, 4, 128) if small else (16, 32, 128)
    widths = [2 * hk * d + hv * d, hv * d, hv, hv]
    weight = (torch.randn(widths[0], 4, device="cuda") * 0.3).to(torch.bfloat16)
    a_log = torch.randn(hv, device="cuda")
    dt, w = torch.randn(hv, device="cuda").to(torch.bfloat16), torch.rand(d, device="cuda") + 0.5
    bad = []
    for rows in (1, 7, 64):
        kept = _crafted(rows, widths)
        stored = linear.stored(kept)  # the product's own sum launch
        parts, want = reads(kept).split(widths), stored.split(widths, dim=-1)
        lanes = _lanes(rows)
        index = (lanes.slots, lanes.conv_taps, lanes.conv_keep, None)
        start = torch.randn(lanes.slots.shape[0], 3, widths[0], device="cuda")
        for bounds in ((None, 0), (lanes.cu_seqlens, lanes.most_rows)):
            s1, s2 = (start.to(torch.bfloat16) for _ in "12")
            got = conv.conv_lanes(parts[0], s1, weight, *index, *bounds)
            if not (torch.equal(got, conv.conv_lanes(want[0], s2, weight, *index, *bounds))):
                bad.append(f"the conv of the sums differs at {rows} rows ({bounds[1]} most)")
            elif not torch.equal(s1, s2):
                bad.append(f"the conv's kept rows of the sums differ at {rows} rows")
        if not all(map(torch.equal, gates.gdn_gates(*parts[2:], a_log, dt),
                       gates.gdn_gates(*want[2:], a_log, dt))):  # fmt: skip
            bad.append(f"the gates of the sums differ at {rows} rows")
        q, k = (torch.randn(rows, hk, d, device="cuda").to(torch.bfloat16) for _ in "qk")
        v = torch.randn(rows, hv, d, device="cuda").to(torch.bfloat16)
        st = torch.randn(lanes.slots.shape[0], hv, d, d, device="cuda")
        st2 = st.clone()
        cu, raw = (lanes.slots, lanes.cu_seqlens), (a_log, dt)
        got = gated_delta_lanes(q, k, v, *parts[2:], st, *cu, gate_params=raw)
        if not torch.equal(got, gated_delta_lanes(q, k, v, *want[2:], st2, *cu, gate_params=raw)):
            bad.append(f"the recurrence's gates of the sums differ at {rows} rows")
        core = torch.randn(rows, hv, d, device="cuda").to(torch.bfloat16)
        got = norm.gated_rms_norm(core, parts[1].view(rows, hv, d), w, 1e-6)
        if not torch.equal(got, norm.gated_rms_norm(core, want[1].view(rows, hv, d), w, 1e-6)):
            bad.append(f"the gated norm of the sums differs at {rows} rows")
    return bad


def check_router(reads, small: bool) -> list[str]:
    """The router's logits and the shared gate's as one product's sums (`reads` hands them over)
    against the routing and the weighted sum of its summed output."""
    experts, k, h = (64, 8, 512) if small else (256, 8, 2048)
    bad = []
    for rows in (1, 7, 64):
        kept = _crafted(rows, [experts, 1])
        stored = linear.stored(kept)  # the product's own sum launch
        logits, logit = reads(kept).split([experts, 1])
        want, got = moe_rows.route(stored[:, :experts], k), moe_rows.route(logits, k)
        if not (torch.equal(got.ids, want.ids) and torch.equal(got.weights, want.weights)):
            bad.append(f"the routing of the sums differs at {rows} rows")
        routed = torch.randn(rows, k, h, device="cuda").to(torch.bfloat16)
        shared = torch.randn(rows, h, device="cuda").to(torch.bfloat16)
        expect = moe_rows.combine(routed, want.weights, shared, stored[:, experts:])
        if not torch.equal(moe_rows.combine(routed, want.weights, shared, logit), expect):
            bad.append(f"the weighted sum of the shared gate's sums differs at {rows} rows")
    return bad


def check_attention_reads(reads, small: bool) -> list[str]:
    """q_proj's [query | gate] a head, k and v as one product's sums (`reads` hands them over)
    against the q norm, the keys' norm with its KV write and the attention (both plans) of its
    summed output; rows at positions 260.. over two super-blocks of keys."""
    hq, hkv, d = (8, 2, 256) if small else (16, 4, 256)
    widths = [hq * 2 * d, hkv * d, hkv * d]
    w = torch.rand(d, device="cuda") + 0.5
    kc, vc = (torch.randn(364, hkv, d, device="cuda").to(torch.bfloat16) for _ in "kv")
    slots = torch.randperm(364, device="cuda")[:300]
    bad = []
    for rows in (1, 7, 40):
        seg = Segment(0, 300 - rows, 0, rows, slots)
        tiles = AttentionTiles.build((seg,), "cuda")
        kept = _crafted(rows, widths)
        for head in range(hq):  # each head's first gate column crafted too
            kept.sums[:, :, head * 2 * d + d] = kept.sums[:, :, 0]
        stored = linear.stored(kept)  # the product's own sum launch
        want, got = stored.split(widths, dim=-1), reads(kept).split(widths)
        (q, gate), (q_sums, gate_sums) = (
            t[0].view(rows, hq, 2 * d).split([d, d], dim=-1) for t in (want, got)
        )
        cos, sin = rope_tables(torch.arange(rows, device="cuda"), 64, 1e6, torch.float32)
        normed = norm.norm_rope(q, w, 1e-6, 1.0, cos, sin)
        if not torch.equal(norm.norm_rope(q_sums, w, 1e-6, 1.0, cos, sin), normed):
            bad.append(f"the q norm of the sums differs at {rows} rows")
        for plan in ("serial", "split"):
            run = lambda g: attention.paged_attention(  # noqa: E731
                normed, kc, vc, tiles, d**-0.5, gate=g, plan=plan
            )
            if not torch.equal(run(gate_sums), run(gate)):
                bad.append(f"the {plan} attention's gate of the sums differs at {rows} rows")
        kv_rows = torch.randperm(64, device="cuda")[:rows]
        caches = [[torch.zeros(64, hkv, d, device="cuda").to(torch.bfloat16) for _ in "kv"]
                  for _ in "12"]  # fmt: skip
        for parts, cache in zip((want, got), caches):
            k, v = (t.view(rows, hkv, d) for t in parts[1:])
            norm.norm_rope_cached(k, v, w, 1e-6, 1.0, cos, sin, cache, kv_rows)
        if not all(map(torch.equal, *caches)):
            bad.append(f"the keys and values written from the sums differ at {rows} rows")
        bad += _qk_one_launch(q_sums, got, caches[0], w, (cos, sin), kv_rows, normed, rows)
    return bad


def _qk_one_launch(q, parts, keys, w, rope, kv_rows, want, rows: int) -> list[str]:
    """The q and k norms in one launch (read from the sums) against the two launches: q's bits
    and the caches' (both norms' weights w here: the keys' launch above used w)."""
    rows_, hkv, d = kv_rows.shape[0], keys[0].shape[1], keys[0].shape[2]
    k, v = (t.view(rows_, hkv, d) for t in parts[1:])
    cache = [torch.zeros_like(c) for c in keys]
    if not norm.qk_fusable(q, k, v, cache):
        return [f"q, k and v of one product's sums not taken by the one launch at {rows} rows"]
    got = norm.qk_norm_rope(q, k, v, (w, w), 1e-6, 1.0, *rope, cache, kv_rows)
    if not (torch.equal(got, want) and all(map(torch.equal, cache, keys))):
        return [f"the q and k norms in one launch differ from two at {rows} rows"]
    return []


def check_readers(reads, small: bool) -> list[str]:
    return (
        check_in_projection(reads, small)
        + check_attention_reads(reads, small)
        + check_router(reads, small)
    )


def _as_they_are(kept: Partial) -> Partial:
    return kept


def _reversed(kept: Partial) -> Partial:
    """Planted: the segments handed over in reverse order."""
    return Partial(kept.sums.flip(0), kept.dtype)


NAME = "fused.segment_sums"
READS = "fused.readers"
ENTRIES: list[tuple[str, str, str, str, Callable]] = [
    (
        NAME,
        "the product's _sum_segments, then the op",
        "residual add + rms norm, silu · up; 1/7/64 rows",
        "bitwise",
        check_fused_sums,
    ),
    (
        READS,
        "the product's _sum_segments, then the op",
        "GDN in-projection: conv (both forms), gates, recurrence, gated norm; attention q, gate, "
        "k, v: q norm, keys' norm + KV write, both in one launch, attention (both plans); MoE "
        "router and shared "
        "gate: routing, weighted sum; 1/7/40-64 rows",
        "bitwise",
        check_readers,
    ),
]
IMPLS = {NAME: (norm.add_rms_norm, gates.silu_mul), READS: _as_they_are}
CONTROLS = [
    (
        NAME,
        what,
        (
            functools.partial(norm.add_rms_norm, fault=fault),
            functools.partial(gates.silu_mul, fault=fault),
        ),
    )
    for fault, what in ((1, "segments added in reverse"), (2, "the total left unrounded"))
] + [(READS, "segments handed over in reverse", _reversed)]
