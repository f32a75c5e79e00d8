"""The sparse mixture-of-experts block (docs/model.md, 'Mixture of experts'):

    p = softmax(router(x));  the top-k experts by p, their p renormalised to weights w
    y = Σ_e w_e · expert_e(x)  (ascending e)  +  sigmoid(shared_gate(x)) · shared(x)

The router is a projection like any other (row-exact); the order of the sum is fixed
(docs/exactness.md, 'Experts'), so a row's output never depends on which rows share its experts.
"""

from __future__ import annotations

import torch

from ..ops import dispatch as op
from ..ops.moe import Experts
from .linear import Linear
from .mlp import MLP


class SparseMoE:
    def __init__(
        self, router: Linear, experts: Experts, shared: MLP, shared_gate: Linear, top_k: int
    ) -> None:
        self.router, self.experts, self.top_k = router, experts, top_k
        self.shared, self.shared_gate = shared, shared_gate

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        route = op.moe_route(self.router(x), self.top_k)
        routed = op.expert_swiglu(x, route.ids, self.experts)
        return op.moe_combine(routed, route.weights, self.shared(x), self.shared_gate(x))

    def linears(self) -> list[Linear]:
        """The block's projections but the experts: the router, the shared expert, its gate."""
        return [
            self.router,
            self.shared.gate_proj,
            self.shared.up_proj,
            self.shared.down_proj,
            self.shared_gate,
        ]
