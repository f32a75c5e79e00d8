"""The GPU kernel registry: every kernel with its plain-torch reference, the shapes it serves, its
rule, and planted faulty variants that the checks must catch.

    python -m tensorfold.checks.registry [--small]

Rules: "ref" = relative error against the reference in fp32/fp64 under a bound; "rows" = a row's
bytes equal alone and among 2, 7, 64 or 4,000 other rows at any position; "chunks" = bytes equal
however a sequence is cut into calls; "decode" = a decode row equals the same row in a prompt pass.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Callable

import torch
from triton.runtime.errors import OutOfResources

from ..batch import Segment
from ..ops import conv as ref_conv
from ..ops import gates as ref_gates
from ..ops import norm as ref_norm
from ..ops.dispatch import lane_index
from ..ops.quant import dequantize, quantize
from ..ops.triton import conv as tconv
from ..ops.triton import gates as tgates
from ..ops.triton import linear, norm
from . import attention as registry_attention
from . import fused as registry_fused
from . import gdn as registry_gdn
from . import gluon as registry_gluon
from . import moe as registry_moe
from .controls import CONTROLS as DENSE_CONTROLS
from .moe import rel as _rel


@dataclass(frozen=True)
class Kernel:
    name: str
    reference: str
    shapes: str
    rule: str
    check: Callable[..., list[str]]  # check(impl, small) -> failures


def _rows_invariant(
    fn: Callable[[torch.Tensor], torch.Tensor],
    make: Callable[[int], torch.Tensor],
    counts=(2, 7, 64, 4000),
) -> list[str]:
    row = make(1)
    alone = fn(row)[0]
    bad = []
    for m in counts:
        x = make(m)
        for pos in sorted({0, m // 2, m - 1}):
            x[pos] = row[0]
            if not torch.equal(fn(x)[pos], alone):
                bad.append(f"row at {pos} of {m} differs from the row alone")
    return bad


def check_dense(impl, small: bool) -> list[str]:
    n, k = (96, 128) if small else (4096, 4096)
    dev, dt = "cuda", torch.bfloat16
    w = torch.randn(n, k, device=dev).to(dt)
    plan = linear.LinearPlan.for_weight(n, k)
    x = torch.randn(40, k, device=dev).to(dt)
    out = torch.full(
        (40, n), float("nan"), device=dev, dtype=dt
    )  # poisoned: every element must be written
    y = impl(x, w, plan, out)
    bad = (
        []
        if _rel(y.float(), x.float() @ w.float().t()) < 1e-2
        else ["dense product off the reference"]
    )
    counts = (2, 7, 64) if small else (2, 7, 64, 4000)
    make = lambda m: torch.randn(m, k, device=dev).to(dt)  # noqa: E731
    if impl is linear.dense_matmul:
        bad += _tiles_invariant(lambda t, tiles: impl(t, w, plan, tiles=tiles), make, packed=False)
    return bad + _rows_invariant(lambda t: impl(t, w, plan, None), make, counts)


def _tiles_invariant(run, make, packed: bool) -> list[str]:
    """Every launch shape the tile book may pick (or a benchmark's book may time: the untried
    ones) gives the default shape's bytes."""
    bad = []
    for m in (1, 40, 100, 300, 600):  # one row count of each rows class
        x = make(m)
        ref = run(x, None)
        shapes = linear.candidates(m, packed, held=packed)  # held: the dequantize-first too
        for t in shapes + (linear.untried(m) if packed else []):
            try:
                y = run(x, t)
            except (
                OutOfResources
            ):  # not a choice: the tile book skips shapes the card cannot launch
                continue
            if not torch.equal(y, ref):
                bad.append(f"{m} rows under {t} differ from the default tiles")
    return bad


# formats whose every launch shape is checked against the default (the 9B files' formats)
TILE_CHECKED = ((3, 64), (4, 32), (4, 64), (4, 128), (6, 64), (8, 64))


