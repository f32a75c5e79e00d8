"""Run under TRITON_INTERPRET=1 (by test_triton_interpret.py): the Triton kernels on tiny shapes on the
CPU against their torch references. The interpreter has no bf16, so values are fp16 here."""

import torch

from tensorfold.batch import Segment
from tensorfold.ops import attention as ref_attention
from tensorfold.ops import norm as ref_norm
from tensorfold.ops.quant import dequantize, quantize
from tensorfold.ops.triton import attention, linear, norm


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 128).half()
    w = torch.randn(48, 128).half()
    assert (
        rel(
            linear.dense_matmul(x, w, linear.LinearPlan.for_weight(48, 128)),
            x.float() @ w.float().t(),
        )
        < 2e-3
    )
    for bits in (3, 4, 8):
        packed, s, b = quantize(torch.randn(32, 128), bits, 64)
        s, b = s.half(), b.half()
        y = linear.affine_matmul(
            x, packed, s, b, bits, 64, linear.LinearPlan.for_weight(32, 128, 64)
        )
        assert (
            rel(y, x.float() @ dequantize(packed, s, b, bits, 64, torch.float16).float().t()) < 2e-3
        ), bits
    # K = 2048 is reduced in two segments: a few rows take the split form, many rows the whole
    # form; a row's bits must not change between them.
    wide = torch.randn(136, 2048).half()  # > SPLIT_MAX_ROWS
    w2 = torch.randn(48, 2048).half()
    plan = linear.LinearPlan.for_weight(48, 2048)
    assert plan.segments(2048) == 2
    many = linear.dense_matmul(wide, w2, plan)
    assert rel(many, wide.float() @ w2.float().t()) < 2e-3
    assert torch.equal(linear.dense_matmul(wide[7:8], w2, plan)[0], many[7])
    for tiles in linear.candidates(1, packed=False):  # split and whole forms of one row
        assert torch.equal(linear.dense_matmul(wide[7:8], w2, plan, tiles=tiles)[0], many[7])
    packed, s, b = quantize(torch.randn(48, 2048), 4, 32)
    s, b = s.half(), b.half()
    plan = linear.LinearPlan.for_weight(48, 2048, 32)
    many = linear.affine_matmul(wide, packed, s, b, 4, 32, plan)
    assert (
        rel(many, wide.float() @ dequantize(packed, s, b, 4, 32, torch.float16).float().t()) < 2e-3
    )
    assert torch.equal(linear.affine_matmul(wide[7:8], packed, s, b, 4, 32, plan)[0], many[7])
    ref_w = dequantize(packed, s, b, 4, 32, torch.float16)
    assert (
        rel(linear.dequantize(packed.view(torch.int32), s, b, 4, 32, torch.float16), ref_w) < 1e-3
    )
    shapes = [linear.candidates(m, packed=True) for m in (1, 40, 80, 300)]  # each class's
    for tiles in sum(shapes, []):  # launch shapes only
        assert torch.equal(
            linear.affine_matmul(wide[7:8], packed, s, b, 4, 32, plan, tiles=tiles)[0], many[7]
        )
    held = linear.dequantize(packed.view(torch.int32), s, b, 4, 32, wide.dtype)
    for m in (40, 80, 300):  # a weight held unpacked: the dequantize-first shape reads it
        tiles = next(t for t in linear.candidates(m, packed=True, held=True) if t.dequant)
        run = (
            lambda w: linear.affine_matmul(  # noqa: E731
                wide[7:8], packed, s, b, 4, 32, plan, tiles=tiles, unpacked=w
            )[0]
        )
        assert torch.equal(run(held), many[7])
        assert not torch.equal(run(held * 0.5), many[7])  # the held values are what it reads
    q, kc, vc, tiles, ref = super_blocks()
    h = torch.randn(6, 64).half()
    wt = torch.randn(64) * 0.1
    assert rel(norm.rms_norm(h, wt, 1e-6, 1.0), ref_norm.rms_norm(h.float(), wt, 1e-6, 1.0)) < 2e-3
    with torch.random.fork_rng():  # its draws leave the later checks' data as it was
        unpacking()
    fused_kernels()
    fused_norms(q, kc, vc, tiles, ref)
    recurrence()
    sampling()
    padded_rows(q, kc, vc)
    experts()
    print("interpreted kernels match their references")


