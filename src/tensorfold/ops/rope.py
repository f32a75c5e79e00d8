"""Partial rotary position embedding, rotate-half pairing (docs/model.md, 'Rotary embedding').

Text-only M-RoPE reduces exactly to 1-D RoPE on the first `rotary_dim` channels.
"""

from __future__ import annotations

import torch


def rope_tables(positions: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin [N, rotary_dim] for absolute positions [N], computed in fp32 (fp64 for float64)."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=positions.device).to(acc)
    inv_freq = 1.0 / (theta ** (exponents / rotary_dim))
    angles = positions.to(acc)[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, D]: rotate dims [0, rotary_dim) by the angles; the rest pass through."""
    rot = cos.shape[-1]
    acc = cos.dtype
    xr = x[..., :rot].to(acc)
    half = rot // 2
    rotated = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
    out = xr * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat([out.to(x.dtype), x[..., rot:]], dim=-1)