def check_affine(impl, small: bool) -> list[str]:
    n, k = (64, 256) if small else (1024, 2048)
    bad = []
    for bits in (2, 3, 4, 5, 6, 8):
        for gs in (32, 64, 128):
            if bad and impl is not linear.affine_matmul:  # a planted fault is caught: enough
                return bad
            packed, scales, biases = quantize(torch.randn(n, k), bits, gs)
            packed, scales, biases = (
                packed.cuda(),
                scales.to("cuda", torch.bfloat16),
                biases.to("cuda", torch.bfloat16),
            )
            plan = linear.LinearPlan.for_weight(n, k, gs)
            run = lambda t: impl(t, packed, scales, biases, bits, gs, plan)  # noqa: E731
            x = torch.randn(24, k, device="cuda").to(torch.bfloat16)
            ref = (
                x.float() @ dequantize(packed, scales, biases, bits, gs, torch.bfloat16).float().t()
            )
            if _rel(run(x).float(), ref) > 1e-2:
                bad.append(f"{bits}-bit g{gs} product off the reference")
            w = linear.dequantize(
                packed.view(torch.int32), scales, biases, bits, gs, torch.bfloat16
            )
            if _rel(w.float(), dequantize(packed, scales, biases, bits, gs, torch.float32)) > 1e-2:
                bad.append(f"{bits}-bit g{gs} dequantized weights off the reference")
            make = lambda m: torch.randn(m, k, device="cuda").to(torch.bfloat16)  # noqa: E731
            bad += [f"{bits}-bit g{gs}: {b}" for b in _rows_invariant(run, make, (2, 7, 64, 300))]
            if impl is linear.affine_matmul and (bits, gs) in TILE_CHECKED:
                bad += _tiles_invariant(
                    lambda t, tiles: impl(
                        t,
                        packed,
                        scales,
                        biases,
                        bits,
                        gs,
                        plan,  # noqa: B023
                        tiles=tiles,
                    ),
                    make,
                    packed=True,
                )
    return bad


def check_norms(impl_pair, small: bool) -> list[str]:
    rms, gated = impl_pair
    w = 1024 if small else 4096
    weight = torch.randn(w, device="cuda") * 0.1
    x = torch.randn(33, w, device="cuda").to(torch.bfloat16)
    z = torch.randn(33, w, device="cuda").to(torch.bfloat16)
    bad = []
    if (
        _rel(rms(x, weight, 1e-6, 1.0).float(), ref_norm.rms_norm(x.float(), weight, 1e-6, 1.0))
        > 1e-2
    ):
        bad.append("rms_norm off the reference")
    if (
        _rel(
            gated(x, z, weight, 1e-6).float(),
            ref_norm.gated_rms_norm(x.float(), z.float(), weight, 1e-6),
        )
        > 1e-2
    ):
        bad.append("gated_rms_norm off the reference")
    make = lambda m: torch.randn(m, w, device="cuda").to(torch.bfloat16)  # noqa: E731
    bad += _rows_invariant(lambda t: rms(t, weight, 1e-6, 1.0), make, (2, 7, 64))
    h2, y = norm.add_rms_norm(x, z, weight, 1e-6, 1.0)
    if (
        not torch.equal(h2, x + z)
        or _rel(y.float(), ref_norm.rms_norm((x + z).float(), weight, 1e-6, 1.0)) > 1e-2
    ):
        bad.append("add_rms_norm off the reference")
    return bad + _check_norm_rope()


def _check_norm_rope() -> list[str]:
    from ..ops.rope import apply_rope, rope_tables

    weight = torch.randn(256, device="cuda") * 0.1
    pos = torch.arange(40, device="cuda") * 97
    cos, sin = rope_tables(pos, 64, 1e7, torch.bfloat16)
    qg = torch.randn(40, 16, 512, device="cuda").to(torch.bfloat16)
    out = norm.norm_rope(qg[..., :256], weight, 1e-6, 1.0, cos, sin)
    want = apply_rope(
        ref_norm.rms_norm(qg[..., :256].float(), weight, 1e-6, 1.0).to(torch.bfloat16), cos, sin
    )
    bad = [] if _rel(out.float(), want.float()) < 1e-2 else ["norm_rope off the reference"]
    for r in (0, 17, 39):
        if not torch.equal(
            norm.norm_rope(
                qg[r : r + 1, :, :256], weight, 1e-6, 1.0, cos[r : r + 1], sin[r : r + 1]
            ),
            out[r : r + 1],
        ):
            bad.append(f"norm_rope row {r} alone differs")
    return bad + _keys_into_cache(qg, weight, cos, sin, out)


