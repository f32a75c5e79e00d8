"""Run under TRITON_INTERPRET=1 (by test_triton_interpret.py): products left as their segments'
fp32 sums (a Partial) and added where each part is read. A GDN layer's in-projection: by the conv
(both launch forms, its kept rows included), the gates' kernel, the recurrence computing its
gates, and the gated norm. An attention layer's q (with its output gate), k and v: by the q norm,
the keys' norm with its KV write (apart, and both in one launch), and the attention's gate (both
plans, the fold's too). An MoE block's router and shared gate: by the routing and the weighted
sum. Each gives the bytes it gives on the product's own sum. One column of every part is crafted
so that its segments' order shows ((2^24 + 1) + 1 - 2^24 is 0 in order, 2 reversed). fp16, as
the interpreter has no bf16."""

import torch

from tensorfold.batch import Segment
from tensorfold.ops import dispatch
from tensorfold.ops.attention import AttentionTiles
from tensorfold.ops.dispatch import lane_index
from tensorfold.ops.linear import Partial
from tensorfold.ops.quant import quantize
from tensorfold.ops.rope import rope_tables
from tensorfold.ops.triton import attention, conv, gates, linear, moe_rows, norm
from tensorfold.ops.triton.gated_delta import gated_delta_lanes

CONV, HK, HV, D = 3 * 64, 2, 2, 32  # q, k, v of 2 heads of 32; the conv's 192 channels
WIDTHS = [CONV, HV * D, HV, HV]  # mixed, z, a, b: the in-projection's parts, in order


def crafted(rows: int, widths: list[int] = WIDTHS) -> Partial:
    """Four segments' sums of a [rows, Σ widths] product, a crafted column in each part."""
    sums = torch.randn(4, rows, sum(widths)) * 0.3
    order = torch.tensor([2.0**24, 1.0, 1.0, -(2.0**24)])[:, None]
    for i in range(len(widths)):
        sums[:, :, sum(widths[:i])] = order
    return Partial(sums, torch.float16)


def conv_forms(mixed: Partial, stored: torch.Tensor) -> None:
    """Both launch forms, in place and into other slots: outputs and states byte-equal."""
    weight = torch.randn(CONV, 4).half() * 0.3
    segs = (Segment(2, 5, 0, 4, torch.arange(9)), Segment(0, 0, 4, 1, torch.arange(1)))
    meta = lane_index(segs, "cpu", 4)
    before = torch.randn(4, 3, CONV).half()
    index = (meta.slots, meta.conv_taps, meta.conv_keep)
    for writes in (None, torch.tensor([1, 3])):
        for bounds in ((None, 0), (meta.cu_seqlens, meta.most_rows)):
            want_states, got_states = before.clone(), before.clone()
            want = conv.conv_lanes(stored, want_states, weight, *index, writes, *bounds)
            got = conv.conv_lanes(mixed, got_states, weight, *index, writes, *bounds)
            assert torch.equal(got, want) and torch.equal(got_states, want_states), bounds


def gate_reads(a: Partial, b: Partial, a_s: torch.Tensor, b_s: torch.Tensor) -> None:
    """The gates' kernel, and the recurrence computing them: the same bytes either way."""
    a_log, dt = torch.randn(HV), torch.randn(HV).half()
    want = gates.gdn_gates(a_s, b_s, a_log, dt)
    assert all(map(torch.equal, gates.gdn_gates(a, b, a_log, dt), want))
    assert all(map(torch.equal, dispatch.GateInputs(a, b, a_log, dt).values(), want))
    rows = a_s.shape[0]
    q, k = (torch.randn(rows, HK, D).half() for _ in "qk")
    v = torch.randn(rows, HV, D).half()
    lanes = (torch.tensor([0, 2]), torch.tensor([0, 3, rows]))
    apart, inside = torch.zeros(3, HV, D, D), torch.zeros(3, HV, D, D)
    expect = gated_delta_lanes(q, k, v, a_s, b_s, apart, *lanes, gate_params=(a_log, dt))
    got = gated_delta_lanes(q, k, v, a, b, inside, *lanes, gate_params=(a_log, dt))
    assert torch.equal(got, expect) and torch.equal(inside, apart)


def product_parts() -> None:
    """A real packed product's Partial, split as the layer splits it: every reader's bytes."""
    x = (torch.randn(5, 4096) * 0.5).half()
    n = sum(WIDTHS)
    words, s, b = quantize(torch.randn(n, 4096) * 0.05, 4, 64)
    plan = linear.LinearPlan.for_weight(n, 4096, 64)
    assert plan.segments(4096) >= 2

    def product(keep):
        return linear.affine_matmul(x, words, s.half(), b.half(), 4, 64, plan, keep=keep)

    kept, stored = product(True), product(False)
    assert isinstance(kept, Partial)
    check_parts(kept, stored)


def check_parts(kept: Partial, stored: torch.Tensor) -> None:
    mixed, z, a, b = kept.split(WIDTHS)
    mixed_s, z_s, a_s, b_s = stored.split(WIDTHS, dim=-1)
    conv_forms(mixed, mixed_s)
    gate_reads(a, b, a_s, b_s)
    rows = stored.shape[0]
    core = torch.randn(rows, HV, D).half()
    w = torch.rand(D) + 0.5
    want = norm.gated_rms_norm(core, z_s.view(rows, HV, D), w, 1e-6)
    assert torch.equal(norm.gated_rms_norm(core, z.view(rows, HV, D), w, 1e-6), want)


