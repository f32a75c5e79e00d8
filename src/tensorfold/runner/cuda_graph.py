"""Passes of a fixed shape replayed as CUDA graphs: one graph per (lanes, rows per lane).

From Python a decode pass's few hundred small kernels cost more to launch than to run; a graph
records the pass once over static buffers and replays it in one launch. It runs exactly the eager
pass's kernels and configurations, so a token's bits do not change (tests/test_gpu.py and
tests/test_gpu_drafting.py compare the two bitwise). A graph's pass is `lanes` lanes of `rows`
rows each (decode: 1; verify: 1 + K) and returns every row's logits; each lane gets the suffix
its LaneRows.logits names. Static per graph: the lanes' KV slot tables (reloaded only when the
set of lanes changes), conv gathers and attention tiles; per pass the tokens and positions are
copied in (and the state slots read and written, when they change: a verify pass's lanes write
their spares), the KV write rows and tile starts computed inside the graph. A
runner's graphs share one memory pool: its largest pass's working memory is held once.

Lane counts come in buckets (1, 2, 4, 8, then every 8 up to --parallel, as vLLM's capture sizes):
a pass of 13 lanes replays the 16-lane graph with 3 padding lanes (runner/plan.py, `padded`), so
a server whose lane count wanders records a few graphs, not one for every count.

A mixed graph adds one prompt lane of up to `--mixed-chunk` rows after the decoding lanes and
their padding (PromptPiece: the rows past a piece's real ones are padding): a prompt read
beside running streams in capped pieces then costs its rows' device time, not an eager pass's
launches. It returns the decoding rows' logits and the piece's last real row's (wanted when the
piece ends the prompt). With the engine's `lone_graphs` (the default), a prompt piece read alone replays a
mixed graph with no decoding lane (LONE_PIECES: 16 to 128 rows), so a short prompt, a chat's
next turn after the prompt cache, does not pay an eager pass's launches either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..batch import CHUNK, ForwardBatch, LaneIndex, Segment
from ..ops.attention import AttentionTiles, tile_rows
from ..ops.conv import conv_gather
from ..ops.gated_delta import grid_chunked
from ..ops.triton.tiles import ROW_CLASSES
from ..util import capturing, longs
from .plan import PassPlan, same_lanes


@dataclass(frozen=True)
class GraphShape:
    """A graph's pass: `lanes` lanes of `rows` rows each (decode: 1; verify: 1 + K), then one
    prompt lane of `prompt` rows when `prompt` is not 0."""

    lanes: int
    rows: int
    prompt: int = 0

    @property
    def key(self) -> tuple[int, ...]:
        return (self.lanes, self.rows) + ((self.prompt,) if self.prompt else ())

    @property
    def lane_rows(self) -> tuple[int, ...]:
        return (self.rows,) * self.lanes + ((self.prompt,) if self.prompt else ())


@dataclass(frozen=True)
class PromptPiece:
    """A mixed graph's prompt lane, last in the pass: its first rows are real, their count
    copied in per pass (`real`); the rows past them are padding that writes its K/V to a
    scratch row, which no kernel of a real row reads (the recurrence, the conv's kept rows, the
    attention tiles and the logits row follow the real count, on the device; LaneIndex.padded
    keeps the padding rows finite)."""

    real: torch.Tensor  # [1] the piece's real rows this pass
    lane: int  # its lane index
    row0: int  # its first row in the pass
    hist: int  # the conv's kept rows a lane (kernel - 1)
    tile_starts: torch.Tensor  # [its tiles] each tile's first row within the piece
    scratch: int  # the KV row its padding rows write
    row_ids: torch.Tensor  # [rows of the pass] 0, 1, 2, ...
    hist_ids: torch.Tensor  # [hist] 0, 1, ...


@dataclass
class StaticLanes:
    """A pass of a graph's shape over static buffers: fed tokens and positions are copied in,
    the KV write rows and attention tiles' first positions are computed from them inside the
    graph (refresh)."""

    batch: ForwardBatch
    inputs: torch.Tensor  # [2, rows (+ 1)]: fed tokens, positions (a piece's real rows)
    table: torch.Tensor  # [lanes, context] every lane's KV slot table
    slots: torch.Tensor  # [2, lanes] GDN state slots: each lane's read, and written (LaneIndex)
    kv_write: torch.Tensor
    pos0: torch.Tensor
    tile_row0: torch.Tensor  # [tiles] the pass row of each attention tile's first row
    first_rows: torch.Tensor  # [lanes] the pass row of each lane's first row
    row_lane: torch.Tensor  # [rows] the lane of each row
    piece: PromptPiece | None = None

    @classmethod
    def make(
        cls, lanes, rows, context, conv_kernel, dev, table=None, prompt=0, scratch=0, writes=False
    ) -> "StaticLanes":
        """`table` [lanes, context] may be shared with other passes of the same lanes; `prompt`:
        the most rows of one prompt lane after the `lanes` lanes of `rows` rows (`scratch`: the
        KV row its padding rows write); `writes`: the kernels take each lane's written slot
        (LaneIndex.writes: the per-token form's; the chunk forms refuse it)."""
        as_t = lambda v, dt=torch.long: torch.tensor(v, dtype=dt, device=dev)  # noqa: E731
        counts = GraphShape(lanes, rows, prompt).lane_rows
        row0 = [sum(counts[:i]) for i in range(len(counts) + 1)]
        n = row0[-1]
        inputs = torch.zeros(2, n + (1 if prompt else 0), dtype=torch.long, device=dev)
        if table is None:
            table = torch.zeros(len(counts), context, dtype=torch.int32, device=dev)
        slots = torch.zeros(2, len(counts), dtype=torch.long, device=dev)
        kv_write = torch.zeros(n, dtype=torch.long, device=dev)
        size = tile_rows(max(counts))  # the tiles an eager pass would cut
        cuts = [(i, s) for i, c in enumerate(counts) for s in range(0, c, size)]
        pos0 = torch.zeros(len(cuts), dtype=torch.int32, device=dev)
        shape = tuple(Segment(0, 0, row0[i], c, None) for i, c in enumerate(counts))
        taps, keep = conv_gather(shape, conv_kernel)
        tile_row0 = [row0[i] + s for i, s in cuts]
        tiles = AttentionTiles(
            as_t(tile_row0, torch.int32),
            as_t([min(size, counts[i] - s) for i, s in cuts], torch.int32),
            pos0,
            as_t([i * context for i, _ in cuts], torch.int32),
            table.view(-1),
            size,
            min(size, max(counts)),
            context,  # any lane may reach its capacity: its super-blocks past its length exit
            sum(1 for i, _ in cuts if counts[i] > 1),
        )
        tails = torch.zeros(len(counts), dtype=torch.long, device=dev)
        index = LaneIndex(
            slots[0], as_t(row0), as_t(taps), as_t(keep), tiles, tails, padded=bool(prompt),
            writes=slots[1] if writes else None, most_rows=max(counts),
        )  # fmt: skip
        wanted = list(range(lanes * rows)) + ([n - 1] if prompt else [])
        batch = ForwardBatch(inputs[0, :n], inputs[1, :n], kv_write, (), as_t(wanted), index)
        lane_of = [i for i, c in enumerate(counts) for _ in range(c)]
        piece = None
        if prompt:
            starts = [s for i, s in cuts if i == lanes]
            piece = PromptPiece(
                inputs[0, n:], lanes, row0[lanes], conv_kernel - 1, as_t(starts, torch.int32),
                scratch, torch.arange(n, device=dev), torch.arange(conv_kernel - 1, device=dev),
            )  # fmt: skip
        return cls(
            batch, inputs, table, slots, kv_write, pos0,
            as_t(tile_row0), as_t(row0[:-1]), as_t(lane_of), piece,
        )  # fmt: skip

    def refresh(self) -> None:
        """Inside the graph: the KV write rows and tile starts of the positions fed (and what
        follows a prompt piece's real rows)."""
        positions = self.batch.positions
        self.pos0.copy_(positions[self.tile_row0].to(torch.int32))
        self.batch.lanes.tails.copy_(positions[self.first_rows] % CHUNK)
        write = self.table[self.row_lane, positions].long()
        p = self.piece
        if p is None:
            self.kv_write.copy_(write)
            return
        lanes, end = self.batch.lanes, p.row0 + p.real  # [1]: the pass row past the real ones
        self.kv_write.copy_(torch.where(p.row_ids < end, write, p.scratch))
        lanes.cu_seqlens[-1:].copy_(end)
        tiles = lanes.attention
        count = p.tile_starts.shape[0]
        size = tiles.size
        tiles.rows[-count:].copy_((p.real - p.tile_starts).clamp(0, size).to(torch.int32))
        # the conv's kept rows: the piece's last `hist` rows of [its conv state ; its rows]
        q = p.real + p.hist_ids
        past = len(self.first_rows) * p.hist + p.row0 - p.hist
        lanes.conv_keep[-1].copy_(torch.where(q < p.hist, p.lane * p.hist + q, past + q))
        self.batch.logit_rows[-1:].copy_(end - 1)


class PassGraph:
    def __init__(
        self, model, caches, lanes, rows, context, pool=None, prompt: int = 0, scratch: int = 0
    ) -> None:
        self.pool = pool  # the memory pool it shares with the others
        self.model, self.caches, self.lanes, self.rows = model, caches, lanes, rows
        cfg = model.config
        self.lane = StaticLanes.make(
            lanes, rows, context, cfg.conv_kernel, model.device, prompt=prompt, scratch=scratch,
            writes=not grid_chunked(model.gdn_form),
        )  # fmt: skip
        self.inputs, self.table, self.slots = self.lane.inputs, self.lane.table, self.lane.slots
        self.batch = self.lane.batch
        self.members: tuple = ()  # (key, KV rows tensor) of each lane whose table is loaded
        self.slots_loaded: list[int] = []
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self.kept: tuple = (None, None)  # the model's kept states of the recorded pass

    def _load(self, plan: PassPlan) -> None:
        if not same_lanes(plan, self.members):  # lanes joined or left: reload their tables
            for i, lane in enumerate(plan):
                self.table[i, : lane.capacity] = lane.kv_rows.to(torch.int32)
            self.members = tuple((lane.key, lane.kv_rows) for lane in plan)
        reads, outs = [lane.slot for lane in plan], [lane.out for lane in plan]
        if self.batch.lanes.writes is None and outs != reads:
            raise ValueError("a chunk form's graph keeps each lane's state in its own slot")
        slots = reads + outs
        if slots != self.slots_loaded:  # a verify pass's lanes write their spares
            self.slots.copy_(longs((reads, outs)), non_blocking=True)
            self.slots_loaded = slots
        ids, positions = [], []
        for lane in plan:
            ids += lane.token_ids
            positions += range(lane.start, lane.start + lane.rows)
        piece = self.lane.piece
        if piece is not None:  # padding rows at the piece's last position, then its real rows
            pad = self.inputs.shape[1] - 1 - len(ids)
            ids += [0] * pad + [plan.lanes[-1].rows]
            positions += [positions[-1]] * (pad + 1)
        self.inputs.copy_(longs((ids, positions)), non_blocking=True)
        if plan.fed is not None:  # tokens the device chose for this pass, not read back
            plan.fed.apply(self.inputs[0])

    def _forward(self) -> torch.Tensor:
        self.lane.refresh()
        return self.model.forward(self.batch, self.caches)

    def run(self, plan: PassPlan) -> torch.Tensor:
        """Logits [lanes * rows (+ 1), V] of every decoding row (the plan's lanes in order) and
        of a prompt lane's last row. On a replay the
        model's kept states (an MTP or DFlash drafter reads them) are the graph's own buffers."""
        self._load(plan)
        model = self.model
        with torch.inference_mode():
            if self.graph is None:
                logits = self._forward()  # compiles every kernel and does this pass's work
                eager = (model.hidden, model.tapped)
                self.graph, self.logits = record(self._forward, self.pool)
                self.kept = (model.hidden, model.tapped)
                model.hidden, model.tapped = eager
                return logits
            self.graph.replay()
        model.hidden, model.tapped = self.kept
        return self.logits


def record(fn, pool):
    """fn() recorded, not run, as a CUDA graph in memory pool `pool` (after an eager run of it,
    which compiled its kernels): (the graph, fn's outputs, which each replay rewrites)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capturing(graph, pool):
        out = fn()
    return graph, out


def lane_buckets(parallel: int) -> tuple[int, ...]:
    """The lane counts graphs are recorded for when a server runs up to `parallel` lanes."""
    small = [n for n in (1, 2, 4, 8) if n < parallel]
    return tuple(small + list(range(16, parallel, 8)) + [parallel])


def bucket(lanes: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket holding `lanes` lanes (itself past the largest: a pass with drafting's
    forks, or a runner without buckets)."""
    return next((b for b in buckets if b >= lanes), lanes)


def graph_rows(plan: PassPlan, allowed: frozenset[int]) -> int | None:
    """The rows per lane of a pass a graph can replay, or None: every lane feeds the same number
    of rows, one of `allowed`, and needs the logits of a non-empty suffix of them."""
    counts = {lane.rows for lane in plan}
    if len(counts) != 1:
        return None
    (n,) = counts
    if n not in allowed:
        return None
    for lane in plan:
        if len(lane.logits) == 0 or lane.logits.stop != n:
            return None
    return n


# the products' largest row tile: past the last rows class, a pass whose rows end just past a
# multiple of it pays for a whole tile more (on the H200, 16 streams and a 128-row piece: 144
# rows, 28.4 ms a pass; with a 112-row piece, 128 rows: 23.3 ms)
PIECE_ALIGN = 128

# the pieces of a prompt read alone from graphs (mixed graphs with no decoding lane), each the
# top of a products' rows class, so a piece replays in the class an eager pass of it would take;
# from Python a short prompt's eager kernels cost more to launch than to run
LONE_PIECES = (16, 32, 64, 128)


def piece_room(piece: int, decode_rows: int) -> int:
    """The rows of a mixed graph's prompt lane beside `decode_rows` rows (padding lanes'
    included): `piece` cut so that the pass's rows end on the top of a products' rows class
    (tiles.ROW_CLASSES: 64, 128, 256, ...; past them a multiple of PIECE_ALIGN), whose launch
    shape a few rows more would leave for the next class's, unless that leaves less than half
    of it."""
    total = decode_rows + piece
    tops = [top for top in ROW_CLASSES if top <= total] + [total - total % PIECE_ALIGN]
    room = max(tops) - decode_rows
    return room if room >= max(1, piece // 2) else piece


def mixed_room(piece: int, lanes: int, rows: int, buckets=()) -> int:
    """The prompt rows of the mixed graph beside `lanes` decoding lanes of `rows` rows each
    (padded to their bucket)."""
    return piece_room(piece, bucket(lanes, buckets) * rows)


def graph_shape(plan: PassPlan, allowed: frozenset[int], piece: int = 0, buckets=()):
    """The GraphShape of a pass a graph can replay, or None: lanes of equal rows (graph_rows),
    or (`piece` rows > 0) such lanes and then one prompt lane of at most piece_room rows beside
    their bucket's, wanting no logits or its last row's: a mixed graph of that many rows. A
    prompt piece alone is such a pass with no decoding lanes (its padding rows write the
    padding lanes' scratch row: `buckets` given): a short prompt then costs its rows' device
    time, not an eager pass's launches."""
    rows = graph_rows(plan, allowed)
    if rows is not None:
        return GraphShape(len(plan), rows)
    if not piece or not len(plan) or (len(plan) == 1 and not buckets):
        return None
    last = plan.lanes[-1]
    wants = last.logits
    if len(wants) and wants != range(last.rows - 1, last.rows):
        return None
    if len(plan) == 1:
        room = piece_room(piece, 0)
        return GraphShape(0, 1, room) if last.rows <= room else None
    rows = graph_rows(PassPlan(plan.lanes[:-1]), allowed)
    if rows is None:
        return None
    room = mixed_room(piece, len(plan) - 1, rows, buckets)
    return GraphShape(len(plan) - 1, rows, room) if last.rows <= room else None


def lane_logits(plan: PassPlan, rows: int, logits: torch.Tensor) -> dict[int, torch.Tensor]:
    """Each lane's wanted rows of a graph's logits [lanes * rows, V]: {index in plan: [r, V]}."""
    return {i: logits[i * rows + lane.logits.start : (i + 1) * rows] for i, lane in enumerate(plan)}
