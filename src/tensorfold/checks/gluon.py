"""The registry's entries for the Gluon few-row products, 4-, 5-, 6- and 8-bit (checks/registry.py runs
them): their fp32 segment sums must be the Triton kernels' bit for bit, whatever the rows' company,
with two planted faults each check must catch. Listed only where the kernel runs (Hopper, a
Triton with Gluon)."""

from __future__ import annotations

import functools
from typing import Callable

import torch
import triton

from ..ops.quant import dequantize, quantize, single_rounding
from ..ops.triton import linear
from .moe import rel


def _triton_partials(x, w, bits: int, group: int, plan) -> torch.Tensor:
    """The Triton swapped form's stored segment sums: the prompt kernels' arithmetic."""
    (m, k), n = x.shape, w[0].shape[0]
    t = linear.Tiles(16, 128, 4, 4, wide=2, swap=True)
    nseg = plan.segments(k)
    part = torch.empty((nseg, m, n), dtype=torch.float32, device=x.device)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    linear._affine_swapped_kernel[(triton.cdiv(m, 16), triton.cdiv(n, 128), nseg)](
        x, *w, y, part, m, n, x.stride(0), w[0].stride(0), w[1].stride(0), y.stride(0),
        BITS=bits, GROUP=group, GROUPS=max(t.step_k(plan) // group, 1), SEG=plan.segment,
        NSEG=nseg, SPLIT=True, BLOCK_M=16, BLOCK_N=128, BLOCK_K=t.step_k(plan), num_warps=4,
        num_stages=4,
    )  # fmt: skip
    return part


# (rows, warps): one stream and few lanes at every group; many lanes, at 4 and 8 warps (64 or 128
# weight rows a program), at group 64 (the warps touch no group arithmetic)
FEW = [(m, 4) for m in (1, 2, 7, 16)]
MANY = [(m, w) for m in (33, 64) for w in (4, 8)]
TALL = [(100, w) for w in (4, 8)]  # the ring's 128-row tile (its pieces of 65-512 rows)


def check_gluon(bits: int, form: str, impl, small: bool) -> list[str]:
    shapes = [(192, 2048)] if small else [(4096, 12288), (12352, 4096)]
    bad = []
    for (n, k), group in [(s, g) for s in shapes for g in (32, 64, 128)]:
        packed, scales, biases = quantize(torch.randn(n, k) * 0.02, bits, group)
        w = (packed.cuda().view(torch.int32), scales.cuda().bfloat16(), biases.cuda().bfloat16())
        plan = linear.LinearPlan.for_weight(n, k, group)
        if "hfma" in form and not single_rounding(w[1], w[2], bits):
            return [f"{bits}-bit g{group}: the check's weight is outside single_rounding"]
        x = torch.randn(100, k, device="cuda").to(torch.bfloat16)
        prompt = linear.affine_matmul(x, *w, bits, group, plan, tiles=linear.Tiles(64, 64, 4, 3))
        ref = x.float() @ dequantize(packed.cuda(), w[1], w[2], bits, group, torch.float32).t()
        where = f"{bits}-bit {n}x{k} g{group}"
        if rel(prompt.float(), ref) > 1e-2:
            bad.append(f"{where}: the prompt form off the reference")
        alone = impl(x[:1].contiguous(), *w, group, plan.segment)
        tall = TALL if group == 64 and "ring" in form else []
        for m, warps in FEW + (MANY if group == 64 else []) + tall:
            rows = x[:m].contiguous()
            fits = linear.gluon_affine.applies(
                rows, bits, k, plan.segment, form.startswith("staged"), warps, "ring" in form
            )
            if not fits:
                continue  # a segment's inputs and staged words past shared memory: not offered
            part = impl(rows, *w, group, plan.segment, warps=warps)
            at = f"{m} rows, {warps} warps"
            if not torch.equal(part, _triton_partials(rows, w, bits, group, plan)):
                bad.append(f"{where}: {at}: fp32 segment sums differ from the Triton kernels'")
            if not torch.equal(part[:, :1], alone):
                bad.append(f"{where}: {at}: row 0's segment sums change with its company")
            if not torch.equal(linear._sum(part, None), prompt[:m]):
                bad.append(f"{where}: {at}: rows differ from the same rows in a prompt")
        if bad:
            return bad
    return bad


def _name(bits: int, form: str) -> str:
    """The entry of a form: words two steps ahead in registers ("regs"), a segment's words
    staged ("staged"), or the inputs through a ring of a few steps ("ring", "ring.deep": each
    MMA queued behind the last); "hfma" alone or after either: the 4-bit values dequantized in
    bf16x2 arithmetic (weights that quant.single_rounding admits, as the check's are)."""
    return f"linear.affine{bits}.gluon" + ("" if form == "regs" else f".{form}")


def _available() -> bool:
    return (
        linear.gluon_affine is not None
        and torch.cuda.is_available()
        and torch.cuda.get_device_capability() == (9, 0)
    )


def _partials(bits, x, words, scales, biases, group, segment, fault=0, form="regs", warps=4):
    return linear.gluon_affine.partials(
        x, words, scales, biases, bits, group, segment, fault=fault,
        staged=form.startswith("staged"), warps=warps, ring="ring" in form, hfma="hfma" in form,
        deep="deep" in form,
    )  # fmt: skip


FORMS = [(b, k, form) for b, k in ((4, 128), (8, 64)) for form in ("regs", "staged", "ring")]
FORMS += [(b, 64, form) for b in (5, 6) for form in ("regs", "ring")]  # 5, 6 bits: not staged
FORMS += [(4, 128, form) for form in ("hfma", "staged.hfma", "ring.hfma")]  # bf16x2, 4-bit
# the ring's deep form (4 warps; at 8 the plain ring runs): each MMA queued behind the last
FORMS += [(4, 128, "ring.deep"), (4, 128, "ring.deep.hfma"), (8, 64, "ring.deep")]
ENTRIES: list[tuple[str, str, str, str, Callable]] = [  # (name, reference, shapes, rule, check)
    (_name(b, form), "the Triton kernels' fp32 segment sums", f"{b}-bit, K % {k} == 0, <= 64 rows, Hopper", "exact fp32, rows", functools.partial(check_gluon, b, form))
    for b, k, form in FORMS
] if _available() else []  # fmt: skip
IMPLS = {_name(b, form): functools.partial(_partials, b, form=form) for b, _, form in FORMS}
CONTROLS = [
    c
    for b, _, form in FORMS
    for c in (
        (_name(b, form), "K regrouped across MMAs (kWidth > 2)", functools.partial(_partials, b, fault=1, form=form)),
        (_name(b, form), "a segment summed as two chains", functools.partial(_partials, b, fault=2, form=form)),
    ) + ((
        (_name(b, form), "bf16x2 values rounded at another point (128 folded into the bias)", functools.partial(_partials, b, fault=3, form=form)),
    ) if "hfma" in form else ())
] if _available() else []  # fmt: skip
