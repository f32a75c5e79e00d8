"""The MTP head's draft steps as CUDA graphs (drafters/mtp.py drafts with them on a GPU).

Eager, one head step launches a few dozen small kernels from Python: on an H200 that costs more
than a decode pass replayed from a graph (the demo model: ~0.7 ms a step against 0.45 ms a
pass). So a proposal replays two graphs, each recorded once per shape over static buffers:

- catch-up, n rows (1 <= n <= `rows`: a verify pass's committed rows, a short prompt's, or a
  lane's full hold): the head over a lane's committed rows not yet run (position p: the
  target's state h[p] with the token t[p+1]), writing their head KV rows; its last row's argmax
  is the first draft;
- chain, k drafts: k - 1 single-row steps, each feeding the step before's output and argmax
  back in at the next position; the drafts stay on the device until one read at the end.

A lane's KV slot table is copied in when the lane differs from the last one replayed. The graphs
run the head through the layers' kernels (MTPHead.forward_pass), not its plain-torch form, so
their drafts may differ in bits from the eager head's: drafts are guesses (the target decides
every token), so no token changes. tests/test_gpu_drafting.py checks that replays give the
drafts of the first, eager run of the same graph.
"""

from __future__ import annotations

import torch

from ..util import longs
from .cuda_graph import StaticLanes, record
from .plan import LaneRows, same_lanes


class _Recorded:
    """One recorded function of static buffers: run eagerly the first time (compiles the kernels
    and picks launch shapes, which may sync), recorded on the second, replayed after."""

    def __init__(self, fn, pool) -> None:
        self.fn, self.pool = fn, pool
        self.graph: torch.cuda.CUDAGraph | None = None
        self.runs = 0

    @property
    def cold(self) -> bool:
        """Whether its next run compiles or records rather than replays."""
        return self.graph is None

    def __call__(self) -> None:
        self.runs += 1
        if self.graph is not None:
            self.graph.replay()
            return
        if self.runs == 1:
            self.fn()
            return
        self.graph, _ = record(self.fn, self.pool)
        self.graph.replay()


class MTPGraphs:
    """A drafter's head graphs: catch-ups of 1..rows rows and chains of 1..K drafts."""

    def __init__(self, head, target, kv, context: int, most: int, rows: int) -> None:
        dev = target.device
        self.head, self.target, self.kv, self.context = head, target, kv, context
        self.most, self.rows = most, rows  # K: the longest chain; the largest catch-up
        width = target.config.hidden_size
        self.table = torch.zeros(1, context, dtype=torch.int32, device=dev)
        self.hidden = torch.zeros(rows, width, dtype=head.fc.weight.dtype, device=dev)
        self.out = torch.zeros(1, width, dtype=head.fc.weight.dtype, device=dev)  # chain's input
        self.drafts = torch.zeros(most, dtype=torch.long, device=dev)  # [0]: the first draft
        self.pool = torch.cuda.graph_pool_handle()
        self.member: tuple = ()  # (key, KV rows) of the lane whose table is loaded
        self.cold_runs = 0  # runs that compiled or recorded rather than replayed
        self.catch_ups: dict[int, tuple[StaticLanes, _Recorded]] = {}
        self.chains: dict[int, tuple[list[StaticLanes], _Recorded]] = {}

    def _lane(self, rows: int) -> StaticLanes:
        cfg = self.target.config
        return StaticLanes.make(
            1, rows, self.context, cfg.conv_kernel, self.target.device, self.table
        )

    def _load(self, place: LaneRows) -> None:
        if not same_lanes((place,), self.member):
            self.table[0, : place.capacity] = place.kv_rows.to(torch.int32)
            self.member = ((place.key, place.kv_rows),)

    def catch_up(
        self, place: LaneRows, start: int, ids: list[int], pieces: list[torch.Tensor]
    ) -> None:
        """The head over positions start.. (ids: t[p+1]; pieces: h[p], in order, copied into the
        graph's buffer as they are); leaves the first draft in drafts[0] and the last row's
        output in `out`, where a chain reads them."""
        n = len(ids)
        if n not in self.catch_ups:
            lane = self._lane(n)
            self.catch_ups[n] = (lane, _Recorded(lambda: self._catch_up(lane, n), self.pool))
        lane, run = self.catch_ups[n]
        self._load(place)
        lane.inputs.copy_(longs((ids, range(start, start + n))), non_blocking=True)
        at = 0
        for piece in pieces:
            self.hidden[at : at + piece.shape[0]].copy_(piece)
            at += piece.shape[0]
        self.cold_runs += run.cold
        with torch.inference_mode():
            run()

    def _catch_up(self, lane: StaticLanes, n: int) -> None:
        lane.refresh()
        kv = (self.kv.k[0], self.kv.v[0])
        logits, x = self.head.forward_pass(
            self.target, lane.inputs[0], self.hidden[:n], lane.batch, kv
        )
        self.drafts[0] = logits.argmax()
        self.out.copy_(x[-1:])

    def set_start(self, first: torch.Tensor, out: torch.Tensor) -> None:
        """A catch-up run eagerly (more rows than a graph's): its first draft and output."""
        self.drafts[0] = first
        self.out.copy_(out)

    def chain(
        self, place: LaneRows, position: int, k: int, read: bool = True
    ) -> list[int] | torch.Tensor:
        """k drafts: drafts[0] and k - 1 head steps from position `position` on; `read` False:
        a copy of them on the device, not read back (the next lane's chain rewrites the buffer)."""
        if k not in self.chains:
            lanes = [self._lane(1) for _ in range(k - 1)]
            self.chains[k] = (lanes, _Recorded(lambda: self._chain(lanes), self.pool))
        lanes, run = self.chains[k]
        self._load(place)
        if lanes:
            lanes[0].inputs[1].fill_(position)
            self.cold_runs += run.cold
            with torch.inference_mode():
                run()
        return self.drafts[:k].tolist() if read else self.drafts[:k].clone()

    def _chain(self, lanes: list[StaticLanes]) -> None:
        kv, out = (self.kv.k[0], self.kv.v[0]), self.out
        for j, lane in enumerate(lanes):
            if j:
                lane.inputs[1].copy_(lanes[0].inputs[1] + j)
            lane.inputs[0].copy_(self.drafts[j : j + 1])
            lane.refresh()
            logits, out = self.head.forward_pass(self.target, lane.inputs[0], out, lane.batch, kv)
            self.drafts[j + 1] = logits.argmax()
