"""The non-exact variant, for benchmarks only: the fastest kernels at hand that do not keep the
invariants, swapped into a loaded model. cuBLAS products for bf16 weights (its small-M path splits
K) and fla's chunked (WY) recurrence for passes with prompt rows. What exactness costs is the gap
between this and the default; production code carries no switch for it.

    from inexact import make_inexact      # with benchmarks/ on sys.path
    make_inexact(model)                   # before building the engine
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tensorfold.layers.gdn import GatedDeltaNet
from tensorfold.layers.linear import Joined, Linear


class CublasLinear(Linear):
    """A bf16 product through cuBLAS (its reduction order follows the row count)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.weight, torch.Tensor):
            return F.linear(x.contiguous(), self.weight)
        return super().__call__(x)


class ChunkedGDN(GatedDeltaNet):
    """Passes with prompt rows through fla's chunked kernel; decode-only passes unchanged."""

    def recurrence(self, q, k, v, g, beta, rec_state, batch):
        lanes = batch.lanes
        if q.shape[0] == lanes.slots.shape[0]:
            return super().recurrence(q, k, v, g, beta, rec_state, batch)
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        o, final = chunk_gated_delta_rule(
            q[None],
            k[None],
            v[None],
            g=g[None].float(),
            beta=beta[None],
            scale=q.shape[-1] ** -0.5,
            initial_state=rec_state[lanes.slots],
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=lanes.cu_seqlens,
        )
        rec_state[lanes.slots] = final
        return o[0]


def make_inexact(model) -> None:
    """Swaps every projection (merged ones too) and every GDN layer of `model` in place."""
    if model.device.type != "cuda":
        raise ValueError("the non-exact variant swaps in GPU kernels; this model is on the CPU")
    merged = [
        j.merged
        for layer in model.layers
        for obj in (layer.mixer, layer.mlp)
        for j in vars(obj).values()
        if isinstance(j, Joined) and j.merged is not None
    ]
    for lin in list(model.linears()) + merged:
        lin.__class__ = CublasLinear
    for layer in model.layers:
        if isinstance(layer.mixer, GatedDeltaNet):
            layer.mixer.__class__ = ChunkedGDN