def router() -> None:
    """The router's logits and the shared gate's (one product): the routing and the weighted sum
    read from the sums give the ids, weights and outputs they give from the stored product."""
    rows, experts, k, h = 6, 16, 4, 64
    kept = crafted(rows, [experts, 1])
    logits, logit = kept.split([experts, 1])
    stored = dispatch.total(kept)
    want = moe_rows.route(stored[:, :experts], k)
    got = moe_rows.route(logits, k)
    assert torch.equal(got.ids, want.ids) and torch.equal(got.weights, want.weights)
    joint = dispatch.moe_route(logits, k, last=experts)
    assert torch.equal(joint.ids, moe_rows.route(stored[:, :experts], k, last=experts).ids)
    routed, shared = torch.randn(rows, k, h).half(), torch.randn(rows, h).half()
    want = moe_rows.combine(routed, want.weights, shared, stored[:, experts:])
    assert torch.equal(moe_rows.combine(routed, got.weights, shared, logit), want)
    assert torch.equal(dispatch.moe_combine(routed, got.weights, shared, logit), want)


def attention_reads() -> None:
    """q_proj's [query | gate] a head, k and v as one product's sums, read as the layer reads them:
    24 rows at positions 276-299, over two super-blocks of keys (the split plan then folds)."""
    n, hq, hkv, d = 24, 8, 2, 32
    kc, vc = torch.randn(364, hkv, d).half(), torch.randn(364, hkv, d).half()
    tiles = AttentionTiles.build((Segment(0, 276, 0, n, torch.randperm(364)[:300]),), "cpu")
    widths = [hq * 2 * d, hkv * d, hkv * d]
    kept = crafted(n, widths)
    for head in range(hq):  # each head's first gate column crafted too
        kept.sums[:, :, head * 2 * d + d] = kept.sums[:, :, 0]
    stored = dispatch.total(kept).split(widths, dim=-1)
    parts = kept.split(widths)
    want_q, want_g = stored[0].view(n, hq, 2 * d).split([d, d], dim=-1)
    got_q, got_g = parts[0].view(n, hq, 2 * d).split([d, d], dim=-1)
    w = torch.rand(d) + 0.5
    cos, sin = rope_tables(torch.arange(n) + 5, 8, 10000.0, torch.float16)
    want = norm.norm_rope(want_q, w, 1e-6, 1.0, cos, sin)
    assert torch.equal(norm.norm_rope(got_q, w, 1e-6, 1.0, cos, sin), want)
    for plan in ("serial", "split"):
        expect = attention.paged_attention(want, kc, vc, tiles, d**-0.5, gate=want_g, plan=plan)
        got = attention.paged_attention(want, kc, vc, tiles, d**-0.5, gate=got_g, plan=plan)
        assert torch.equal(got, expect), plan
    rows = torch.randperm(64)[:n]
    caches = [tuple(torch.zeros(64, hkv, d).half() for _ in "kv") for _ in "1234"]
    k, v = (t.view(n, hkv, d) for t in stored[1:])
    norm.norm_rope_cached(k, v, w, 1e-6, 1.0, cos, sin, caches[0], rows)
    assert torch.equal(caches[0][1][rows], stored[2].view(n, hkv, d))  # the values, copied
    wk = torch.rand(d) + 0.5
    norm.norm_rope_cached(k, v, wk, 1e-6, 1.0, cos, sin, caches[2], rows)
    # the q and k norms in one launch: q and the caches as the two launches leave them
    assert norm.qk_fusable(want_q, k, v, caches[3])
    fused = norm.qk_norm_rope(want_q, k, v, (w, wk), 1e-6, 1.0, cos, sin, caches[3], rows)
    assert torch.equal(fused, want) and all(map(torch.equal, caches[3], caches[2]))
    k, v = (t.view(n, hkv, d) for t in parts[1:])
    norm.norm_rope_cached(k, v, w, 1e-6, 1.0, cos, sin, caches[1], rows)
    assert all(map(torch.equal, caches[0], caches[1]))
    caches[3][0].zero_(), caches[3][1].zero_()
    assert norm.qk_fusable(got_q, k, v, caches[3])
    fused = dispatch.qk_norm_rope(got_q, k, v, (w, wk), 1e-6, 1.0, (cos, sin), caches[3], rows)
    assert torch.equal(fused, want) and all(map(torch.equal, caches[3], caches[2]))
    assert not norm.qk_fusable(got_q, *(t.view(n, hkv, d) for t in stored[1:]), caches[3])


def main() -> None:
    torch.manual_seed(0)
    kept = crafted(5)
    stored = dispatch.total(kept)
    assert stored[:, 0].tolist() == [0.0] * 5  # the crafted column, in order
    check_parts(kept, stored)
    product_parts()
    # a and b of two plans (two products): each summed first, then the gates' one kernel
    a = kept.split(WIDTHS)[2]
    other = Partial(torch.randn(2, 5, HV) * 0.3, torch.float16)
    pair = dispatch.gdn_gates(a, other, torch.randn(HV), torch.randn(HV).half(), torch.float32)
    assert all(isinstance(t, torch.Tensor) for t in (pair.a, pair.b))
    router()
    attention_reads()
    print("segment sums read where they are used")


if __name__ == "__main__":
    main()
