"""Gated DeltaNet (docs/model.md, 'Gated DeltaNet') with per-lane conv and recurrent state."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..batch import ForwardBatch
from ..ops import dispatch as op
from .linear import Linear, join
from .norm import GatedRMSNorm


@dataclass(frozen=True)
class GDNShape:
    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_head_dim


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

    def __call__(
        self,
        x: torch.Tensor,
        batch: ForwardBatch,
        conv_state: torch.Tensor,
        rec_state: torch.Tensor,
    ) -> torch.Tensor:
        s, n = self.shape, x.shape[0]
        mixed, z, a, b = self.in_proj(x)  # mixed: [n, 2*key_dim + value_dim]
        g, beta = op.gdn_gates(a, b, self.A_log, self.dt_bias, rec_state.dtype)
        conv = op.causal_conv(mixed, conv_state, self.conv_weight, batch.lanes)
        q, k, v = torch.split(conv, [s.key_dim, s.key_dim, s.value_dim], dim=-1)
        core = self.recurrence(
            q.reshape(n, s.num_k_heads, s.k_head_dim),
            k.reshape(n, s.num_k_heads, s.k_head_dim),
            v.reshape(n, s.num_v_heads, s.v_head_dim),
            g,
            beta,
            rec_state,
            batch,
        )
        y = self.norm(core, z.view(n, s.num_v_heads, s.v_head_dim)).reshape(n, s.value_dim)
        return self.out_proj(y)

    def recurrence(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        rec_state: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """The gated delta rule of every lane from its state slot."""
        return op.gated_delta(q, k, v, g, beta, rec_state, batch)
