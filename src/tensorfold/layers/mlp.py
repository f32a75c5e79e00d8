"""SwiGLU MLP: down(silu(gate(x)) * up(x))."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .linear import Linear


class MLP:
    def __init__(self, gate_proj: Linear, up_proj: Linear, down_proj: Linear) -> None:
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
