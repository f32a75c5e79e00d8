"""Decode passes replayed as CUDA graphs, one graph per lane count.

A decode pass launches a few hundred small kernels; from Python that costs far more than the
kernels themselves. A graph records the pass once, over static buffers, and replays it with one
launch. The graph runs exactly the kernels and configurations of the eager pass (same row tile,
same attention tiles, same recurrence), so a token's bits do not change; tests/test_gpu.py
compares the two bitwise.

Static per graph: every lane's KV slot table (a lane's rows are fixed at admission, so it is
copied only when the set of lanes changes), state slots, conv gather indices. Per step only the
lanes' last tokens and positions are copied in; the KV write rows are gathered inside the graph.
"""

from __future__ import annotations

import torch

from ..batch import ForwardBatch, LaneIndex
from ..ops.attention import AttentionTiles


class DecodeGraph:
    def __init__(self, model, caches, lanes: int, context: int) -> None:
        dev, k = model.device, model.config.conv_kernel
        self.model, self.caches, self.lanes = model, caches, lanes
        as_t = lambda v, dt=torch.long: torch.tensor(v, dtype=dt, device=dev)  # noqa: E731
        self.inputs = torch.zeros(2, lanes, dtype=torch.long, device=dev)  # last tokens, positions
        self.table = torch.zeros(lanes, context, dtype=torch.int32, device=dev)
        self.slots = torch.zeros(lanes, dtype=torch.long, device=dev)
        self.kv_write = torch.zeros(lanes, dtype=torch.long, device=dev)
        self.pos0 = torch.zeros(lanes, dtype=torch.int32, device=dev)
        hist = k - 1
        taps = [[i * hist + j for j in range(hist)] + [lanes * hist + i] for i in range(lanes)]
        keep = [[i * hist + j for j in range(1, hist)] + [lanes * hist + i] for i in range(lanes)]
        tiles = AttentionTiles(
            as_t(range(lanes), torch.int32),
            as_t([1] * lanes, torch.int32),
            self.pos0,
            as_t([i * context for i in range(lanes)], torch.int32),
            self.table.view(-1),
        )
        index = LaneIndex(self.slots, as_t(range(lanes + 1)), as_t(taps), as_t(keep), tiles)
        self.batch = ForwardBatch(
            self.inputs[0], self.inputs[1], self.kv_write, (), as_t(range(lanes)), index
        )
        self.members: tuple = ()
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def _load(self, reqs) -> None:
        members = tuple((r.request_id, r.slot) for r in reqs)
        if members != self.members:  # lanes joined or left: reload their tables
            for i, r in enumerate(reqs):
                self.table[i, : r.capacity] = r.kv_rows.to(torch.int32)
            self.slots.copy_(torch.tensor([r.slot for r in reqs]))
            self.members = members
        step = [[r.all_ids[r.num_computed] for r in reqs], [r.num_computed for r in reqs]]
        self.inputs.copy_(torch.tensor(step), non_blocking=True)

    def _forward(self) -> torch.Tensor:
        positions = self.inputs[1]
        self.pos0.copy_(positions.to(torch.int32))
        self.kv_write.copy_(self.table.gather(1, positions[:, None]).squeeze(1).long())
        return self.model.forward(self.batch, self.caches)

    def run(self, reqs) -> torch.Tensor:
        """Logits [lanes, V] of one decode row per lane (the requests in lane order)."""
        self._load(reqs)
        with torch.inference_mode():
            if self.graph is None:
                logits = self._forward()  # compiles every kernel and does this step's work
                torch.cuda.synchronize()
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):  # recorded, not run
                    self.logits = self._forward()
                return logits
            self.graph.replay()
        return self.logits


def is_decode_pass(work) -> bool:
    """Every lane feeds one row and needs that row's logits (Request.logit_rows): the graph's
    pass."""
    return all(n == 1 and req.logit_rows(1) == range(1) for req, n in work)