def near(a, b) -> bool:
    """Equal but for the last bit of a few values. numpy's matmul, which the interpreter's dots
    run on, rounds a row differently with other rows beside it, so the card's bitwise rules
    (checks/attention.py) are checked here as near-equality."""
    return rel(a, b) < 2e-4 and float((a.float() - b.float()).abs().max()) < 4e-3


def super_blocks():
    """The attention kernel over lanes of up to 3 super-blocks: both plans against the torch
    reference, decode rows at the super-block edges, a second chunk, lanes of other lengths
    and GQA groups 1 to 4. Returns the first case (its draws are the later checks' seed)."""
    kc, vc = torch.randn(64, 2, 32).half(), torch.randn(64, 2, 32).half()
    slots = torch.randperm(64)[:20]
    first = (torch.randn(20, 4, 32).half(), kc, vc, slots)
    with torch.random.fork_rng():  # the other cases' draws leave the later checks' data as it was
        cases = [first]
        for group, n in ((1, 600), (4, 300), (3, 270)):  # three super-blocks; GQA of 4
            kc, vc = torch.randn(n + 64, 2, 32).half(), torch.randn(n + 64, 2, 32).half()
            cases.append((torch.randn(n, 2 * group, 32).half(), kc, vc, torch.randperm(n + 64)[:n]))
        made = [_super_block_case(*case) for case in cases]
    return made[0]


def _super_block_case(q, kc, vc, slots):
    n = q.shape[0]
    tiles = ref_attention.AttentionTiles.build((Segment(0, 0, 0, n, slots),), "cpu")
    out = attention.paged_attention(q, kc, vc, tiles, 32**-0.5)
    want = ref_attention.superblock_attention(
        q.double(), kc.double(), vc.double(), slots, torch.arange(n), 32**-0.5, torch.float16
    )
    assert rel(out, want) < 2e-3, q.shape
    for lo, hi in ((0, min(n, 24)), (max(0, n - 40), n)):  # the split plan: first and last rows
        part = ref_attention.AttentionTiles.build((Segment(0, lo, 0, hi - lo, slots),), "cpu")
        split = attention.paged_attention(q[lo:hi], kc, vc, part, 32**-0.5, plan="split")
        assert near(split, out[lo:hi]), (n, lo)
    for t in sorted({0, 13, 255, 256, 257, n - 1} & set(range(n))):
        one = ref_attention.AttentionTiles.build((Segment(0, t, 0, 1, slots[: t + 1]),), "cpu")
        assert one.size == ref_attention.Q_TILE
        assert near(attention.paged_attention(q[t : t + 1], kc, vc, one, 32**-0.5)[0], out[t])
    cut = n // 3
    second = ref_attention.AttentionTiles.build((Segment(0, cut, 0, n - cut, slots),), "cpu")
    assert near(attention.paged_attention(q[cut:], kc, vc, second, 32**-0.5), out[cut:])
    if n > 256:  # two decode lanes of other lengths in one launch
        segs = (Segment(0, 99, 0, 1, slots[:100]), Segment(1, n - 1, 1, 1, slots))
        both = ref_attention.AttentionTiles.build(segs, "cpu")
        pair = attention.paged_attention(q[[99, n - 1]], kc, vc, both, 32**-0.5)
        assert near(pair, out[[99, n - 1]])
    return q, kc, vc, tiles, want.to(torch.float32)


def unpacking() -> None:
    """Every width's values, bit for bit: with unit scales and zero biases a product of one-hot
    rows returns the quantized integers themselves (3, 5 and 6 bits are read a chunk of words at a
    time, and a value may straddle two words)."""
    n, k = 24, 256
    for bits in (2, 3, 5, 6, 8):
        for group in (32, 64):
            packed, s, b = quantize(torch.randn(n, k), bits, group)
            ones, zeros = torch.ones_like(s).half(), torch.zeros_like(b).half()
            q = dequantize(packed, ones, zeros, bits, group, torch.float16)
            words = packed.view(torch.int32)
            assert torch.equal(linear.dequantize(words, ones, zeros, bits, group, torch.float16), q)
            cols = torch.randperm(k)[:16]
            x = torch.eye(k)[cols].half()
            plan = linear.LinearPlan.for_weight(n, k, group)
            # plain and swapped, 1-4 blocks a step, few rows and many lanes' launch shapes
            middle = [t for t in linear.candidates(40, packed=True) if t.swap]
            for tiles in linear.candidates(16, packed=True) + middle:
                y = linear.affine_matmul(x, packed, ones, zeros, bits, group, plan, tiles=tiles)
                assert torch.equal(y, q[:, cols].t()), (bits, group, tiles)


