"""The sparse mixture-of-experts block (docs/model.md, 'Mixture of experts'):

    p = softmax(router(x));  the top-k experts by p, their p renormalised to weights w
    y = Σ_e w_e · expert_e(x)  (ascending e)  +  sigmoid(shared_gate(x)) · shared(x)

The router is a projection like any other (row-exact); the order of the sum is fixed
(docs/exactness.md, 'Experts'), so a row's output never depends on which rows share its experts.
"""

from __future__ import annotations

import torch

from ..ops import dispatch as op
from ..ops.collective import Group
from ..ops.moe import Experts, routed_part, with_shared
from .linear import Linear, join
from .mlp import MLP

# rows up to which the shared expert runs in the grouped launches (the same bits either way):
# there its launches are what a pass saves; an 8k prompt ran 2% slower joined (one card run)
JOINT_ROWS = 512


class SparseMoE:
    def __init__(
        self,
        router: Linear,
        experts: Experts,
        shared: MLP,
        shared_gate: Linear,
        top_k: int,
        group: Group | None = None,
        first: int = 0,
    ) -> None:
        self.router, self.experts, self.top_k = router, experts, top_k
        self.shared, self.shared_gate = shared, shared_gate
        self.gates = join([router, shared_gate])  # one product for the router and the shared gate
        self.group, self.first = group, first  # a split: this rank's experts from `first`
        self.joint: Experts | None = None  # the shared expert as expert E too (`join_shared`)
        self.appended: Experts | None = None  # the joint stacks, kept while separated

    def join_shared(self) -> bool:
        """Runs the shared expert as one more expert of the grouped launches (its own launches
        gone) when its projections share the stacks' format; a whole model only. True if so."""
        if self.group is None and self.appended is None:
            s = self.shared
            self.appended = with_shared(
                self.experts, s.gate_proj.weight, s.up_proj.weight, s.down_proj.weight
            )
            if self.appended is not None:  # the routed stacks become views of the joint ones
                self.experts = routed_part(self.appended)
        self.joint = self.appended
        return self.joint is not None

    def separate_shared(self) -> None:
        """The shared expert through its own launches again (the same bits: a benchmark's
        comparison); the routed stacks stay views of the joint ones."""
        self.joint = None

    def __call__(self, x: torch.Tensor, partial: bool = False) -> torch.Tensor:
        """`partial` is the dense MLP's; the weighted sum here is always a stored tensor."""
        # on a GPU the router's and shared gate's segment sums, added where they are read
        logits, shared_logit = self.gates(x, partial=True)
        if self.joint is not None and x.shape[0] <= JOINT_ROWS:  # then the shared expert, id E
            route = op.moe_route(logits, self.top_k, last=self.joint.num_experts - 1)
            both = op.expert_swiglu(x, route.ids, self.joint, self.router.book)
            k = self.top_k
            return op.moe_combine(both[:, :k], route.weights, both[:, k], shared_logit)
        route = op.moe_route(logits, self.top_k)
        if self.group is None:
            routed = op.expert_swiglu(x, route.ids, self.experts, self.router.book)
        else:
            routed = self.split_experts(x, route.ids)
        return op.moe_combine(routed, route.weights, self.shared(x), shared_logit)

    def split_experts(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """[M, k, H] as `expert_swiglu` gives it, on a rank holding some of the experts: each
        chosen expert's rows through its owner only, the owners' outputs gathered and each
        (row, choice) taken from its owner (a choice, never a sum). An expert's rows give the
        same bits whichever rows share it (docs/exactness.md, 'Experts')."""
        m, k = ids.shape
        flat, per = ids.reshape(-1), self.experts.num_experts
        mine = ((flat >= self.first) & (flat < self.first + per)).nonzero().squeeze(1)
        out = x.new_zeros((m * k, self.experts.down.shape[0]))
        if mine.numel():
            local = (flat[mine] - self.first)[:, None]
            out[mine] = op.expert_swiglu(x[mine // k], local, self.experts, self.router.book)[:, 0]
        every = self.group.gather_cols(out).view(m * k, self.group.world, -1)
        owner = flat // per
        return every[torch.arange(m * k, device=x.device), owner].view(m, k, -1)

    def linears(self) -> list[Linear]:
        """The block's projections but the experts: the router, the shared expert, its gate."""
        return [
            self.router,
            self.shared.gate_proj,
            self.shared.up_proj,
            self.shared.down_proj,
            self.shared_gate,
        ]
