"""Programmatic dependent launch (Hopper and later), for the kernels of a pass.

A kernel launched this way is placed on the card while the kernel before it in the stream is
still running; its programs wait at their first line (`griddepcontrol.wait`) until that kernel
has ended and its writes show, then let the next kernel launch. The gaps between a decode step's
few hundred short kernels are what it saves. Scheduling only: every load and store of a kernel
comes after the wait, so no value changes. A kernel that reads a launch keyword set by `pdl`
starts with `pdl_start(PDL)`; both always come together (a kernel launched early that did not
wait would read its inputs before they are written).

On by default; TENSORFOLD_PDL=0 launches every kernel plainly (the same bits, for comparing).
On an H100 it took one stream of the 9B (4-bit) from 249 to 259 tok/s and of the 35B-A3B from
286 to 326; with many lanes, where a step's kernels are long, it gains little."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from types import MappingProxyType

import torch
import triton
import triton.language as tl


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """A kernel's first line: wait for the kernel before it, then let the next one launch."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def pdl(device: torch.device) -> Mapping[str, bool]:
    """Launch keywords of a kernel that starts with `pdl_start`: none where switched off or the
    card (not Triton's interpreter) lacks dependent launch. Asked at every launch: answered once a
    card."""
    if device.type != "cuda":
        return NONE
    return _keywords(device.index if device.index is not None else torch.cuda.current_device())


NONE: Mapping[str, bool] = MappingProxyType({})


@functools.cache
def _keywords(index: int) -> Mapping[str, bool]:
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("TENSORFOLD_PDL") == "0":
        return NONE
    if torch.cuda.get_device_capability(index)[0] < 9:
        return NONE
    return MappingProxyType({"PDL": True, "launch_pdl": True})
