"""How big a model's pools are: pages for `lanes` whole contexts plus the prompt cache's budget,
a state slot per lane (and a spare per lane when drafting forks), sized from the model's shape
and checked against the device before anything is allocated. Where the lanes' whole contexts do
not fit but one does, the lanes share the pages that fit (`PoolPlan.fitted`): a request is
admitted once the pages its prompt and reply can reach are free, so a running lane still never
waits for memory."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..batch import CHUNK
from . import KVShape, ModelCaches, StatePool, budget
from .budget import check_fits

# of the free memory, what shared KV pages (a drafter's over the same pages too) and the states
# take: the rest is for activations and CUDA graphs
SHARED = 0.85


def chunk_tail(chunk_form: bool) -> int:
    """Rows of a state slot's tail: the chunk form keeps a lane's rows since its last boundary."""
    return CHUNK if chunk_form else 0


@dataclass(frozen=True)
class PoolPlan:
    """The two pools of one process (a rank of a split: the widths of its heads)."""

    cfg: object  # config.ModelConfig
    kv_heads: int
    conv_dim: int
    v_heads: int
    dtype: torch.dtype
    pages: int
    page_size: int
    slots: int
    tail_rows: int  # CHUNK for the chunk form of the gated delta rule, else 0
    draft_page_bytes: int = 0  # what a page costs a drafter's own KV pool over the same pages

    @classmethod
    def for_model(
        cls,
        model,
        lanes: int,
        context: int,
        page_size: int,
        prompt_cache_bytes: int = 0,
        spares: bool = False,
        chunk_form: bool = False,
        padding: bool = False,
        draft_page_bytes: int = 0,
    ) -> PoolPlan:
        """Lanes reserve whole contexts; the prompt cache's pages come on top, within its
        budget; `spares`: a spare state slot per lane in the same pool (verify passes fork);
        `padding`: one more slot and page, the scratch of CUDA graphs' padding lanes;
        `draft_page_bytes`: a drafter's KV bytes a page (drafters.lookup.load_drafter)."""
        w = model.cache_widths
        plan = cls(
            model.config,
            w.kv_heads,
            w.conv_dim,
            w.v_heads,
            model.dtype,
            0,
            page_size,
            lanes * (2 if spares else 1) + padding,
            chunk_tail(chunk_form),
            draft_page_bytes,
        )
        pages = lanes * plan.span(context) + prompt_cache_bytes // max(1, plan.page_cost)
        pages += padding
        return replace(plan, pages=pages)

    @property
    def kv_shape(self) -> KVShape:
        return KVShape(len(self.cfg.full_layers), self.kv_heads, self.cfg.head_dim, self.dtype)

    @property
    def page_bytes(self) -> int:
        """K and V of one page in every attention layer."""
        return self.kv_shape.page_bytes(self.page_size)

    @property
    def page_cost(self) -> int:
        """What a page costs in all: the target's K and V and a drafter's over the same page."""
        return self.page_bytes + self.draft_page_bytes

    def states(self, device: torch.device) -> StatePool:
        c = self.cfg
        return StatePool(
            len(c.linear_layers),
            self.slots,
            c.conv_kernel,
            self.conv_dim,
            self.v_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
            self.dtype,
            device,
            tail_rows=self.tail_rows,
        )

    def fitted(self, device: torch.device, context: int) -> PoolPlan:
        """This plan if its pools fit the device's free memory; else the same with as many KV
        pages as fit beside the states, shared by the lanes, when that is at least one whole
        context (else unchanged, for `build` to refuse by name)."""
        room = budget.free_bytes(torch.device(device))
        if room is None or self.nbytes <= room:
            return self
        pages = int(SHARED * room - self.state_bytes) // max(1, self.page_cost)
        return replace(self, pages=pages) if pages >= self.context_pages(context) else self

    def span(self, context: int) -> int:
        """The pages `context` tokens fill."""
        return -(-context // self.page_size)

    def whole_contexts(self, context: int) -> int:
        """How many lanes' whole contexts the pool holds (fewer than the lanes: they share it)."""
        return self.pages // self.span(context)

    def context_pages(self, context: int) -> int:
        """The pages one lane's whole context can reach (a partial page copied on a resume, the
        scratch page of graphs' padding lanes)."""
        return self.span(context) + 2

    @property
    def state_bytes(self) -> int:
        return self.states(torch.device("meta")).nbytes

    @property
    def nbytes(self) -> int:
        """The two pools' bytes (and a drafter's KV pool), before they are allocated."""
        return self.pages * self.page_cost + self.state_bytes

    def build(self, device: torch.device, lanes: int, context: int) -> ModelCaches:
        """The pools, once CacheTooLarge has been ruled out (it names --parallel and
        --context: `lanes` and `context`)."""
        check_fits(self.pages * self.page_cost, self.state_bytes, lanes, context, device)
        return self.allocate(device)

    def allocate(self, device: torch.device) -> ModelCaches:
        kv = self.kv_shape.pool(self.pages, self.page_size, device)
        return ModelCaches(kv, self.states(device))
