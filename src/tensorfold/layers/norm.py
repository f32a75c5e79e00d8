"""RMSNorm modules holding their weight and the file's convention."""

from __future__ import annotations

import torch

from ..ops import dispatch as op


class RMSNorm:
    """offset 1.0: the file stores zero-centred weights (HF); 0.0: already shifted (MLX)."""

    def __init__(self, weight: torch.Tensor, eps: float, offset: float) -> None:
        self.weight, self.eps, self.offset = weight, eps, offset

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(x); norm(x, residual) adds first and returns (residual + x, the norm of that)."""
        return op.rms_norm(x, self.weight, self.eps, self.offset, residual)

    def with_rope(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The per-head q/k norm followed by the rotary embedding."""
        return op.norm_rope(x, self.weight, self.eps, self.offset, rope)

    def with_rope_and_keys(
        self, q, keys: RMSNorm, k, v, rope, caches: tuple, rows: torch.Tensor
    ) -> torch.Tensor:
        """`with_rope(q)`, and `keys.keys_into(k, v, ...)`: one launch on a GPU where both norms
        share eps and offset (each head's bits those of the two calls)."""
        if (self.eps, self.offset) != (keys.eps, keys.offset):
            keys.keys_into(k, v, rope, caches, rows)
            return self.with_rope(q, rope)
        weights = (self.weight, keys.weight)
        return op.qk_norm_rope(q, k, v, weights, self.eps, self.offset, rope, caches, rows)

    def keys_into(self, k, v, rope, caches: tuple, rows: torch.Tensor) -> None:
        """The keys through `with_rope` and the values, written to the KV rows `rows`."""
        op.norm_rope_cached(k, v, self.weight, self.eps, self.offset, rope, caches, rows)


class GatedRMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight, self.eps = weight, eps

    def __call__(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return op.gated_rms_norm(x, gate, self.weight, self.eps)
