"""Run under TRITON_INTERPRET=1 (by test_triton_interpret.py): the mixture-of-experts kernels on
tiny shapes on the CPU (fp16: the interpreter has no bf16) against their torch references, and
their planted faults caught."""

import interpreter_dot
import torch

from tensorfold.checks import moe as registry_moe
from tensorfold.ops import moe as ref_moe
from tensorfold.ops.quant import quantize
from tensorfold.ops.triton import moe, moe_rows
from tensorfold.ops.triton.tiles import grouped_candidates


def expert_stack(e: int, n: int, k: int, bits: int | None) -> ref_moe.ExpertStack:
    """e random experts of [n, k]: fp16, or packed at `bits` in groups of 32."""
    w = torch.randn(e, n, k) * k**-0.5
    if bits is None:
        return ref_moe.ExpertStack(w.half())
    packed, s, b = quantize(w, bits, 32)
    return ref_moe.ExpertStack(packed, s.half(), b.half(), bits, 32)


def route() -> None:
    """The routing kernel: ids exactly the reference's (ties to the lowest id), weights close."""
    for e, k in ((8, 2), (64, 8), (256, 8)):
        x = torch.randn(6, e).half()
        x[0] = 0.5  # every expert tied
        x[1, 3:13] = 9.0  # ten tied at the top, k < 10
        x[2, ::2] = 9.0
        got, ref = moe_rows.route(x, k), ref_moe.route(x, k)
        assert torch.equal(got.ids, ref.ids), (e, got.ids, ref.ids)
        joint = moe_rows.route(x, k, last=e)  # the joint shared expert's id after the k
        assert torch.equal(joint.ids, ref_moe.route(x, k, last=e).ids)
        assert torch.equal(joint.ids[:, :k], ref.ids) and (joint.ids[:, k] == e).all()
        assert torch.equal(joint.weights, got.weights)
        assert (got.weights - ref.weights).abs().max() < 1e-6
        assert torch.equal(moe_rows.route(x[1:2], k).ids[0], got.ids[1])
        planted = registry_moe._route_highest(x, k)
        assert not torch.equal(planted.ids, ref.ids), "the highest-id control went unseen"
        wide = torch.cat([x, torch.randn(6, 1).half()], 1)  # the router joined with the shared gate
        assert torch.equal(moe_rows.route(wide[:, :e], k).ids, ref.ids)