def _keys_into_cache(qg, weight, cos, sin, out) -> list[str]:
    """Keys (the first half of each head) and values (the second) written to 40 of 64 KV rows in
    the key norm's launch: the keys' bytes are norm_rope's, the values copied, no other row."""
    caches = (torch.zeros(64, 16, 256, device="cuda", dtype=qg.dtype) for _ in range(2))
    caches = tuple(caches)
    rows = torch.randperm(64, device="cuda")[:40]
    norm.norm_rope_cached(qg[..., :256], qg[..., 256:], weight, 1e-6, 1.0, cos, sin, caches, rows)
    untouched = torch.ones(64, dtype=torch.bool, device="cuda")
    untouched[rows] = False
    same = torch.equal(caches[0][rows], out) and torch.equal(caches[1][rows], qg[..., 256:])
    if not (same and not caches[0][untouched].any() and not caches[1][untouched].any()):
        return ["keys and values written in the norm's launch differ from norm_rope's and v"]
    return []


def _conv_case(small: bool):
    c = 256 if small else 8192
    weight = (torch.randn(c, 4, device="cuda") * 0.3).to(torch.bfloat16)
    x = torch.randn(40, c, device="cuda").to(torch.bfloat16)
    return weight, x, torch.zeros(3, 3, c, device="cuda", dtype=torch.bfloat16)


def _conv_call(impl, x, states, weight, segments):
    lanes = lane_index(segments, "cuda", weight.shape[1])
    return impl(x, states, weight, lanes.slots, lanes.conv_taps, lanes.conv_keep)


def check_conv(impl, small: bool) -> list[str]:
    weight, x, states = _conv_case(small)
    ref_states = states.clone()
    seg = lambda start, n, row0=0, slot=1: Segment(slot, start, row0, n, torch.arange(start + n))  # noqa: E731
    whole = _conv_call(impl, x, states, weight, (seg(0, 40),))
    lanes = lane_index((seg(0, 40),), "cuda", weight.shape[1])
    ref = ref_conv.causal_conv_lanes(
        x, ref_states, weight, lanes.slots, lanes.conv_taps, lanes.conv_keep
    )
    bad = [] if _rel(whole.float(), ref.float()) < 1e-2 else ["conv off the reference"]
    if not torch.equal(states[1], ref_states[1]):
        bad.append("conv state differs from the reference's")
    end = states[1].clone()
    states.zero_()
    parts = []
    for start in range(0, 40, 7):  # the same rows in chunks of 7, beside another lane
        n = min(7, 40 - start)
        other = x[:3]
        both = torch.cat([other, x[start : start + n]])
        out = _conv_call(impl, both, states, weight, (seg(0, 3, 0, 2), seg(start, n, 3, 1)))
        states[2].zero_()
        parts.append(out[3:])
    if not (torch.equal(torch.cat(parts), whole) and torch.equal(states[1], end)):
        bad.append("chunks of 7 beside another lane differ from one call")
    return bad + _conv_writes(impl, x, weight, whole, end) + _conv_one_launch(impl, x, weight)


