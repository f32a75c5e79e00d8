"""Mixture-of-experts routing and expert products, as plain torch (the reference of the GPU path).

The contract (docs/exactness.md, 'Experts'): the router's softmax in fp32, the top-k by
probability with ties to the lowest expert id, the k probabilities renormalised by their sum in
rank order; each selected expert's SwiGLU product over the row alone (rows are gathered per
expert into fixed 16-row tiles, so a row's bits never depend on how many rows chose that expert);
the routed outputs weighted and added in fp32 in ascending expert id, the gated shared expert
added last, rounded once to the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from . import gates as ref_gates
from . import linear as ref_linear
from .quant import QuantizedWeight


@dataclass(frozen=True)
class ExpertStack:
    """One projection of every expert, stacked over the first axis: dense [E, N, K] in the model
    dtype, or MLX-packed words [E, N, K·bits/32] with scales and biases [E, N, K/gs]."""

    weight: torch.Tensor
    scales: torch.Tensor | None = None
    biases: torch.Tensor | None = None
    bits: int = 0
    group_size: int = 0

    @property
    def packed(self) -> bool:
        return self.scales is not None

    @property
    def num_experts(self) -> int:
        return self.weight.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K) of one expert's matrix."""
        n, width = self.weight.shape[1:]
        return n, width * 32 // self.bits if self.packed else width

    def expert(self, e: int) -> torch.Tensor | QuantizedWeight:
        """Expert e's matrix, a view of the stack."""
        if not self.packed:
            return self.weight[e]
        return QuantizedWeight(
            self.weight[e], self.scales[e], self.biases[e], self.bits, self.group_size
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        """Its tensors by field name: the weight, and the scales and biases when packed."""
        names = ("weight", "scales", "biases") if self.packed else ("weight",)
        return {name: getattr(self, name) for name in names}

    def each(self, fn) -> ExpertStack:
        """The stack with `fn` applied to each of its tensors (over the experts' axis alike)."""
        return replace(self, **{name: fn(t) for name, t in self.tensors().items()})

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())


@dataclass(frozen=True)
class Experts:
    """The routed experts of one layer: SwiGLU, down(silu(gate(x)) · up(x)), per expert."""

    gate: ExpertStack
    up: ExpertStack
    down: ExpertStack

    @property
    def num_experts(self) -> int:
        return self.gate.num_experts

    @property
    def nbytes(self) -> int:
        stacks = {id(s.weight): s for s in (self.gate, self.up, self.down)}
        return sum(s.nbytes for s in stacks.values())


def _appended(stack: ExpertStack, w: torch.Tensor | QuantizedWeight) -> ExpertStack | None:
    """`stack` with one more expert, `w`, at index E; None when w is not in the stack's format."""
    if isinstance(w, QuantizedWeight) != stack.packed:
        return None
    if not stack.packed:
        if w.dtype != stack.weight.dtype or tuple(w.shape) != stack.shape:
            return None
        return ExpertStack(torch.cat([stack.weight, w[None]]))
    if (w.bits, w.group_size, w.shape) != (stack.bits, stack.group_size, stack.shape):
        return None
    if (w.scales.dtype, w.biases.dtype) != (stack.scales.dtype, stack.biases.dtype):
        return None  # torch.cat would promote the stacks' own
    one = {"weight": w.packed.view(stack.weight.dtype), "scales": w.scales, "biases": w.biases}
    return replace(stack, **{n: torch.cat([t, one[n][None]]) for n, t in stack.tensors().items()})


def with_shared(experts: Experts, gate, up, down) -> Experts | None:
    """The routed experts with the shared expert's SwiGLU appended as expert E (the last id, so a
    row's choices stay ascending): one grouped launch then runs it beside the routed ones. None
    when any of its projections is not in its stack's format (a mixed file)."""
    stacks = [
        _appended(s, w) for s, w in zip((experts.gate, experts.up, experts.down), (gate, up, down))
    ]
    return None if any(s is None for s in stacks) else Experts(*stacks)


