"""The gated delta rule, one token at a time (reference/qwen35.md §2.5.7).

Prompt, decode and verify rows all take this same per-token update, so a token's state and
output never depend on how the prompt was chunked (design/EXACTNESS.md, point 3).
"""
from __future__ import annotations

import torch


def gated_delta_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decay: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """One token for all value heads. Updates `state` [Hv, dk, dv] in place, returns o [Hv, dv].

    q, k [Hv, dk] (normalised, q scaled), v [Hv, dv], decay = exp(g) [Hv], beta [Hv];
    all in the state's dtype.
    """
    state.mul_(decay[:, None, None])
    memory = (state * k[:, :, None]).sum(dim=-2)
    delta = (v - memory) * beta[:, None]
    state.add_(k[:, :, None] * delta[:, None, :])
    return (state * q[:, :, None]).sum(dim=-2)


def gated_delta_rule(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decay: torch.Tensor,
    beta: torch.Tensor,
) -> torch.Tensor:
    """Tokens [n] of one sequence in order: q, k [n, Hv, dk], v [n, Hv, dv], decay, beta [n, Hv].

    decay = exp(g) ∈ (0, 1]. Returns o [n, Hv, dv] in the state's dtype; `state` is updated.
    """
    out = torch.empty((q.shape[0], *v.shape[1:]), dtype=state.dtype, device=state.device)
    for t in range(q.shape[0]):
        out[t] = gated_delta_step(state, q[t], k[t], v[t], decay[t], beta[t])
    return out