def _conv_one_launch(impl, x, weight) -> list[str]:
    """Lanes of 1, 5 and 8 rows (decode and verify passes) in one launch against two: the same
    outputs and states, in place and left in other slots."""
    seg = lambda slot, row0, n: Segment(slot, 9, row0, n, torch.arange(9 + n))  # noqa: E731
    segments = (seg(0, 0, 1), seg(2, 1, 5), seg(4, 6, 8))
    lanes = lane_index(segments, "cuda", weight.shape[1])
    index = (lanes.slots, lanes.conv_taps, lanes.conv_keep)
    start = torch.randn(6, 3, x.shape[1], device="cuda").to(x.dtype)
    bad = []
    for writes in (None, torch.tensor([1, 3, 5], device="cuda")):
        two, one = start.clone(), start.clone()
        want = impl(x[:14], two, weight, *index, writes=writes)
        bounds = {"cu_seqlens": lanes.cu_seqlens, "most_rows": lanes.most_rows}
        got = impl(x[:14], one, weight, *index, writes=writes, **bounds)
        if not (torch.equal(got, want) and torch.equal(one, two)):
            bad.append(f"one launch differs from two (writes {writes is not None})")
    return bad


def _conv_writes(impl, x, weight, whole, end) -> list[str]:
    """The last 12 rows read from slot 1 and the state left in slot 2 (a verify pass's spare):
    the same outputs and state as in place, slot 1 as the rows before left it."""
    states = torch.zeros(3, 3, x.shape[1], device="cuda", dtype=x.dtype)
    seg = lambda start, n: Segment(1, start, 0, n, torch.arange(start + n))  # noqa: E731
    first = _conv_call(impl, x[:28], states, weight, (seg(0, 28),))
    kept = states[1].clone()
    lanes = lane_index((replace(seg(28, 12), writes=2),), "cuda", weight.shape[1])
    index = (lanes.slots, lanes.conv_taps, lanes.conv_keep)
    second = impl(x[28:], states, weight, *index, writes=lanes.writes)
    same = torch.equal(torch.cat([first, second]), whole) and torch.equal(states[2], end)
    if not (same and torch.equal(states[1], kept)):
        return ["the conv state left in another slot differs from the state in place"]
    return []


def check_small_fused(impl_pair, small: bool) -> list[str]:
    gates, silu_mul = impl_pair
    h, w = (8, 512) if small else (32, 12288)
    a = torch.randn(50, h, device="cuda").to(torch.bfloat16)
    b = torch.randn(50, h, device="cuda").to(torch.bfloat16)
    a_log, dt = torch.randn(h, device="cuda"), torch.randn(h, device="cuda").to(torch.bfloat16)
    g, beta = gates(a, b, a_log, dt)
    rg, rbeta = ref_gates.gdn_gates(a, b, a_log, dt, torch.float32)
    bad = (
        []
        if _rel(g, rg) < 1e-5 and _rel(beta.float(), rbeta.float()) < 1e-2
        else ["gates off the reference"]
    )
    gu = torch.randn(50, 2 * w, device="cuda").to(torch.bfloat16)
    if (
        _rel(
            silu_mul(gu[:, :w], gu[:, w:]).float(), ref_gates.silu_mul(gu[:, :w], gu[:, w:]).float()
        )
        > 1e-2
    ):
        bad.append("silu_mul off the reference")
    make_a = lambda m: torch.randn(m, h, device="cuda").to(torch.bfloat16)  # noqa: E731
    bad += _rows_invariant(lambda t: gates(t, t, a_log, dt)[0], make_a, (2, 7, 64))
    make = lambda m: torch.randn(m, 2 * w, device="cuda").to(torch.bfloat16)  # noqa: E731
    return bad + _rows_invariant(lambda t: silu_mul(t[:, :w], t[:, w:]), make, (2, 7, 64))


