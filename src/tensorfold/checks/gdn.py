"""The registry's Gated DeltaNet entries: the per-token recurrence and the chunk forms, each
against the fp32 per-token recurrence on the CPU and its rules (chunks, decode, lanes)."""

from __future__ import annotations

from typing import Callable

import torch

from ..batch import CHUNK, GDNState, Segment
from ..ops import gated_delta as ref_gdn
from ..ops import norm as ref_norm
from ..ops.dispatch import lane_index
from ..ops.triton import gated_delta, gated_delta_chunk, gated_delta_grid, gated_delta_rows
from .moe import rel as _rel


def _gdn_inputs(t: int, small: bool):
    hk, hv, dk = (2, 4, 64) if small else (16, 32, 128)
    mk = lambda *s: torch.randn(*s, device="cuda").to(torch.bfloat16)  # noqa: E731
    q, k, v = mk(t, hk, dk), mk(t, hk, dk), mk(t, hv, dk)
    g = -torch.rand(t, hv, device="cuda") * 0.5
    beta = torch.rand(t, hv, device="cuda").to(torch.bfloat16)
    return q, k, v, g, beta, hv, dk


def check_recurrence(impl, small: bool) -> list[str]:
    t = 256 if small else 512
    q, k, v, g, beta, hv, dk = _gdn_inputs(t, small)
    states = torch.zeros(3, hv, dk, dk, device="cuda")
    whole = impl(
        q,
        k,
        v,
        g,
        beta,
        states,
        torch.tensor([1], device="cuda"),
        torch.tensor([0, t], device="cuda"),
    )
    state_whole = states[1].clone()
    # The CPU reference: l2-normed q/k, q scaled, the per-token recurrence in fp32.
    qf, kf = (
        ref_norm.l2_norm(x.float().cpu()).repeat_interleave(hv // x.shape[1], 1) for x in (q, k)
    )
    ref_state = torch.zeros(hv, dk, dk)
    ref = ref_gdn.gated_delta_rule(
        ref_state, qf / dk**0.5, kf, v.float().cpu(), g.exp().cpu(), beta.float().cpu()
    )
    bad = [] if _rel(whole.float().cpu(), ref) < 1e-2 else ["recurrence off the fp32 reference"]
    states.zero_()
    parts = []
    for s in range(0, t, 37):
        e = min(t, s + 37)
        parts.append(
            impl(
                q[s:e],
                k[s:e],
                v[s:e],
                g[s:e],
                beta[s:e],
                states,
                torch.tensor([1], device="cuda"),
                torch.tensor([0, e - s], device="cuda"),
            )
        )
    if not (torch.equal(torch.cat(parts), whole) and torch.equal(states[1], state_whole)):
        bad.append("chunks of 37 differ from one call")
    # The same sequence as the second of two lanes (another lane's 100 rows first, its own slot).
    states.zero_()
    o, ok, ov, og, ob, _, _ = _gdn_inputs(100, small)
    cat = lambda a, b: torch.cat([a, b])  # noqa: E731
    both = impl(
        cat(o, q),
        cat(ok, k),
        cat(ov, v),
        cat(og, g),
        cat(ob, beta),
        states,
        torch.tensor([2, 1], device="cuda"),
        torch.tensor([0, 100, 100 + t], device="cuda"),
    )
    if not (torch.equal(both[100:], whole) and torch.equal(states[1], state_whole)):
        bad.append("a lane beside another lane differs from the lane alone")
    bad += _recurrence_gates(impl, q, k, v)
    return bad + _recurrence_writes(impl, (q, k, v, g, beta), whole, state_whole)


def _recurrence_gates(impl, q, k, v) -> list[str]:
    """The gates computed inside the recurrence from their inputs (column slices of one product,
    as the layer's joint projection gives them) against the gates' own kernel first: the same
    bits, for lanes of one row (decode) and of many (a prompt)."""
    from ..ops.triton.gates import gdn_gates

    t, hv, dk = v.shape
    ab = (torch.randn(t, 2 * hv + 8, device="cuda") * 3).to(torch.bfloat16)
    a, b = ab[:, 8 : 8 + hv], ab[:, 8 + hv :]
    a_log = torch.randn(hv, device="cuda")
    dt = torch.randn(hv, device="cuda").to(torch.bfloat16)
    g, beta = gdn_gates(a, b, a_log, dt)
    lanes = (torch.tensor([0, 1, 2], device="cuda"), torch.tensor([0, 1, 2, t], device="cuda"))
    apart, inside = (torch.randn(3, hv, dk, dk, device="cuda") for _ in range(2))
    inside.copy_(apart)
    want = impl(q, k, v, g, beta, apart, *lanes)
    got = impl(q, k, v, a, b, inside, *lanes, gate_params=(a_log, dt))
    if not (torch.equal(got, want) and torch.equal(inside, apart)):
        return ["the gates computed inside the recurrence differ from their own kernel's"]
    return []


def _recurrence_writes(impl, rows, whole, state_whole) -> list[str]:
    """The second half of the rows read from slot 1 and left in slot 2 (a verify pass's spare):
    the same outputs and end state as one call in place, slot 1 as the first half left it."""
    states = torch.zeros(3, *state_whole.shape, device="cuda")
    t, cut = rows[0].shape[0], rows[0].shape[0] // 2
    one = lambda *s: torch.tensor(s, device="cuda")  # noqa: E731
    first = impl(*(x[:cut] for x in rows), states, one(1), one(0, cut))
    half = states[1].clone()
    second = impl(*(x[cut:] for x in rows), states, one(1), one(0, t - cut), writes=one(2))
    same = torch.equal(torch.cat([first, second]), whole) and torch.equal(states[2], state_whole)
    if not (same and torch.equal(states[1], half)):
        return ["the state left in another slot differs from the state in place"]
    return []


def _gdn_case(t: int, small: bool):
    hk, hv, d = (2, 4, 64) if small else (16, 32, 128)
    shape = ref_gdn.GDNShape(hk, hv, d, d)
    conv = 2 * shape.key_dim + shape.value_dim
    x = torch.randn(t, conv, device="cuda").to(torch.bfloat16)
    g = -torch.rand(t, hv, device="cuda") * 0.5
    beta = torch.rand(t, hv, device="cuda").to(torch.bfloat16)
    return x, g, beta, shape


def _gdn_states(shape, slots: int = 3) -> GDNState:
    z = lambda *s, dt=torch.float32: torch.zeros(slots, *s, device="cuda", dtype=dt)  # noqa: E731
    conv = 2 * shape.key_dim + shape.value_dim
    return GDNState(
        z(3, conv, dt=torch.bfloat16),
        z(shape.num_v_heads, shape.k_head_dim, shape.v_head_dim),
        z(CHUNK, conv, dt=torch.bfloat16),
        z(CHUNK, 2, shape.num_v_heads),
        torch.zeros(2 * slots, dtype=torch.int32, device="cuda"),
    )


def _kv(n: int) -> torch.Tensor:
    return torch.arange(n, device="cuda")  # KV rows: the GDN path never reads them


def _gdn_run(impl, cuts, x, g, beta, shape, states=None, slot=1):
    """The rows in passes of `cuts` rows on one lane; (rows out, the lane's state bytes)."""
    states = states or _gdn_states(shape)
    outs, start = [], 0
    for c in cuts:
        r = slice(start, start + c)
        lanes = lane_index((Segment(slot, start, 0, c, _kv(start + c)),), "cuda", 4, chunked=True)
        outs.append(impl(x[r], g[r], beta[r], states, shape, lanes))
        start += c
    n = start % CHUNK
    return torch.cat(outs), [
        states.recurrent[slot],
        states.tail[slot, :n],
        states.tail_gates[slot, :n],
    ]


def _same_lane(a, b) -> bool:
    return torch.equal(a[0], b[0]) and all(torch.equal(p, q) for p, q in zip(a[1], b[1]))


def check_gdn(impl, small: bool) -> list[str]:
    t = 256 if small else 512
    x, g, beta, shape = _gdn_case(t, small)
    whole = _gdn_run(impl, [t], x, g, beta, shape)
    # The CPU reference: l2-normed q/k, q scaled, the per-token recurrence in fp32.
    hk, hv, dk = shape.num_k_heads, shape.num_v_heads, shape.k_head_dim
    q, k, v = x.float().cpu().split([shape.key_dim, shape.key_dim, shape.value_dim], dim=-1)
    qf, kf = (ref_norm.l2_norm(a.view(t, hk, dk)).repeat_interleave(hv // hk, 1) for a in (q, k))
    ref = ref_gdn.gated_delta_rule(
        torch.zeros(hv, dk, dk),
        qf / dk**0.5,
        kf,
        v.view(t, hv, -1),
        g.exp().cpu(),
        beta.float().cpu(),
    )
    bad = [] if _rel(whole[0].float().cpu(), ref) < 1e-2 else ["off the fp32 recurrence"]
    if not _same_lane(_gdn_run(impl, [37] * (t // 37) + [t % 37], x, g, beta, shape), whole):
        bad.append("chunks of 37 differ from one call")
    if not _same_lane(_gdn_run(impl, [t - 40] + [1] * 40, x, g, beta, shape), whole):
        bad.append("decode rows differ from prompt rows")
    # The same sequence as the second of two lanes (another lane's 100 rows first, its own slot).
    states = _gdn_states(shape)
    o, og, ob, _ = _gdn_case(100, small)
    segs = (Segment(2, 0, 0, 100, _kv(100)), Segment(1, 0, 100, t, _kv(t)))
    both = impl(
        torch.cat([o, x]), torch.cat([og, g]), torch.cat([ob, beta]), states, shape,
        lane_index(segs, "cuda", 4, chunked=True),
    )  # fmt: skip
    n = t % CHUNK
    lane = [states.recurrent[1], states.tail[1, :n], states.tail_gates[1, :n]]
    if not _same_lane((both[100:], lane), whole):
        bad.append("a lane beside another lane differs from the lane alone")
    return bad


ENTRIES: list[tuple[str, str, str, str, Callable]] = [  # (name, reference, shapes, rule, check)
    ("gdn.recurrence", "ops.gated_delta (fp32)", "GVA Hv/Hk any, power-of-two dk, dv", "ref 1e-2, chunks, lanes", check_recurrence),
    ("gdn.chunk", "ops.gated_delta (fp32)", "GVA Hv/Hk any, dk = dv ≤ 256 power of two", "ref 1e-2, chunks, decode, lanes", check_gdn),
    ("gdn.grid", "ops.gated_delta (fp32)", "GVA Hv/Hk any, power-of-two dk, dv ≥ 16", "ref 1e-2, chunks, decode, lanes", check_gdn),
    ("gdn.rows", "ops.gated_delta (fp32)", "GVA Hv/Hk any, power-of-two dk, dv ≥ 16", "ref 1e-2, chunks, decode, lanes", check_gdn),
]  # fmt: skip
IMPLS = {
    "gdn.recurrence": gated_delta.gated_delta_lanes,
    "gdn.chunk": gated_delta_chunk.gated_delta_lanes,
    "gdn.grid": gated_delta_grid.grid_lanes,
    "gdn.rows": gated_delta_rows.rows_lanes,
}
