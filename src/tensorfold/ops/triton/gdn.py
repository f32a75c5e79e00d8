"""The gated delta rule on the GPU for every lane of a pass: fla's per-token recurrent kernel.

One launch runs each lane's rows in order from its state slot (varlen, cu_seqlens), with q/k
l2-normalised inside the kernel. The same kernel and configuration serve prompt and decode rows,
so a token's state never depends on its chunk or its company (measured bitwise on the H200:
reference/exactness-probe.md). fla's chunked (WY) kernel rounds differently and is never used.
"""
from __future__ import annotations

import torch


def gated_delta_lanes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      states: torch.Tensor, slots: torch.Tensor, cu_seqlens: torch.Tensor,
                      chunked: bool = False) -> torch.Tensor:
    """q, k [T, Hk, dk], v [T, Hv, dv], g (log-decay), beta [T, Hv]; states [slots, Hv, dk, dv] fp32.

    Rows of lane i are cu_seqlens[i]:cu_seqlens[i+1]; its state is states[slots[i]], updated.
    Returns o [T, Hv, dv] in v's dtype. chunked=True runs fla's chunked (WY) kernel instead: faster
    for prompts, but it rounds differently from the recurrence (benchmarks of the exactness cost only).
    """
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    kernel = chunk_gated_delta_rule if chunked else fused_recurrent_gated_delta_rule
    o, final = kernel(
        q[None], k[None], v[None], g=g[None].float(), beta=beta[None], scale=q.shape[-1] ** -0.5,
        initial_state=states[slots], output_final_state=True, use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu_seqlens)
    states[slots] = final
    return o[0]
