"""Programmatic dependent launch (Hopper and later), for the kernels of a pass.

A kernel launched this way is placed on the card while the kernel before it in the stream is
still running; its programs wait at their first line (`griddepcontrol.wait`) until that kernel
has ended and its writes show, then let the next kernel launch. The gaps between a decode step's
few hundred short kernels are what it saves. Scheduling only: every load and store of a kernel
comes after the wait, so no value changes. A kernel that reads a launch keyword set by `pdl`
starts with `pdl_start(PDL)`; both always come together (a kernel launched early that did not
wait would read its inputs before they are written).

Off unless TENSORFOLD_PDL=1: on an H100 a decode step's graph ran 3.87 ms with it (4.03-4.24
without, on two machines), but engines with it on spent minutes where they spend seconds before
their first tokens (the tile book's timings and graph captures are the suspects; not yet
measured apart: benchmarks/pdl_probe.py)."""

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
    """Launch keywords of a kernel that starts with `pdl_start`: none unless switched on and the
    card (not Triton's interpreter) has dependent launch. Asked at every launch: answered once a
    card."""
    if device.type != "cuda":
        return NONE
    return _keywords(device.index if device.index is not None else torch.cuda.current_device())


NONE: Mapping[str, bool] = MappingProxyType({})


@functools.cache
def _keywords(index: int) -> Mapping[str, bool]:
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("TENSORFOLD_PDL") != "1":
        return NONE
    if torch.cuda.get_device_capability(index)[0] < 9:
        return NONE
    return MappingProxyType({"PDL": True, "launch_pdl": True})