def routed_part(joint: Experts) -> Experts:
    """The routed experts of `with_shared`'s stacks: views of all but the last expert."""
    return Experts(*(s.each(lambda t: t[:-1]) for s in (joint.gate, joint.up, joint.down)))


@dataclass(frozen=True)
class Route:
    """Each row's k experts in ascending id [M, k] and their weights [M, k] (fp32, fp64 in a
    float64 run), the weight at the same place as its expert; a route asked for a `last` id
    holds it after the k, [M, k + 1], with no weight of its own."""

    ids: torch.Tensor
    weights: torch.Tensor


def accumulator(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def route(logits: torch.Tensor, top_k: int, last: int | None = None) -> Route:
    """Softmax of the router logits in fp32, the top-k by probability (a stable sort: equal
    probabilities keep the lower expert id first), renormalised by their sum added in rank
    order; then each row's experts sorted ascending, their weights with them."""
    probs = torch.softmax(logits.to(accumulator(logits.dtype)), dim=-1)
    ranked = torch.sort(probs, dim=-1, descending=True, stable=True)
    top, ids = ranked.values[:, :top_k], ranked.indices[:, :top_k]
    total = top[:, 0]
    for j in range(1, top_k):
        total = total + top[:, j]
    weights = top / total[:, None]
    ascending = torch.sort(ids, dim=-1)
    chosen = ascending.values
    if last is not None:  # one more id a row, after the k (its weight is not a router's)
        chosen = torch.cat([chosen, chosen.new_full((chosen.shape[0], 1), last)], 1)
    return Route(chosen, weights.gather(1, ascending.indices))


def product(x: torch.Tensor, w: torch.Tensor | QuantizedWeight) -> torch.Tensor:
    """The row-tiled product of ops.linear, dense or packed."""
    if isinstance(w, QuantizedWeight):
        return ref_linear.matmul_packed_rows(x, w)
    return ref_linear.matmul_rows(x, w)


def expert_groups(ids: torch.Tensor, num_experts: int) -> list[tuple[int, torch.Tensor]]:
    """(expert, the flat slots r·k + j that chose it) for every expert chosen, ascending."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    groups, start = [], 0
    for e, n in enumerate(counts):
        if n:
            groups.append((e, order[start : start + n]))
        start += n
    return groups


def expert_swiglu(x: torch.Tensor, ids: torch.Tensor, experts: Experts) -> torch.Tensor:
    """[M, k, H]: row r's output of each of its experts ids[r], in the model dtype. Each expert's
    rows are gathered and padded to whole row tiles, so its products and its silu see one shape
    per tile whatever the number of rows that chose it; only the chosen experts are read."""
    m, k = ids.shape
    out = x.new_empty((m * k, experts.down.shape[0]))
    for e, slots in expert_groups(ids, experts.num_experts):
        xe = ref_linear.pad_rows(x[slots // k])
        h = ref_gates.silu_mul(
            product(xe, experts.gate.expert(e)), product(xe, experts.up.expert(e))
        )
        out[slots] = product(h, experts.down.expert(e))[: slots.shape[0]]
    return out.view(m, k, -1)


def combine(
    routed: torch.Tensor, weights: torch.Tensor, shared: torch.Tensor, shared_logit: torch.Tensor
) -> torch.Tensor:
    """Σ_j w_j · y_j over the k experts in ascending id, in fp32 from the first term, each
    product rounded before its add; then + sigmoid(shared_logit) · shared; rounded once to the
    model dtype."""
    acc = weights.dtype
    out = weights[:, :1] * routed[:, 0].to(acc)
    for j in range(1, routed.shape[1]):
        out = out + weights[:, j : j + 1] * routed[:, j].to(acc)
    # The gate's sigmoid over whole rows: on a [M, 1] column the CPU's vector loop would leave a
    # scalar tail that follows M (a scalar sigmoid rounds differently).
    gate = torch.sigmoid(shared_logit.to(acc).expand_as(shared).contiguous())
    out = out + gate * shared.to(acc)
    return out.to(routed.dtype)
