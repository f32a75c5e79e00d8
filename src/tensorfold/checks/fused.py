"""The registry's entry for a product's segment sums added inside the op that reads them (the
residual add + norm, silu · up; checks/registry.py runs it): each must give the bits of the
product's own sum launch followed by the plain op, at 1, 7 and 64 rows, with two planted faults
the check must catch (the segments added in reverse, the total left unrounded)."""

from __future__ import annotations

import functools
from typing import Callable

import torch

from ..ops.linear import Partial
from ..ops.triton import gates, linear, norm


def _partial(rows: int, width: int) -> Partial:
    """Random segment sums [4, rows, 2·width] whose first gate and up columns show the order
    at any width: (2^24 + 1) + 1 - 2^24 is 0 in order and 2 reversed."""
    sums = torch.randn(4, rows, 2 * width, device="cuda") * 0.3
    order = torch.tensor([2.0**24, 1.0, 1.0, -(2.0**24)], device="cuda")[:, None]
    sums[:, :, 0] = sums[:, :, width] = order
    return Partial(sums, torch.bfloat16)


def check_fused_sums(impl, small: bool) -> list[str]:
    add_rms, silu_mul = impl
    width, bad = (512 if small else 4096), []
    weight = torch.randn(width, device="cuda") * 0.1
    for rows in (1, 7, 64):
        kept = _partial(rows, width)
        sums = kept.sums.contiguous()
        stored = linear._sum(sums, sums.new_empty(kept.shape, dtype=torch.bfloat16))
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


NAME = "fused.segment_sums"
ENTRIES: list[tuple[str, str, str, str, Callable]] = [
    (
        NAME,
        "the product's _sum_segments, then the op",
        "residual add + rms norm, silu · up; 1/7/64 rows",
        "bitwise",
        check_fused_sums,
    )
]
IMPLS = {NAME: (norm.add_rms_norm, gates.silu_mul)}
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
]
