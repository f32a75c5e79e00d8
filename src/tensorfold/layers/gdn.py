"""Gated DeltaNet (reference/qwen35.md §2.5) with per-lane conv and recurrent state."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ops.conv import causal_conv_silu
from ..ops.gates import gdn_gates
from ..ops.gated_delta import gated_delta_rule
from ..ops.norm import l2_norm
from ..runner.batch import ForwardBatch
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
    def __init__(self, shape: GDNShape, in_proj_qkv: Linear, in_proj_z: Linear, in_proj_b: Linear,
                 in_proj_a: Linear, conv_weight: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                 norm: GatedRMSNorm, out_proj: Linear) -> None:
        self.shape = shape
        self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a = in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
        self.conv_weight = conv_weight        # [conv_dim, K]
        self.A_log, self.dt_bias = A_log, dt_bias
        self.norm, self.out_proj = norm, out_proj
        self.joined_in = join([in_proj_qkv, in_proj_z, in_proj_a, in_proj_b])   # on the GPU: one product
        self.inexact = False      # benchmarks only: fla's chunked recurrence for prompt rows

    def __call__(self, x: torch.Tensor, batch: ForwardBatch, conv_state: torch.Tensor,
                 rec_state: torch.Tensor) -> torch.Tensor:
        if batch.gpu is not None:
            return self._gpu(x, batch, conv_state, rec_state)
        s, n = self.shape, x.shape[0]
        mixed = self.in_proj_qkv(x)                              # [N, 2*key_dim + value_dim]
        z = self.in_proj_z(x).view(n, s.num_v_heads, s.v_head_dim)
        acc = rec_state.dtype
        g, beta = gdn_gates(self.in_proj_a(x), self.in_proj_b(x), self.A_log, self.dt_bias, acc)
        decay = g.exp()                                          # over all padded rows at once
        core = x.new_zeros((n, s.num_v_heads, s.v_head_dim))
        for seg in batch.segments:
            rows = seg.rows
            conv, conv_state[seg.slot] = causal_conv_silu(mixed[rows], conv_state[seg.slot], self.conv_weight)
            q, k, v = self._split_heads(conv, acc)
            out = gated_delta_rule(rec_state[seg.slot], q, k, v, decay[rows], beta[rows].to(acc))
            core[rows] = out.to(x.dtype)
        y = self.norm(core, z).reshape(n, s.value_dim)
        return self.out_proj(y)

    def _gpu(self, x, batch, conv_state, rec_state) -> torch.Tensor:
        """One launch per step for every lane: fused conv with its state, fused gates, the recurrence."""
        from ..ops.triton import fused
        from ..ops.triton.gdn import gated_delta_lanes
        s, rows, meta = self.shape, batch.num_rows, batch.gpu
        mixed, z, a, b = self.joined_in(x)
        z = z.view(rows, s.num_v_heads, s.v_head_dim)
        g, beta = fused.gdn_gates(a, b, self.A_log, self.dt_bias)
        conv = fused.conv_lanes(mixed, conv_state, self.conv_weight, meta.slots, meta.conv_taps,
                                meta.conv_keep)
        q, k, v = torch.split(conv, [s.key_dim, s.key_dim, s.value_dim], dim=-1)
        core = gated_delta_lanes(q.reshape(rows, s.num_k_heads, s.k_head_dim),
                                 k.reshape(rows, s.num_k_heads, s.k_head_dim),
                                 v.reshape(rows, s.num_v_heads, s.v_head_dim), g, beta,
                                 rec_state, meta.slots, meta.cu_seqlens,
                                 chunked=self.inexact and rows > meta.slots.shape[0])
        y = self.norm(core, z).reshape(rows, s.value_dim)
        return self.out_proj(y)

    def _split_heads(self, conv: torch.Tensor, acc: torch.dtype):
        s, m = self.shape, conv.shape[0]
        q, k, v = torch.split(conv, [s.key_dim, s.key_dim, s.value_dim], dim=-1)
        q = l2_norm(q.reshape(m, s.num_k_heads, s.k_head_dim).to(acc)) / (s.k_head_dim ** 0.5)
        k = l2_norm(k.reshape(m, s.num_k_heads, s.k_head_dim).to(acc))
        repeat = s.num_v_heads // s.num_k_heads                 # value head j reads key head j // repeat
        q, k = q.repeat_interleave(repeat, dim=1), k.repeat_interleave(repeat, dim=1)
        return q, k, v.reshape(m, s.num_v_heads, s.v_head_dim).to(acc)