def tiles() -> None:
    """The one-launch tile table: tiles_torch's table (order, and every non-empty tile)."""
    for m, e, k, block in ((1, 8, 2, 16), (40, 6, 2, 16), (33, 16, 4, 16), (20, 4, 3, 4), (128, 257, 9, 64)):  # fmt: skip
        ids = torch.sort(torch.rand(m, e).argsort(-1)[:, :k], -1).values
        ids[: m // 2, 0] = 0
        got, ref = moe.tiles_kernel(ids, e, block), moe.tiles_torch(ids, e, block)
        used = ref.hi > ref.lo
        assert torch.equal(got.order, ref.order) and torch.equal(got.hi > got.lo, used)
        for f in ("expert", "lo", "hi"):
            assert torch.equal(getattr(got, f)[used], getattr(ref, f)[used]), (m, f)
        if m > 1:
            planted = registry_moe._tiles_descending(ids, e, block)
            assert not torch.equal(planted.order, ref.order)


def grouped() -> None:
    """Gate and up in one launch writing silu · up, down writing each (row, choice): the bits of
    the earlier unfused form (a gathered copy, three products, silu_mul, a scatter); gate and up
    at different bits take the two-launch path."""

    x = torch.randn(40, 128).half()
    ids = torch.sort(torch.rand(40, 6).argsort(-1)[:, :2], -1).values
    ids[::3, 0] = 0
    shapes = ((64, 128), (64, 128), (128, 64))
    for bits in ((None,) * 3, (4, 4, 8), (4, 3, 8)):
        ex = ref_moe.Experts(*(expert_stack(6, n, k, b) for (n, k), b in zip(shapes, bits)))
        y = moe.expert_swiglu(x, ids, ex)
        assert torch.equal(y, moe.expert_swiglu_unfused(x, ids, ex)), bits
        assert torch.equal(moe.expert_swiglu(x[3:4], ids[3:4], ex)[0], y[3]), bits
        if bits == (4, 4, 8):  # every launch shape, narrow and swapped, on one format
            assert not registry_moe.launch_shapes_agree(x, ids, ex), bits
    # K = 2048: gate and up reduced in two segments, which every launch shape adds in order (in
    # fp32 rows, whose outputs show the sums' last bits: fp16 outputs round most of them away)
    x = torch.randn(4, 2048)
    ids = torch.sort(torch.rand(4, 4).argsort(-1)[:, :2], -1).values
    gate, up = expert_stack(4, 16, 2048, 4), expert_stack(4, 16, 2048, 4)
    tiles = moe.tiles_torch(ids, 4, 16)
    want = moe.grouped_matmul(x, gate, tiles, gather_k=2, up=up)
    for shape in (t for t in grouped_candidates(16)[1:] if not t.gluon):  # Gluon: the card's
        assert torch.equal(moe.grouped_matmul(x, gate, tiles, shape, 2, up=up), want), shape


def pair_sums() -> None:
    """The Gluon grouped products' second launch: each pair's segments added in order and rounded
    once, gate's and up's each rounded before silu · up (the gates kernel's bits), or one product
    written at each pair's (row, choice) slot."""
    from tensorfold.ops.triton.gates import silu_mul

    n, pairs = 24, 10
    part = torch.randn(3, pairs, 2 * n)
    order = torch.randperm(pairs)
    gate, up = ((part[0, :, c] + part[1, :, c]) + part[2, :, c] for c in (slice(0, n), slice(n, None)))  # fmt: skip
    got = moe.sum_pairs(part, order, n, torch.float16, swiglu=True, scatter=False)
    assert torch.equal(got, silu_mul(gate.half(), up.half()))
    got = moe.sum_pairs(part[:, :, :n].contiguous(), order, n, torch.float16, False, scatter=True)
    want = torch.empty(pairs, n, dtype=torch.float16)
    want[order] = gate.half()
    assert torch.equal(got, want)
    exact = moe.sum_pairs(part[:, :, :n].contiguous(), order, n, torch.float32, False, False)
    assert torch.equal(exact, gate)  # fp32 out: every bit of the sums in order
    planted = moe.sum_pairs(part[[0, 2, 1], :, :n].contiguous(), order, n, torch.float32, False, False)  # fmt: skip
    assert not torch.equal(planted, gate), "segments added in another order went unseen"


def combine() -> None:
    """The weighted sum: the reference's bits where the shared gate's logit is 0 (no exp), close
    elsewhere; the reversed order is seen."""
    m, k, h = 5, 8, 40
    routed, w = torch.randn(m, k, h).half(), torch.rand(m, k)
    shared, logit = torch.randn(m, h).half(), torch.randn(m, 3).half()[:, 1:2]
    zero = torch.zeros(m, 1).half()
    registry_moe.plant_cancellation(routed, w, shared)
    assert torch.equal(
        moe_rows.combine(routed, w, shared, zero), ref_moe.combine(routed, w, shared, zero)
    )
    got, ref = moe_rows.combine(routed, w, shared, logit), ref_moe.combine(routed, w, shared, logit)
    assert (got.float() - ref.float()).abs().max() < 2e-3
    planted = registry_moe._combine_rank_order(routed, w, shared, zero)
    assert not torch.equal(planted, ref_moe.combine(routed, w, shared, zero))


def joint() -> None:
    """The shared expert appended as expert E and chosen last by every row: the routed choices
    keep their bits, the shared column is the expert's own product, and the weighted sum reads
    the first k of k + 1 choices in place with the bits of contiguous copies."""
    x = torch.randn(7, 128).half()
    ids = torch.sort(torch.rand(7, 6).argsort(-1)[:, :2], -1).values
    shapes = ((64, 128), (64, 128), (128, 64))
    ex = ref_moe.Experts(*(expert_stack(6, n, k, 4) for n, k in shapes))
    alone = ref_moe.Experts(*(expert_stack(1, n, k, 4) for n, k in shapes))
    both = ref_moe.with_shared(ex, *(s.expert(0) for s in (alone.gate, alone.up, alone.down)))
    y = moe.expert_swiglu(x, torch.cat([ids, torch.full((7, 1), 6)], 1), both)
    assert torch.equal(y[:, :2], moe.expert_swiglu(x, ids, ex))
    own = moe.expert_swiglu(x, torch.zeros(7, 1, dtype=torch.long), alone)
    assert torch.equal(y[:, 2], own[:, 0])
    w, logit = torch.rand(7, 2), torch.randn(7, 1).half()
    got = moe_rows.combine(y[:, :2], w, y[:, 2], logit)
    assert torch.equal(got, moe_rows.combine(y[:, :2].contiguous(), w, own[:, 0], logit))
    wrong = moe_rows.combine(y[:, 1:], w, own[:, 0], logit)
    assert not torch.equal(got, wrong), "the wrong choices went unseen"


def main() -> None:
    interpreter_dot.install()
    torch.manual_seed(0)
    route()
    tiles()
    grouped()
    pair_sums()
    combine()
    joint()
    print("moe kernels match their references")


if __name__ == "__main__":
    main()
