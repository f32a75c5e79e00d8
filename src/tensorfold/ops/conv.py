"""Causal depthwise conv with its state (reference/qwen35.md §2.5.2)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .linear import ROW_TILE


def causal_conv_silu(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [n, C] new rows, state [K-1, C] previous pre-conv rows, weight [C, K].

    Returns (silu(conv) [n, C] in x's dtype, new state [K-1, C]). Each output row is the same
    fixed sum of K products whatever n is, so chunking never changes a bit.
    """
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    k = weight.shape[1]
    n = x.shape[0]
    window = torch.cat([state.to(x.dtype), x], dim=0)
    # Compute over a row count padded to the tile so silu never meets a scalar tail.
    m = n + (-n) % ROW_TILE
    padded = torch.cat([window, window.new_zeros((m - n, window.shape[1]))])
    w = weight.to(acc)
    out = w[:, 0] * padded[0:m].to(acc)
    for j in range(1, k):
        out = out + w[:, j] * padded[j:j + m].to(acc)
    return F.silu(out)[:n].to(x.dtype), window[n:].clone()


def causal_conv_lanes(x: torch.Tensor, states: torch.Tensor, weight: torch.Tensor, slots: torch.Tensor,
                      taps: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Every lane of a pass at once: x [rows, C] (lanes' rows in order), states [slots, K-1, C].

    taps/keep index the rows of [each lane's state ; x] that each output reads and that become the
    lanes' next states. Each output row is the same 4-term sum as `causal_conv_silu`'s.
    """
    hist = states.shape[1]
    source = torch.cat([states[slots].reshape(-1, states.shape[2]), x.to(states.dtype)])
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    w = weight.to(acc)
    out = w[:, 0] * source[taps[:, 0]].to(acc)
    for j in range(1, weight.shape[1]):
        out = out + w[:, j] * source[taps[:, j]].to(acc)
    states[slots] = source[keep].view(-1, hist, states.shape[2])
    return F.silu(out).to(x.dtype)
