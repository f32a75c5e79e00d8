"""Causal depthwise conv with its state (docs/model.md, 'Gated DeltaNet')."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .gates import untailed
from .linear import ROW_TILE


def conv_gather(segments, conv_kernel: int) -> tuple[list[list[int]], list[list[int]]]:
    """Rows of [each lane's conv state ; the pass's rows] that each output row reads (taps) and
    that become each lane's next state (keep), lanes in the order of `segments`."""
    taps, keep, lanes, hist = [], [], len(segments), conv_kernel - 1

    def source(i: int, seg, p: int) -> int:  # p-th row of lane i's [state ; new rows]
        return i * hist + p if p < hist else lanes * hist + seg.row0 + p - hist

    for i, seg in enumerate(segments):
        taps += [[source(i, seg, t + j) for j in range(conv_kernel)] for t in range(seg.length)]
        keep.append([source(i, seg, seg.length + j) for j in range(hist)])
    return taps, keep


def causal_conv_lanes(
    x: torch.Tensor,
    states: torch.Tensor,
    weight: torch.Tensor,
    slots: torch.Tensor,
    taps: torch.Tensor,
    keep: torch.Tensor,
    writes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every lane of a pass at once: x [rows, C] (lanes' rows in order), states [slots, K-1, C].

    taps/keep index the rows of [each lane's state ; x] that each output reads and that become the
    lanes' next states (`conv_gather`), written to `writes` [lanes] (their own slots if None).
    Each output row is the same fixed K-term sum in fp32, then silu. x may carry padding rows past
    the taps': their outputs are unspecified.
    """
    hist, n = states.shape[1], x.shape[0]
    # Over a row count padded to the tile, so silu never meets a scalar tail.
    m = n + (-n) % ROW_TILE
    taps = torch.cat([taps, taps[:1].expand(m - taps.shape[0], -1)])
    source = torch.cat([states[slots].reshape(-1, states.shape[2]), x.to(states.dtype)])
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    w = weight.to(acc)
    out = w[:, 0] * source[taps[:, 0]].to(acc)
    for j in range(1, weight.shape[1]):
        out = out + w[:, j] * source[taps[:, j]].to(acc)
    states[slots if writes is None else writes] = source[keep].view(-1, hist, states.shape[2])
    return untailed(F.silu, out)[:n].to(x.dtype)
