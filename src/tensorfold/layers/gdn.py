"""Gated DeltaNet (docs/model.md, 'Gated DeltaNet') with per-lane conv and recurrent state."""

from __future__ import annotations

import torch

from ..batch import ForwardBatch, GDNState
from ..ops import dispatch as op
from ..ops.gated_delta import GDNShape
from .linear import Linear, join
from .norm import GatedRMSNorm


class GatedDeltaNet:
    def __init__(
        self,
        shape: GDNShape,
        in_proj_qkv: Linear,
        in_proj_z: Linear,
        in_proj_b: Linear,
        in_proj_a: Linear,
        conv_weight: torch.Tensor,
        A_log: torch.Tensor,
        dt_bias: torch.Tensor,
        norm: GatedRMSNorm,
        out_proj: Linear,
    ) -> None:
        self.shape = shape
        self.in_proj_qkv, self.in_proj_z = in_proj_qkv, in_proj_z
        self.in_proj_b, self.in_proj_a = in_proj_b, in_proj_a
        self.conv_weight = conv_weight  # [conv_dim, K]
        self.A_log, self.dt_bias = A_log, dt_bias
        self.norm, self.out_proj = norm, out_proj
        self.in_proj = join([in_proj_qkv, in_proj_z, in_proj_a, in_proj_b])  # GPU: one product
        self.form = (
            "recurrence"  # ops.gated_delta.FORMS (ops.dispatch.gated_delta); the engine sets it
        )

    def __call__(self, x: torch.Tensor, batch: ForwardBatch, state: GDNState, partial=False):
        s, n = self.shape, x.shape[0]
        # mixed: [n, 2*key_dim + value_dim]; on a GPU each may be the product's segment sums,
        # added by the conv, the recurrence and the gated norm where they read them
        mixed, z, a, b = self.in_proj(x, partial=True)
        gates = op.gdn_gates(a, b, self.A_log, self.dt_bias, state.recurrent.dtype)
        conv = op.causal_conv(mixed, state.conv, self.conv_weight, batch.lanes)
        core = self.core(conv, gates, state, batch)
        y = self.norm(core, z.view(n, s.num_v_heads, s.v_head_dim)).reshape(n, s.value_dim)
        return self.out_proj(y, partial)  # partial: for the residual add after it

    def core(self, conv, gates, state: GDNState, batch: ForwardBatch) -> torch.Tensor:
        """The gated delta rule of every lane, from its boundary state and tail (`gates`: as
        op.gdn_gates gives them)."""
        return op.gated_delta(conv, gates, state, self.shape, batch, self.form)
