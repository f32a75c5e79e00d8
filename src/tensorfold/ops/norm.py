"""RMS norms (docs/model.md, 'RMSNorm' and 'Gated DeltaNet'). All statistics in fp32 (fp64 in
a float64 run)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .gates import untailed


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    """y = x / rms(x) * (offset + w), one rounding to x's dtype.

    offset is 1.0 for Hugging Face files (zero-centred weights) and 0.0 for MLX files,
    which store the shifted weight.
    """
    acc = _acc_dtype(x.dtype)
    xf = x.to(acc)
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (offset + weight.to(acc))).to(x.dtype)


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """GDN output norm: w * bf16(x / rms(x)) * silu(gate), as Qwen3_5RMSNormGated computes it."""
    acc = _acc_dtype(x.dtype)
    xf = x.to(acc)
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    y = weight * normed
    return (y.to(acc) * untailed(F.silu, gate.to(acc))).to(x.dtype)


def l2_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x²) + eps) over the last dim, in x's dtype (callers pass fp32)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)
