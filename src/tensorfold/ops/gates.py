"""Small elementwise pieces of the layers, as plain torch (the reference for their GPU kernels)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

VECTOR_BLOCK = 256  # elements: a multiple of every unrolled vector step of torch's CPU loops


def untailed(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn(x) elementwise over x flattened and zero-padded to whole vector blocks. torch's CPU
    loops take the elements past their last whole vector step through a scalar path, whose exp,
    sigmoid and silu round differently: padded, every element takes the vector path, so its bits
    never depend on how many elements came with it (a rank of a split holds fewer heads)."""
    if x.is_cuda:
        return fn(x)
    flat = x.reshape(-1)
    extra = (-flat.numel()) % VECTOR_BLOCK
    if extra:
        flat = torch.cat([flat, flat.new_zeros(extra)])
    return fn(flat)[: x.numel()].view(x.shape)


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, acc: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet gates (docs/model.md, 'Gated DeltaNet'): log-decay
    g = -exp(A_log)·softplus(a + dt_bias) in the state's precision, and beta = sigmoid(b) in the
    model dtype (as HF computes it)."""
    g = -untailed(torch.exp, A_log.to(acc)) * untailed(F.softplus, a.to(acc) + dt_bias.to(acc))
    return g, untailed(torch.sigmoid, b)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's middle: silu(gate) * up, each rounded to the model dtype as torch does."""
    return untailed(F.silu, gate) * up
