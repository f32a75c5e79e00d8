"""The gated delta rule, one token at a time (docs/model.md, 'Gated DeltaNet').

Prompt and decode rows both take this same per-token update, so a token's state and output never
depend on how the prompt was chunked (docs/exactness.md, 'The recurrence').
"""

from __future__ import annotations

import torch

from ..batch import Segment
from .gates import untailed
from .norm import l2_norm


def gated_delta_step(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
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
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
) -> torch.Tensor:
    """Tokens [n] of one sequence in order: q, k [n, Hv, dk], v [n, Hv, dv], decay, beta [n, Hv].

    decay = exp(g) ∈ (0, 1]. Returns o [n, Hv, dv] in the state's dtype; `state` is updated.
    """
    out = torch.empty((q.shape[0], *v.shape[1:]), dtype=state.dtype, device=state.device)
    for t in range(q.shape[0]):
        out[t] = gated_delta_step(state, q[t], k[t], v[t], decay[t], beta[t])
    return out


def gated_delta_lanes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
    segments: tuple[Segment, ...],
) -> torch.Tensor:
    """Every lane of a pass: q, k [n, Hk, dk] as the conv left them, v [n, Hv, dv], g (log-decay)
    and beta [n, Hv]; states [slots, Hv, dk, dv]. Per lane: q and k l2-normed in the state's
    precision (q scaled by dk^-1/2), value head j reading key head j // (Hv/Hk), then the
    recurrence from the lane's slot. Returns o [n, Hv, dv] in v's dtype (padding rows zero)."""
    acc, dk = states.dtype, q.shape[-1]
    repeat = v.shape[1] // q.shape[1]
    decay = untailed(torch.exp, g)  # over every row at once
    out = torch.zeros_like(v)
    for seg in segments:
        r = seg.rows
        qs = (l2_norm(q[r].to(acc)) / dk**0.5).repeat_interleave(repeat, dim=1)
        ks = l2_norm(k[r].to(acc)).repeat_interleave(repeat, dim=1)
        o = gated_delta_rule(states[seg.slot], qs, ks, v[r].to(acc), decay[r], beta[r].to(acc))
        out[r] = o.to(v.dtype)
    return out