def fused_norms(q, kc, vc, tiles, ref) -> None:
    from tensorfold.ops.rope import apply_rope, rope_tables

    gate = torch.randn(20, 8, 32).half()[:, ::2]  # a strided gate, as the layer passes it
    gated = attention.paged_attention(q, kc, vc, tiles, 32**-0.5, gate=gate)
    assert rel(gated, ref * torch.sigmoid(gate.float())) < 4e-3
    h, d = torch.randn(6, 64).half(), torch.randn(6, 64).half()
    wt = torch.randn(64) * 0.1
    h2, y = norm.add_rms_norm(h, d, wt, 1e-6, 1.0)
    assert (
        torch.equal(h2, h + d) and rel(y, ref_norm.rms_norm((h + d).float(), wt, 1e-6, 1.0)) < 2e-3
    )
    x = torch.randn(6, 3, 64).half()[:, :, :32]  # q: the first half of each head's channels
    cos, sin = rope_tables(torch.arange(6) + 5, 8, 10000.0, torch.float16)
    out = norm.norm_rope(x, wt[:32], 1e-6, 1.0, cos, sin)
    want = apply_rope(ref_norm.rms_norm(x.float(), wt[:32], 1e-6, 1.0).half(), cos, sin)
    assert rel(out, want) < 2e-3
    # the fresh keys and values written to their KV rows in the same launch: the same bytes
    kv = torch.randn(6, 2, 64).half()  # one row's key and value heads side by side
    k, v = kv[:, :, :32], kv[:, :, 32:]
    caches, rows = (
        (torch.zeros(9, 2, 32).half(), torch.zeros(9, 2, 32).half()),
        torch.tensor([4, 0, 8, 2, 7, 5]),
    )
    norm.norm_rope_cached(k, v, wt[:32], 1e-6, 1.0, cos, sin, caches, rows)
    want = torch.zeros(9, 2, 32).half()
    want[rows] = norm.norm_rope(k, wt[:32], 1e-6, 1.0, cos, sin)
    assert torch.equal(caches[0], want) and torch.equal(caches[1][rows], v)
    assert not caches[1][[1, 3, 6]].any()


def fused_kernels() -> None:
    from tensorfold.ops import conv as ref_conv
    from tensorfold.ops import gates as ref_gates
    from tensorfold.ops.dispatch import lane_index
    from tensorfold.ops.triton import conv as tconv
    from tensorfold.ops.triton import gates as tgates

    weight, x = torch.randn(64, 4).half() * 0.3, torch.randn(9, 64).half()
    segs = (Segment(2, 5, 0, 4, torch.arange(9)), Segment(0, 0, 4, 5, torch.arange(5)))
    meta = lane_index(segs, "cpu", 4)
    states = torch.randn(4, 3, 64).half()
    ref_states, before = states.clone(), states.clone()
    y = tconv.conv_lanes(x, states, weight, meta.slots, meta.conv_taps, meta.conv_keep)
    ref = ref_conv.causal_conv_lanes(
        x, ref_states, weight, meta.slots, meta.conv_taps, meta.conv_keep
    )
    assert rel(y, ref) < 2e-3 and torch.equal(states, ref_states)
    # each lane's state left in another slot (a verify pass's spare): the read slots untouched
    moved, writes = before.clone(), torch.tensor([1, 3])
    y2 = tconv.conv_lanes(x, moved, weight, meta.slots, meta.conv_taps, meta.conv_keep, writes)
    assert torch.equal(y2, y) and torch.equal(moved[[1, 3]], states[[2, 0]])
    assert torch.equal(moved[[0, 2]], before[[0, 2]])
    # one launch (a program a lane running its rows, then its kept rows): the same bytes, in place
    # and into other slots
    bounds = (meta.cu_seqlens, meta.most_rows)
    assert 0 < meta.most_rows <= tconv.FUSE_ROWS
    one, index = before.clone(), (meta.slots, meta.conv_taps, meta.conv_keep)
    assert torch.equal(tconv.conv_lanes(x, one, weight, *index, None, *bounds), y)
    assert torch.equal(one, states)
    one = before.clone()
    assert torch.equal(tconv.conv_lanes(x, one, weight, *index, writes, *bounds), y)
    assert torch.equal(one, moved)
    a, b = torch.randn(5, 8).half(), torch.randn(5, 8).half()
    a_log, dt = torch.randn(8), torch.randn(8).half()
    g, beta = tgates.gdn_gates(a, b, a_log, dt)
    rg, rbeta = ref_gates.gdn_gates(a, b, a_log, dt, torch.float32)
    assert rel(g, rg) < 1e-5 and rel(beta, rbeta) < 2e-3
    gu = torch.randn(5, 96).half()
    assert (
        rel(tgates.silu_mul(gu[:, :48], gu[:, 48:]), ref_gates.silu_mul(gu[:, :48], gu[:, 48:]))
        < 2e-3
    )


