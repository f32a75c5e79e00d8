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
from tensorfold.ops.dispatch import GateInputs


class CublasLinear(Linear):
    """A bf16 product through cuBLAS (its reduction order follows the row count)."""

    def __call__(self, x: torch.Tensor, partial: bool = False) -> torch.Tensor:
        if isinstance(self.weight, torch.Tensor):
            return F.linear(x.contiguous(), self.weight)
        return super().__call__(x, partial)


class ChunkedGDN(GatedDeltaNet):
    """Each pass's rows through fla's chunked kernel from the lane's state at its last row (no
    grid, no tail: chunk boundaries follow the pass), decode-only passes through the per-token
    recurrence; `recurrent` then holds the state after the lane's last row."""

    def core(self, conv, gates, state, batch):
        if batch.lanes.most_rows == 1:  # one row a lane: the exact recurrence
            return super().core(conv, gates, state, batch)
        s, n, lanes = self.shape, conv.shape[0], batch.lanes
        g, beta = gates.values() if isinstance(gates, GateInputs) else gates
        q, k, v = torch.split(conv, [s.key_dim, s.key_dim, s.value_dim], dim=-1)
        q = q.reshape(n, s.num_k_heads, s.k_head_dim)
        k = k.reshape(n, s.num_k_heads, s.k_head_dim)
        v = v.reshape(n, s.num_v_heads, s.v_head_dim)
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        o, final = chunk_gated_delta_rule(
            q[None],
            k[None],
            v[None],
            g=g[None].float(),
            beta=beta[None],
            scale=s.k_head_dim**-0.5,
            initial_state=state.recurrent[lanes.slots],
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=lanes.cu_seqlens,
        )
        state.recurrent[lanes.slots] = final
        return o[0]


def make_inexact(model) -> None:
    """Swaps every projection (merged ones too) and every GDN layer of `model` in place."""
    if model.device.type != "cuda":
        raise ValueError("the non-exact variant swaps in GPU kernels; this model is on the CPU")
    merged = [
        lin
        for layer in model.layers
        for obj in (layer.mixer, layer.mlp)
        for j in vars(obj).values()
        if isinstance(j, Joined)
        for lin, held in j.products
        if len(held) > 1
    ]
    for lin in list(model.linears()) + merged:
        lin.__class__ = CublasLinear
    for layer in model.layers:
        if isinstance(layer.mixer, GatedDeltaNet):
            layer.mixer.__class__ = ChunkedGDN
