"""RMSNorm modules holding their weight and the file's convention."""
from __future__ import annotations

import torch

from ..ops.norm import gated_rms_norm, rms_norm


class RMSNorm:
    """offset 1.0: the file stores zero-centred weights (HF); 0.0: already shifted (MLX)."""

    def __init__(self, weight: torch.Tensor, eps: float, offset: float) -> None:
        self.weight, self.eps, self.offset = weight, eps, offset

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from ..ops.triton import norm
            return norm.rms_norm(x, self.weight, self.eps, self.offset)
        return rms_norm(x, self.weight, self.eps, self.offset)


class GatedRMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight, self.eps = weight, eps

    def __call__(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from ..ops.triton import norm
            return norm.gated_rms_norm(x, gate, self.weight, self.eps)
        return gated_rms_norm(x, gate, self.weight, self.eps)