def experts() -> None:
    """Grouped expert products: a row's bits equal its expert's plain product alone (split form
    included: K = 2048 is two segments) and the row alone in the pass; near the torch reference."""
    from triton_interpret_moe import expert_stack  # this folder's script

    from tensorfold.ops import moe as ref_moe
    from tensorfold.ops.triton import gates as tgates
    from tensorfold.ops.triton import moe

    x = torch.randn(40, 128).half()
    ids = torch.sort(torch.rand(40, 6).argsort(-1)[:, :2], -1).values
    ids[:, 0] = 0  # expert 0 serves every row
    for bits in (None, (4, 3, 8)):
        ex = ref_moe.Experts(
            *(
                expert_stack(6, n, k, b)
                for (n, k), b in zip(((64, 128), (64, 128), (128, 64)), bits or (None,) * 3)
            )
        )
        y = moe.expert_swiglu(x, ids, ex)
        for r, j in ((0, 0), (17, 1), (39, 1)):
            e, xe = int(ids[r, j]), x[r : r + 1]
            h = tgates.silu_mul(
                linear.matmul(xe, ex.gate.expert(e)), linear.matmul(xe, ex.up.expert(e))
            )
            assert torch.equal(linear.matmul(h, ex.down.expert(e))[0], y[r, j]), (bits, r, j)
            assert torch.equal(moe.expert_swiglu(xe, ids[r : r + 1], ex)[0], y[r])
        ref = ref_moe.expert_swiglu(
            x.float(),
            ids,
            ref_moe.Experts(
                *(
                    s if s.packed else ref_moe.ExpertStack(s.weight.float())
                    for s in (ex.gate, ex.up, ex.down)
                )
            ),
        )
        assert rel(y, ref) < 2e-3, bits
    wide, ids2 = torch.randn(5, 2048).half(), torch.tensor([[1], [0], [1], [1], [0]])
    for bits in (None, 4):
        st = expert_stack(2, 16, 2048, bits)
        tiles = moe.expert_tiles(ids2, 2, 16)
        y = moe.grouped_matmul(wide[tiles.order], st, tiles)[torch.argsort(tiles.order)]
        for r in range(5):  # one row: linear.py's split form, two segments
            assert torch.equal(linear.matmul(wide[r : r + 1], st.expert(int(ids2[r, 0])))[0], y[r])


