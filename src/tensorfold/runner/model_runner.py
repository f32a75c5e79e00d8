"""Turns a pass plan into one forward over all its rows, and returns the logits it needs."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from ..batch import ForwardBatch, Segment
from ..cache import ModelCaches
from ..models.qwen3_5 import Qwen35Model
from ..ops.dispatch import lane_index
from ..util import longs
from .cuda_graph import (
    GraphShape,
    PassGraph,
    bucket,
    graph_shape,
    lane_logits,
    mixed_room,
    piece_room,
)
from .plan import LaneRows, PassPlan, padded

SMALL_MODEL_BYTES = 512 << 20


def eager_batch(
    model: Qwen35Model, segments: tuple[Segment, ...], token_ids: torch.Tensor, logit_rows
) -> ForwardBatch:
    """An eager pass over `segments` (rows in their order) feeding `token_ids`."""
    dev = token_ids.device
    positions = torch.cat([torch.arange(s.start, s.start + s.length) for s in segments])
    return ForwardBatch(
        token_ids=token_ids,
        positions=positions.to(dev, non_blocking=True),  # copies that wait for no queue
        kv_write=torch.cat([s.kv_rows[s.start :] for s in segments]),
        segments=segments,
        logit_rows=longs(logit_rows, dev),
        lanes=lane_index(segments, dev, model.config.conv_kernel, model.gdn_form == "chunk"),
    )


def set_cpu_threads(weight_bytes: int, requested: int | None = None) -> int:
    """A power-of-two thread count: torch splits a large elementwise op into per-thread ranges,
    and only then do those ranges stay multiples of the vector width (no scalar tails). Small
    models get one thread: their products take microseconds, and a thread barrier costs more
    (milliseconds when another process holds a core)."""
    n = requested or (1 if weight_bytes < SMALL_MODEL_BYTES else torch.get_num_threads())
    n = 1 << (max(1, n).bit_length() - 1)
    torch.set_num_threads(n)
    return n


def tensor_bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()


@dataclass
class CollectiveTime:
    """Time in a tensor split's collectives: in total and in the last pass (zero when whole)."""

    seconds: float = 0.0
    calls: int = 0
    last_pass_seconds: float = 0.0


