"""SwiGLU MLP: down(silu(gate(x)) * up(x))."""
from __future__ import annotations

import torch

from ..ops.gates import silu_mul
from .linear import Linear, join


class MLP:
    def __init__(self, gate_proj: Linear, up_proj: Linear, down_proj: Linear) -> None:
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj
        self.joined = join([gate_proj, up_proj])          # one product for gate and up on the GPU

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.joined(x)
        if x.is_cuda:
            from ..ops.triton.fused import silu_mul as fused_silu_mul
            return self.down_proj(fused_silu_mul(gate, up))
        return self.down_proj(silu_mul(gate, up))