def recurrence() -> None:
    from tensorfold.ops import gated_delta as ref_gdn
    from tensorfold.ops.triton.gated_delta import gated_delta_lanes

    t, hk, hv, dk = 23, 2, 4, 32
    q, k, v = (
        torch.randn(t, hk, dk).half(),
        torch.randn(t, hk, dk).half(),
        torch.randn(t, hv, dk).half(),
    )
    g, beta = -torch.rand(t, hv) * 0.5, torch.rand(t, hv).half()
    states = torch.zeros(3, hv, dk, dk)
    whole = gated_delta_lanes(q, k, v, g, beta, states, torch.tensor([2]), torch.tensor([0, t]))
    qf, kf = (ref_norm.l2_norm(x.float()).repeat_interleave(hv // hk, 1) for x in (q, k))
    ref_state = torch.zeros(hv, dk, dk)
    ref = ref_gdn.gated_delta_rule(ref_state, qf / dk**0.5, kf, v.float(), g.exp(), beta.float())
    assert rel(whole, ref) < 2e-3 and rel(states[2], ref_state) < 1e-5
    # Chunks of 7 as the second lane beside another lane's 10 rows: the same bytes as one call alone.
    again, parts = torch.zeros(3, hv, dk, dk), []
    for s in range(0, t, 7):
        e = min(t, s + 7)
        cat = lambda other, mine: torch.cat([other, mine[s:e]])  # noqa: E731
        out = gated_delta_lanes(
            cat(torch.randn(10, hk, dk).half(), q),
            cat(torch.randn(10, hk, dk).half(), k),
            cat(torch.randn(10, hv, dk).half(), v),
            cat(-torch.rand(10, hv), g),
            cat(torch.rand(10, hv).half(), beta),
            again,
            torch.tensor([0, 1]),
            torch.tensor([0, 10, 10 + e - s]),
        )
        parts.append(out[10:])
    assert torch.equal(torch.cat(parts), whole) and torch.equal(again[1], states[2])
    # Either launch order (a lane's value blocks together, or the lanes together): the same bytes.
    lanes = torch.zeros(3, hv, dk, dk)
    cu = torch.tensor([0, 10, 10 + t])
    rows = [torch.cat([torch.randn(10, *x.shape[1:]).to(x.dtype), x]) for x in (q, k, v, g, beta)]
    by_lane = gated_delta_lanes(*rows, lanes, torch.tensor([0, 2]), cu, blocks_first=False)
    assert torch.equal(by_lane[10:], whole) and torch.equal(lanes[2], states[2])
    # The state left in another slot (a verify pass's spare): the same bytes, the read slot kept.
    spare = torch.zeros(3, hv, dk, dk)
    spare[1] = 7.0
    out = gated_delta_lanes(
        q, k, v, g, beta, spare, torch.tensor([1]), torch.tensor([0, t]), writes=torch.tensor([2])
    )
    fresh = torch.zeros(3, hv, dk, dk)
    fresh[1] = 7.0
    want = gated_delta_lanes(q, k, v, g, beta, fresh, torch.tensor([1]), torch.tensor([0, t]))
    assert torch.equal(out, want) and torch.equal(spare[2], fresh[1])
    assert torch.equal(spare[1], torch.full_like(spare[1], 7.0))
    gates_inside(q, k, v)


def gates_inside(q, k, v) -> None:
    """The recurrence computing its gates from their inputs (column slices of one product): the
    same bytes as the gates' own kernel, then the recurrence."""
    from tensorfold.ops.triton import gates as tgates
    from tensorfold.ops.triton.gated_delta import gated_delta_lanes

    t, hv = v.shape[:2]
    ab = torch.randn(t, 2 * hv + 3).half() * 2
    a, b = ab[:, 3 : 3 + hv], ab[:, 3 + hv :]
    a_log, dt = torch.randn(hv), torch.randn(hv).half()
    g, beta = tgates.gdn_gates(a, b, a_log, dt)
    lanes = (torch.tensor([0, 2]), torch.tensor([0, 9, t]))
    apart, inside = torch.zeros(3, hv, 32, 32), torch.zeros(3, hv, 32, 32)
    want = gated_delta_lanes(q, k, v, g, beta, apart, *lanes)
    got = gated_delta_lanes(q, k, v, a, b, inside, *lanes, gate_params=(a_log, dt))
    assert torch.equal(got, want) and torch.equal(inside, apart)


def sampling() -> None:
    """Sampled rows in one kernel: the tokens of `sample_row`'s rule for temperature, top-k,
    top-p and min-p, and each row's token the same alone as among the others."""
    from tensorfold.ops.sampling import sample_row, uniform
    from tensorfold.ops.triton.sampling import choose

    cases = [(0.8, 0, 1.0, 0.0), (1.0, 50, 1.0, 0.0), (0.7, 0, 0.9, 0.0), (1.3, 0, 1.0, 0.05)]
    cases += [(0.9, 20, 0.8, 0.02), (1.0, 1, 1.0, 0.0), (1.0, 0, 1e-4, 0.0)]
    rows = torch.randn(3 * len(cases), 3000) * 3  # fp32 values, as a rule's rows are
    params = [cases[i % len(cases)] for i in range(rows.shape[0])]
    us = [uniform(7, 100 + i) for i in range(rows.shape[0])]
    t, k, p, m = zip(*params)
    together = choose(rows, t, k, p, m, us).tolist()
    assert together == [sample_row(rows[i], *params[i], us[i]) for i in range(rows.shape[0])]
    # rows of many chunks: the kept prefix and the draw found through the chunks' figures
    assert choose(rows, t, k, p, m, us, chunk=128).tolist() == together
    flat = torch.zeros(2, 3000)  # every weight 1: the draw's chunk is u's
    for q in ((1.0, 0, 1.0, 0.0), (1.0, 0, 0.7003, 0.0), (1.0, 1000, 1.0, 0.0)):
        for u in (0.0, 0.30001, 0.60017, 1 - 2**-53):
            assert (
                choose(flat, *([v] * 2 for v in q), [u, u], chunk=128).tolist()
                == [sample_row(flat[0], *q, u)] * 2
            )
    edges = [  # ties at top-k and top-p boundaries, the support's ends, a u on a boundary
        ([0.0, 2.0, 1.0, 2.0, 2.0, -1.0], (1.0, 2, 1.0, 0.0)),
        ([0.0] * 4, (1.0, 0, 0.5, 0.0)),
        ([0.0] * 4, (1.0, 0, 0.51, 0.0)),
        ([1.0, -2.0, 3.5, 0.2, 2.9], (1.0, 0, 1e-9, 0.0)),
        ([1.0, -2.0, 3.5, 0.2, 2.9], (1.0, 0, 1.0, 1.0)),
        ([0.0, 0.0], (1.0, 0, 1.0, 0.0)),
    ]
    for row, q in edges:
        x = torch.tensor(row)
        for u in (0.0, 0.25, 0.5 - 2**-53, 0.5, 0.75, 1 - 2**-53):
            assert choose(x[None], *([v] for v in q), [u]).tolist() == [sample_row(x, *q, u)]
    for i in (0, 4, 8, 20):
        assert choose(
            rows[i : i + 1], t[i : i + 1], k[i : i + 1], p[i : i + 1], m[i : i + 1], us[i : i + 1]
        ).tolist() == [together[i]]


def padded_rows(q, kc, vc) -> None:
    """A lane whose rows past its real ones are padding (a mixed graph's prompt piece): the
    recurrence stops at the lane's bound and attention skips a tile of no rows, the real rows'
    bytes those of the real rows alone, the padding rows left at zero (`zeroed`)."""
    from dataclasses import replace

    from tensorfold.ops.triton.gated_delta import gated_delta_lanes

    t, pad, hk, hv, dk = 11, 6, 2, 4, 32
    q4, k4 = torch.randn(t + pad, hk, dk).half(), torch.randn(t + pad, hk, dk).half()
    v4, g4 = torch.randn(t + pad, hv, dk).half(), -torch.rand(t + pad, hv) * 0.5
    b4, slot = torch.rand(t + pad, hv).half(), torch.tensor([1])
    alone, padded = torch.zeros(2, hv, dk, dk), torch.zeros(2, hv, dk, dk)
    real = [x[:t] for x in (q4, k4, v4, g4, b4)]
    want = gated_delta_lanes(*real, alone, slot, torch.tensor([0, t]))
    got = gated_delta_lanes(q4, k4, v4, g4, b4, padded, slot, torch.tensor([0, t]), zeroed=True)
    assert torch.equal(got[:t], want) and torch.equal(padded, alone)
    assert not got[t:].any()
    n = q.shape[0]  # 20 rows of a lane in tiles of 16: the second tile of 4 rows
    tiles = ref_attention.AttentionTiles.build(
        (Segment(0, 0, 0, n, torch.randperm(64)[:n]),), "cpu", size=16
    )
    want = attention.paged_attention(q, kc, vc, tiles, 32**-0.5)
    short = replace(tiles, rows=torch.tensor([16, 0], dtype=torch.int32))  # 16 real rows
    for plan in ("serial", "split"):
        got = attention.paged_attention(q, kc, vc, short, 32**-0.5, plan=plan, zeroed=True)
        assert near(got[:16], want[:16]) and not got[16:].any(), plan


if __name__ == "__main__":
    main()
