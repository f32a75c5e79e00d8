"""Row norms on the GPU, one program per row and one configuration per width, so a row's
reduction tree depends on its width alone (never on how many rows came with it)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def _config(width: int) -> tuple[int, int]:
    block = triton.next_power_of_2(width)
    return block, 4 if block <= 4096 else 8


@triton.jit
def _rms_kernel(x_ptr, w_ptr, y_ptr, W: tl.constexpr, eps, offset, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BLOCK)
    mask = o < W
    x = tl.load(x_ptr + row * W + o, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + o, mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / W + eps)
    tl.store(y_ptr + row * W + o, (x * r * (offset + w)).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_kernel(x_ptr, z_ptr, w_ptr, y_ptr, W: tl.constexpr, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BLOCK)
    mask = o < W
    x = tl.load(x_ptr + row * W + o, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + row * W + o, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + o, mask=mask, other=0.0)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / W + eps)
    normed = (x * r).to(y_ptr.dtype.element_ty)                 # rounded to the activation dtype
    y = (w * normed).to(tl.float32) * (z / (1.0 + tl.exp(-z)))
    tl.store(y_ptr + row * W + o, y.to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    w = x.shape[-1]
    flat = x.contiguous().view(-1, w)
    y = torch.empty_like(flat)
    block, warps = _config(w)
    _rms_kernel[(flat.shape[0],)](flat, weight, y, w, eps, offset, BLOCK=block, num_warps=warps)
    return y.view(x.shape)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    w = x.shape[-1]
    flat, z = x.contiguous().view(-1, w), gate.contiguous().view(-1, w)
    y = torch.empty_like(flat)
    block, warps = _config(w)
    _gated_kernel[(flat.shape[0],)](flat, z, weight, y, w, eps, BLOCK=block, num_warps=warps)
    return y.view(x.shape)
