"""Gated full attention (reference/qwen35.md §2.4) over the paged KV cache."""
from __future__ import annotations

import torch

from ..ops.attention import paged_attention
from ..ops.rope import apply_rope
from ..runner.batch import ForwardBatch
from .linear import Linear, join
from .norm import RMSNorm


class GatedAttention:
    def __init__(self, q_proj: Linear, k_proj: Linear, v_proj: Linear, o_proj: Linear,
                 q_norm: RMSNorm, k_norm: RMSNorm, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj
        self.q_norm, self.k_norm = q_norm, k_norm
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5
        self.joined_qkv = join([q_proj, k_proj, v_proj])      # on the GPU: one product for q, k and v

    def __call__(self, x: torch.Tensor, batch: ForwardBatch, rope: tuple[torch.Tensor, torch.Tensor],
                 k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        if batch.gpu is not None:
            return self._gpu(x, batch, rope, k_cache, v_cache)
        n, d = x.shape[0], self.head_dim
        # Per head, the first D channels of q_proj are the query, the next D the gate.
        qg = self.q_proj(x).view(n, self.num_heads, 2 * d)
        q, gate = qg[..., :d], qg[..., d:].reshape(n, self.num_heads * d)
        k = self.k_norm(self.k_proj(x).view(n, self.num_kv_heads, d))
        v = self.v_proj(x).view(n, self.num_kv_heads, d)
        q = apply_rope(self.q_norm(q), *rope)
        k = apply_rope(k, *rope)
        # Written before read: cached and fresh keys take the same path.
        rows = batch.num_rows
        k_cache[batch.kv_write] = k[:rows].to(k_cache.dtype)
        v_cache[batch.kv_write] = v[:rows].to(v_cache.dtype)
        out = torch.zeros_like(q)
        for seg in batch.segments:
            out[seg.rows] = paged_attention(q[seg.rows], k_cache, v_cache, seg.kv_slots,
                                            batch.positions[seg.rows], self.scale)
        return self.o_proj(out.reshape(n, -1) * torch.sigmoid(gate))

    def _gpu(self, x, batch, rope, k_cache, v_cache) -> torch.Tensor:
        """Fused on the GPU: q/k norm with the rotary embedding, and the output gate in the kernel."""
        from ..ops.triton.attention import paged_attention as gpu_attention
        from ..ops.triton.norm import norm_rope
        n, d = x.shape[0], self.head_dim
        q_out, k_out, v_out = self.joined_qkv(x)
        qg = q_out.view(n, self.num_heads, 2 * d)
        q = norm_rope(qg[..., :d], self.q_norm.weight, self.q_norm.eps, self.q_norm.offset, *rope)
        k = norm_rope(k_out.view(n, self.num_kv_heads, d), self.k_norm.weight, self.k_norm.eps,
                      self.k_norm.offset, *rope)
        k_cache[batch.kv_write] = k.to(k_cache.dtype)      # written before read
        v_cache[batch.kv_write] = v_out.view(n, self.num_kv_heads, d).to(v_cache.dtype)
        out = gpu_attention(q, k_cache, v_cache, batch.gpu.attention, self.scale, gate=qg[..., d:])
        return self.o_proj(out.view(n, -1))
