"""Small elementwise pieces of the layers, as plain torch (the reference for their GPU kernels)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, acc: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet gates (docs/model.md, 'Gated DeltaNet'): log-decay
    g = -exp(A_log)·softplus(a + dt_bias) in the state's precision, and beta = sigmoid(b) in the
    model dtype (as HF computes it)."""
    g = -A_log.to(acc).exp() * F.softplus(a.to(acc) + dt_bias.to(acc))
    return g, torch.sigmoid(b)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's middle: silu(gate) * up, each rounded to the model dtype as torch does."""
    return F.silu(gate) * up
