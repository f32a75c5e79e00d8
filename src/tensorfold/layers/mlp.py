"""SwiGLU MLP: down(silu(gate(x)) * up(x))."""

from __future__ import annotations

import torch

from ..ops import dispatch as op
from .linear import Linear, join


class MLP:
    def __init__(self, gate_proj: Linear, up_proj: Linear, down_proj: Linear) -> None:
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj
        self.gate_up = join([gate_proj, up_proj])  # one product for gate and up on the GPU

    def __call__(self, x: torch.Tensor, partial: bool = False):
        """`partial`: the down product's segment sums may be left to the residual add after it
        (gate and up's always go to silu_mul, which adds them)."""
        gate, up = self.gate_up(x, partial=True)
        return self.down_proj(op.silu_mul(gate, up), partial)
