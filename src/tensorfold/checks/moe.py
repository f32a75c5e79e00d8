"""The registry's mixture-of-experts entries (checks/registry.py runs them): the routing kernel,
the tile table, the grouped expert products and the weighted sum, each with planted faults that
its check must catch."""

from __future__ import annotations

from typing import Callable

import torch

from ..ops import moe as ref_moe
from ..ops.quant import dequantize, quantize
from ..ops.triton import moe, moe_rows
from ..ops.triton.tiles import LinearPlan, grouped_block_m, grouped_candidates


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _router_logits(m: int, e: int) -> torch.Tensor:
    """bf16 logits with planted ties: every fourth row has ten equal largest logits (the k-th
    place is a tie), one row is all equal."""
    x = torch.randn(m, e, device="cuda").to(torch.bfloat16)
    for r in range(0, m, 4):
        x[r, torch.randperm(e, device="cuda")[:10]] = 4.0
    x[m // 2] = 0.25
    return x


def check_route(impl, small: bool) -> list[str]:
    e, k = (64, 4) if small else (256, 8)
    x = _router_logits(300, e)
    got, ref = impl(x, k), ref_moe.route(x.cpu(), k)
    bad = []
    if not torch.equal(got.ids.cpu(), ref.ids):
        bad.append("chosen experts differ from the reference (ties to the lowest id)")
    if rel(got.weights.cpu(), ref.weights) > 1e-5:
        bad.append("weights off the reference")
    alone = impl(x[7:8], k)
    for m in (2, 7, 64, 300):
        xm = x[:m].clone()
        xm[m - 1] = x[7]
        among = impl(xm, k)
        if not (
            torch.equal(among.ids[m - 1], alone.ids[0])
            and torch.equal(among.weights[m - 1], alone.weights[0])
        ):
            bad.append(f"a row among {m} differs from the row alone")
    return bad


def _route_highest(logits: torch.Tensor, top_k: int) -> ref_moe.Route:
    """Planted: ties broken by the highest expert id."""
    e = logits.shape[1]
    r = moe_rows.route(logits.flip(1), top_k)
    ids = (e - 1) - r.ids
    order = torch.sort(ids, dim=1)
    return ref_moe.Route(order.values, r.weights.gather(1, order.indices))


def check_tiles(impl, small: bool) -> list[str]:
    bad = []
    for pairs, e, k, block in ((1, 256, 1, 16), (8, 256, 8, 16), (128, 256, 8, 16), (400, 16, 4, 16), (1000, 256, 8, 64), (1152, 257, 9, 64)):  # fmt: skip
        m = pairs // k
        ids = torch.sort(torch.rand(m, e, device="cuda").argsort(-1)[:, :k], -1).values
        ids[: m // 2, 0] = 0  # one expert serves half the rows
        got, ref = impl(ids, e, block), moe.tiles_torch(ids, e, block)
        used = ref.hi > ref.lo
        same = torch.equal(got.order, ref.order) and torch.equal(got.hi > got.lo, used)
        for f in ("expert", "lo", "hi"):
            same = same and torch.equal(getattr(got, f)[used], getattr(ref, f)[used])
        if not same:
            bad.append(f"the table of {m} rows x top-{k} of {e} differs from tiles_torch")
    return bad


def _tiles_descending(ids: torch.Tensor, num_experts: int, block_m: int) -> moe.ExpertTiles:
    """Planted: pairs of one expert in descending slot order (an unstable sort)."""
    t = moe.tiles_kernel(ids, num_experts, block_m)
    key = ids.reshape(-1)[t.order] * ids.numel() - t.order
    return moe.ExpertTiles(t.order[torch.argsort(key)], t.expert, t.lo, t.hi, block_m)


def _experts(e: int, h: int, inter: int, bits: int | None) -> ref_moe.Experts:
    def stack(n, k):
        w = torch.randn(e, n, k, device="cuda") * k**-0.5
        if bits is None:
            return ref_moe.ExpertStack(w.to(torch.bfloat16))
        packed, s, b = quantize(w, bits, 64)
        return ref_moe.ExpertStack(packed, s.to(torch.bfloat16), b.to(torch.bfloat16), bits, 64)

    return ref_moe.Experts(stack(inter, h), stack(inter, h), stack(h, inter))


def _dense(stack: ref_moe.ExpertStack, e: int) -> torch.Tensor:
    w = stack.expert(e)
    if not stack.packed:
        return w.float()
    return dequantize(w.packed, w.scales, w.biases, w.bits, w.group_size, torch.float32)


def check_grouped(impl, small: bool) -> list[str]:
    e, h, inter, k = (16, 256, 128, 4) if small else (256, 2048, 512, 8)
    bad = []
    for bits in (None, 4, 8):
        ex = _experts(e, h, inter, bits)
        x = torch.randn(300, h, device="cuda").to(torch.bfloat16)
        ids = torch.sort(torch.rand(300, e, device="cuda").argsort(-1)[:, :k], -1).values
        ids[::3, :2] = ids[0, :2]  # a third of the rows share row 0's first two experts
        y = impl(x, ids, ex)
        if not torch.equal(y, moe.expert_swiglu_unfused(x, ids, ex)):
            bad.append(f"bits {bits}: not the unfused form's bits (rounding points moved)")
        if not torch.equal(impl(x[:3], ids[:3], ex), moe.expert_swiglu_unfused(x[:3], ids[:3], ex)):
            bad.append(f"bits {bits}: a decode-sized pass off the unfused form's bits")
        r, j = 5, 1
        ref_h = torch.nn.functional.silu(x[r].float() @ _dense(ex.gate, int(ids[r, j])).t())
        ref_h = ref_h * (x[r].float() @ _dense(ex.up, int(ids[r, j])).t())
        if rel(y[r, j], ref_h @ _dense(ex.down, int(ids[r, j])).t()) > 2e-2:
            bad.append(f"bits {bits}: an expert's output off the float reference")
        alone = impl(x[:1], ids[:1], ex)[0]
        for m in (2, 7, 64, 300):
            if not torch.equal(impl(x[:m], ids[:m], ex)[0], alone):
                bad.append(f"bits {bits}: row 0 among {m} differs from the row alone")
        if impl is moe.expert_swiglu:
            bad += launch_shapes_agree(x, ids, ex)
    return bad


class FixedShape:
    """A tile book that always picks one launch shape (the checks run every candidate)."""

    def __init__(self, shape) -> None:
        self.shape = shape

    def pick(self, key, m, packed, run, options=None):
        return self.shape


def launch_shapes_agree(x, ids, experts) -> list[str]:
    """Every launch shape the tile book may pick for the grouped products (narrow columns, the
    swapped form) gives the default's bytes, for a decode-sized pass and a prompt-sized one."""
    bad = []
    for m in (3, x.shape[0]):
        want = moe.expert_swiglu(x[:m], ids[:m], experts)
        for t in grouped_candidates(grouped_block_m(m * ids.shape[1]))[1:]:
            if t.gluon and not x.is_cuda:  # off the card it runs the swapped form, checked too
                continue
            got = moe.expert_swiglu(x[:m], ids[:m], experts, FixedShape(t))
            if not torch.equal(got, want):
                bad.append(f"{m} rows under {t} differ from the default launch shape")
    return bad


def _grouped_cublas_shared(x, ids, experts):
    """Planted: an expert serving several rows runs them as one cuBLAS product (its bits then
    follow the tile's row count)."""
    out = moe.expert_swiglu(x, ids, experts).clone()
    for e in torch.unique(ids).tolist():
        rows, cols = (ids == e).nonzero(as_tuple=True)
        if rows.numel() > 1:
            xe = x[rows]
            g, u = (xe @ _dense(s, e).to(x.dtype).t() for s in (experts.gate, experts.up))
            hh = torch.nn.functional.silu(g) * u
            out[rows, cols] = hh @ _dense(experts.down, e).to(x.dtype).t()
    return out


def _grouped_unrounded(x, ids, experts):
    """Planted: silu(gate) · up from the fp32 products (not rounded to the model dtype first)."""
    m, k = ids.shape
    tiles = moe.tiles_torch(ids, experts.num_experts, grouped_block_m(m * k))
    xs = x[tiles.order // k].float()
    chosen = ids.reshape(-1)[tiles.order]
    g, u = torch.empty(2, xs.shape[0], experts.gate.shape[0], device=x.device)
    for e in torch.unique(chosen).tolist():
        at = chosen == e
        g[at], u[at] = (xs[at] @ _dense(s, e).t() for s in (experts.gate, experts.up))
    h = (torch.nn.functional.silu(g) * u).to(x.dtype)
    y = moe.grouped_matmul(h, experts.down, tiles)
    out = torch.empty_like(y)
    out[tiles.order] = y
    return out.view(m, k, -1)


def _grouped_gluon_two_chains(x, ids, experts):
    """Planted: the Gluon grouped gate and up (few pairs an expert) with each segment summed as
    two chains, then added; passes the Gluon kernel does not run take the default."""
    m, k = ids.shape
    tiles = moe.expert_tiles(ids, experts.num_experts, grouped_block_m(m * k))
    gate = experts.gate
    segment = LinearPlan.for_weight(*gate.shape, gate.group_size if gate.packed else None).segment
    grouped = moe.gluon_grouped
    if grouped is None or not grouped.applies(x, gate, tiles.block_m, segment):
        return moe.expert_swiglu(x, ids, experts)
    part = grouped.partials(x, gate, tiles, segment, k, experts.up, fault=2)
    h = moe.sum_pairs(part, tiles.order, gate.shape[0], x.dtype, swiglu=True, scatter=False)
    return moe.grouped_matmul(h, experts.down, tiles, scatter=True).view(m, k, -1)


def check_combine(impl, small: bool) -> list[str]:
    m, k, h = 300, 8, 512 if small else 2048
    routed = torch.randn(m, k, h, device="cuda").to(torch.bfloat16)
    w = torch.rand(m, k, device="cuda")
    shared = torch.randn(m, h, device="cuda").to(torch.bfloat16)
    logits = torch.randn(m, 3, device="cuda").to(torch.bfloat16)[:, 1:2]  # a column of a product
    plant_cancellation(routed, w, shared)
    got = impl(routed, w, shared, logits)
    ref = ref_moe.combine(routed.cpu(), w.cpu(), shared.cpu(), logits.cpu())
    bad = []
    # the sum's order and roundings are the contract's: at most a one-step rounding difference
    # (the sigmoid's exp), and exactly equal where the shared gate's logit is zero
    if rel(got.cpu().float(), ref.float()) > 2e-3:
        bad.append("the sum off the reference")
    exp_free = (torch.zeros_like(logits), torch.zeros_like(logits).cpu())
    if not torch.equal(
        impl(routed, w, shared, exp_free[0]).cpu(),
        ref_moe.combine(routed.cpu(), w.cpu(), shared.cpu(), exp_free[1]),
    ):
        bad.append("the sum's order or roundings differ from the reference")
    for n in (2, 7, 64, 300):
        last = slice(n - 1, n)
        alone = impl(routed[last], w[last], shared[last], logits[last])[0]
        if not torch.equal(impl(routed[:n], w[:n], shared[:n], logits[:n])[n - 1], alone):
            bad.append(f"a row among {n} differs from the row alone")
    return bad


def plant_cancellation(routed: torch.Tensor, w: torch.Tensor, shared: torch.Tensor) -> None:
    """Row 0 becomes 1024 - 1024 + 1e-5 (unit weights, no shared expert): 1e-5 in ascending
    order, 0 in any order that adds 1e-5 to ±1024 first."""
    routed[0], w[0], shared[0] = 0.0, 1.0, 0.0
    routed[0, 0], routed[0, 1], routed[0, 2] = 1024.0, -1024.0, 1e-5


def _combine_rank_order(routed, weights, shared, shared_logit):
    """Planted: the experts summed in the reverse order."""
    return moe_rows.combine(routed.flip(1), weights.flip(1), shared, shared_logit)


ENTRIES: list[tuple[str, str, str, str, Callable]] = [  # (name, reference, shapes, rule, check)
    ("moe.route", "ops.moe.route", "E <= 1024, any top-k", "exact ids, ref 1e-5, rows", check_route),
    ("moe.tiles", "moe.tiles_torch", "<= 1152 pairs", "exact", check_tiles),
    ("moe.grouped", "the unfused grouped form", "35B-A3B, bf16 and 4-bit", "exact, ref 2e-2, rows", check_grouped),
    ("moe.combine", "ops.moe.combine", "any width, top-k", "exact at gate 0, ref 2e-3, rows", check_combine),
]  # fmt: skip
IMPLS = {
    "moe.route": moe_rows.route,
    "moe.tiles": moe.tiles_kernel,
    "moe.grouped": moe.expert_swiglu,
    "moe.combine": moe_rows.combine,
}
CONTROLS = [
    ("moe.route", "ties broken by the highest id", _route_highest),
    ("moe.tiles", "an unstable sort within an expert", _tiles_descending),
    ("moe.grouped", "a shared expert's rows as one cuBLAS product", _grouped_cublas_shared),
    ("moe.grouped", "silu · up from unrounded products", _grouped_unrounded),
    ("moe.grouped", "Gluon's segments summed as two chains", _grouped_gluon_two_chains),
    ("moe.combine", "the experts summed in reverse order", _combine_rank_order),
]
