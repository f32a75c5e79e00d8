"""Gated full attention (docs/model.md, 'Gated attention') over the paged KV cache."""

from __future__ import annotations

import torch

from ..batch import ForwardBatch
from ..ops import dispatch as op
from .linear import Linear, join
from .norm import RMSNorm


class GatedAttention:
    def __init__(
        self,
        q_proj: Linear,
        k_proj: Linear,
        v_proj: Linear,
        o_proj: Linear,
        q_norm: RMSNorm,
        k_norm: RMSNorm,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
    ) -> None:
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj
        self.q_norm, self.k_norm = q_norm, k_norm
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5
        self.qkv = join([q_proj, k_proj, v_proj])  # on the GPU: one product for q, k and v

    def __call__(
        self,
        x: torch.Tensor,
        batch: ForwardBatch,
        rope: tuple[torch.Tensor, torch.Tensor],
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        partial: bool = False,
    ):
        n, d = x.shape[0], self.head_dim
        # On a GPU each may be the product's segment sums, added where they are read: by the q
        # and k norms (the values by the keys' launch) and by the attention's output gate.
        q_out, k_out, v_out = self.qkv(x, partial=True)
        # Per head, the first D channels of q_proj are the query, the next D the output gate.
        q, gate = q_out.view(n, self.num_heads, 2 * d).split([d, d], dim=-1)
        k, v = (t.view(n, self.num_kv_heads, d) for t in (k_out, v_out))
        # The keys written before read: cached and fresh keys take the same path.
        q = self.q_norm.with_rope_and_keys(
            q, self.k_norm, k, v, rope, (k_cache, v_cache), batch.kv_write
        )
        out = op.gated_attention(q, k_cache, v_cache, batch, self.scale, gate=gate)
        return self.o_proj(out, partial)  # partial: for the residual add after it