KERNELS = [
    Kernel(
        "linear.dense",
        "x.float() @ w.float().T",
        "bf16 [M, K] x [N, K], K % 64 == 0",
        "ref 1e-2, rows",
        check_dense,
    ),
    Kernel(
        "linear.affine",
        "x @ ops.quant.dequantize(...).T",
        "2/3/4/5/6/8 bits, groups 32/64/128",
        "ref 1e-2, rows",
        check_affine,
    ),
    Kernel("norm.rms+gated", "ops.norm (fp32)", "any width", "ref 1e-2, rows", check_norms),
    Kernel(
        "conv",
        "ops.conv.causal_conv_lanes",
        "any lanes and rows, K = 4",
        "ref 1e-2, chunks",
        check_conv,
    ),
    Kernel("gates+silu", "ops.gates", "any width", "ref 1e-2, rows", check_small_fused),
]
KERNELS += [
    Kernel(*entry)
    for entry in registry_attention.ENTRIES
    + registry_gdn.ENTRIES
    + registry_moe.ENTRIES
    + registry_gluon.ENTRIES
    + registry_fused.ENTRIES
]


CONTROLS = (
    DENSE_CONTROLS
    + registry_attention.CONTROLS
    + registry_moe.CONTROLS
    + registry_gluon.CONTROLS
    + registry_fused.CONTROLS
)
IMPLS = {
    **registry_gluon.IMPLS,
    **registry_fused.IMPLS,
    **registry_attention.IMPLS,
    **registry_gdn.IMPLS,
    **registry_moe.IMPLS,
    "linear.dense": linear.dense_matmul,
    "linear.affine": linear.affine_matmul,
    "norm.rms+gated": (norm.rms_norm, norm.gated_rms_norm),
    "conv": tconv.conv_lanes,
    "gates+silu": (tgates.gdn_gates, tgates.silu_mul),
}


def _checked(check, impl, small: bool) -> list[str]:
    """A kernel that cannot run fails its check (with the reason) instead of ending the run."""
    try:
        return check(impl, small)
    except Exception as e:  # noqa: BLE001 - reported as the kernel's failure
        return [f"raised {type(e).__name__}: {str(e)[:160]}"]


def names() -> list[str]:
    """Every kernel's name, in the registry's order."""
    return [k.name for k in KERNELS]


def run_all(
    small: bool = False, echo: bool = False, only: str = "", exact: bool = False
) -> tuple[list[str], bool]:
    """Every kernel's check, then every planted control's; `echo` prints each line when known;
    `only` keeps the kernels whose name starts with it (`exact`: whose name is it) and their
    controls."""
    lines, ok = [], True

    def kept(name: str) -> bool:
        return name == only if exact else name.startswith(only)

    kernels = [k for k in KERNELS if kept(k.name)]
    controls = [c for c in CONTROLS if kept(c[0])]
    by_name = {k.name: k for k in kernels}
    for k in kernels:
        torch.manual_seed(0)
        bad = _checked(k.check, IMPLS[k.name], small)
        ok &= not bad
        lines.append(
            f"{k.name:<18} {'pass' if not bad else 'FAIL'}  rule: {k.rule}; ref: {k.reference}"
            + ("".join(f"\n    {b}" for b in bad[:5]))
        )
        if echo:
            print(lines[-1], flush=True)
    red = 0
    for name, what, impl in controls:
        torch.manual_seed(0)
        bad = _checked(by_name[name].check, impl, small)
        crashed = any(b.startswith("raised ") for b in bad)  # a crash is not a detection
        red += bool(bad) and not crashed
        verdict = "CRASHED" if crashed else "red as planted" if bad else "MISSED"
        lines.append(f"control {name:<18} {what:<40} {verdict}")
        if echo:
            print(lines[-1], flush=True)
    ok &= red == len(controls)
    passed = sum(1 for line in lines if line.split()[1:2] == ["pass"])
    lines.append(
        f"SUMMARY {len(kernels)} kernels: {passed} pass, {len(kernels) - passed} fail; "
        f"{len(controls)} controls: {red} red as planted, {len(controls) - red} missed"
    )
    return lines, ok


def main() -> int:
    p = argparse.ArgumentParser(
        description="check every GPU kernel against its reference and its rules"
    )
    p.add_argument("--small", action="store_true")
    p.add_argument("--only", default="", help="kernels whose name starts with this (e.g. moe.)")
    args = p.parse_args()
    lines, ok = run_all(args.small, echo=True, only=args.only)
    print(lines[-1])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