class ModelRunner:
    def __init__(
        self,
        model: Qwen35Model,
        caches: ModelCaches,
        threads: int | None = None,
        cuda_graphs: bool = False,
        context: int = 0,
    ) -> None:
        self.model, self.caches = model, caches
        self.device = model.device
        if self.device.type == "cpu":
            self.threads = set_cpu_threads(model.weight_bytes, threads)
        # every layer's GPU path runs with no host sync (the MoE layers build their expert tiles
        # on the device, sized from the row count alone): tests/test_gpu_moe.py on the card
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        self.context, self.graphs = context, {}
        self.graph_rows = frozenset({1})  # rows per lane a graph may have (engine: 1..1+K)
        # the most rows of a prompt piece a mixed graph takes after them (engine: --mixed-chunk)
        self.piece_rows = 0
        # a prompt piece alone replays the smallest of these mixed graphs of no decoding lane
        # that it fits (engine: lone_graphs)
        self.lone_pieces: tuple[int, ...] = ()
        # (lanes, rows) or (lanes, rows, prompt rows) -> passes run from graphs
        self.replays: dict[tuple[int, ...], int] = {}
        # passes that recorded their graph (after an eager run that compiled its kernels): a
        # drafting gate's prices leave them out, as nothing like a replay's time
        self.cold_passes = 0
        self.pool = None  # the graphs' shared memory pool, made with the first graph
        self.buckets: tuple[int, ...] = ()  # lane counts graphs are recorded for (pad_lanes)
        self.pad: tuple[int, torch.Tensor] | None = None  # padding lanes' state slot, KV rows
        self.collective = CollectiveTime()

    def execute(self, plan: PassPlan) -> dict[int, torch.Tensor]:
        """Returns {index in plan: logits [r, V]} of the rows each lane asks for (its `logits`
        offsets), for the lanes that ask for any."""
        shape = self.shape(plan) if self.use_graphs else None
        if shape is not None:
            return self._replay(plan, shape)
        batch, owners = self.batch(plan)
        with torch.inference_mode():
            logits = self.model.forward(batch, self.caches)
        out: dict[int, list[torch.Tensor]] = {}
        for r, owner in enumerate(owners):
            out.setdefault(owner, []).append(logits[r])
        return {i: torch.stack(rows) for i, rows in out.items()}

    def shape(self, plan: PassPlan) -> GraphShape | None:
        """The graph that replays `plan`, or None (eager): a prompt piece alone takes the
        smallest of the lone pieces it fits, so that the pass stays in the rows class an eager
        pass of it would take (the products' launch shape)."""
        piece = self.piece_rows if len(plan) > 1 else 0
        if len(plan) == 1 and self.lone_pieces:
            rows = plan.lanes[0].rows
            piece = next((p for p in self.lone_pieces if rows <= piece_room(p, 0)), 0)
        return graph_shape(plan, self.graph_rows, piece, self.buckets)

    def batch(self, plan: PassPlan) -> tuple[ForwardBatch, list[int]]:
        """The eager pass of `plan`, and the index in plan of each logits row it returns."""
        ids, segments, logit_rows, owners = [], [], [], []
        row = 0
        for i, lane in enumerate(plan):
            start, n = lane.start, lane.rows
            ids += lane.token_ids
            kv_rows = lane.kv_rows[: start + n]
            segments.append(Segment(lane.slot, start, row, n, kv_rows, lane.writes))
            logit_rows += [row + j for j in lane.logits]
            owners += [i] * len(lane.logits)
            row += n
        ids = longs(ids, self.device)
        if plan.fed is not None:
            plan.fed.apply(ids)
        return eager_batch(self.model, tuple(segments), ids, logit_rows), owners

    def ranks_memory(self) -> list:
        """Each rank's bytes when the model is split (runner/distributed.py); none when whole."""
        return []

    def close(self) -> None:
        """Releases what the runner holds beyond this process (the ranks of a split)."""

    def greedy(self, rows: torch.Tensor) -> torch.Tensor:
        """The first maximum of each logit row [R, V], on the rows' device (no sync)."""
        return rows.argmax(-1)

    def mixed_room(self, decode_rows: list[int]) -> int:
        """The prompt rows a mixed graph takes beside decoding lanes of `decode_rows` rows each
        (`piece_rows` when they differ: that pass is eager)."""
        if len(set(decode_rows)) != 1:
            return self.piece_rows
        return mixed_room(self.piece_rows, len(decode_rows), decode_rows[0], self.buckets)

    def pad_lanes(self, buckets: tuple[int, ...]) -> None:
        """Replays passes in graphs of `buckets` lane counts, padded with lanes that write one
        scratch state slot and KV page, taken here from the pools (their plan holds one more of
        each for it: cache/sizing.py)."""
        kv = self.caches.kv
        page = kv.allocate(1)
        rows = kv.rows(page, kv.page_size)
        self.buckets, self.pad = tuple(buckets), (self.caches.states.allocate(), rows)

    def pad_lane(self, rows: int) -> LaneRows:
        """A padding lane of `rows` rows: token 0 from position 0 into the scratch slot and page
        (positions past the page wrap onto it; what they write is never read by a real lane)."""
        slot, page_rows = self.pad
        kv_rows = page_rows[torch.arange(rows, device=page_rows.device) % page_rows.shape[0]]
        return LaneRows("padding", slot, 0, (0,) * rows, kv_rows, (), range(rows - 1, rows))

    def _replay(self, plan: PassPlan, shape: GraphShape) -> dict[int, torch.Tensor]:
        """The pass from its bucket's graph: padding lanes after the decoding lanes, before a
        mixed graph's prompt lane."""
        n, rows = shape.lanes, shape.rows
        lanes = bucket(n, self.buckets) if n else 0  # a prompt piece alone: no padding lane
        pads = lanes > n
        full = padded(plan, len(plan) + lanes - n, self.pad_lane(rows), at=n) if pads else plan
        key = GraphShape(lanes, rows, shape.prompt).key
        graph = self.graphs.get(key)
        if graph is None:
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            scratch = int(self.pad[1][0]) if self.pad else 0  # the padding lanes' page
            graph = self.graphs[key] = PassGraph(
                self.model, self.caches, lanes, rows, self.context, self.pool, shape.prompt, scratch
            )
        self.cold_passes += graph.graph is None
        # the graph's output buffer is rewritten by the next replay; padding rows are dropped
        out = graph.run(full)
        if shape.prompt and pads:  # one copy of the real rows
            logits = torch.cat([out[: n * rows], out[lanes * rows :]])
            self._drop_padding(n * rows, lanes * rows)
        else:
            logits = out[: n * rows + (1 if shape.prompt else 0)].clone()
        self.replays[key] = self.replays.get(key, 0) + 1
        got = lane_logits(PassPlan(plan.lanes[:n]), rows, logits)
        if shape.prompt and len(plan.lanes[n].logits):
            got[n] = logits[n * rows :]
        return got

    def _drop_padding(self, start: int, stop: int) -> None:
        """The model's kept states (a drafter reads them by the plan's rows) without the padding
        lanes' rows start:stop of a mixed graph."""
        model = self.model
        for name in ("hidden", "tapped"):
            kept = getattr(model, name)
            if kept is not None:
                setattr(model, name, torch.cat([kept[:start], kept[stop:]]))

    def fingerprint(self, lane: LaneRows, logits: torch.Tensor | None) -> str:
        """sha256 of the lane's GDN and conv states and its KV rows after `lane.start`
        positions, and the logits."""
        h = hashlib.sha256()
        for t in self.caches.states.slot_bytes(lane.slot, lane.start):
            h.update(tensor_bytes(t))
        rows = lane.kv_rows[: lane.start]
        for k, v in zip(self.caches.kv.k, self.caches.kv.v):
            h.update(tensor_bytes(k[rows]))
            h.update(tensor_bytes(v[rows]))
        if logits is not None:
            h.update(tensor_bytes(logits))
        return h.hexdigest()
