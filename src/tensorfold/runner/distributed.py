"""Running a tensor split: rank 0 leads (scheduler, server, prompt cache), the others follow.

Each step the leader broadcasts a pass plan: the cache operations since the last plan (state
slots reset, snapshotted, restored, dropped; KV pages copied), in order, then each lane's rows
(slot, positions, token ids, pages). Every rank then runs the same forward over its part of the
model; the all-gathers inside it (ops/collective.py) give every rank the whole activations, and
the leader the whole logits. Plans travel over a gloo group (CPU objects) even when the tensors
go over NCCL. docs/architecture.md, 'A pass across ranks'.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import os
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass

import torch

from ..cache import ModelCaches
from ..cache.sizing import PoolPlan, chunk_tail
from ..errors import RankLost, SplitRefused
from ..models.qwen3_5 import Qwen35Model
from ..models.split import row_widths
from ..ops.collective import Group, split_argmax
from ..ops.gated_delta import grid_chunked
from ..util import rss_bytes
from .model_runner import ModelRunner, tensor_bytes
from .plan import LaneRows, PassPlan


def init_group(world: int, device: torch.device) -> Group:
    """Joins the split described by the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT:
    torchrun's, or those `tensorfold --tensor-parallel` sets for the ranks it starts)."""
    import datetime

    import torch.distributed as dist

    env = int(os.environ.get("WORLD_SIZE", "1"))
    if env != world:
        raise SplitRefused(f"--tensor-parallel {world}, but the launcher started {env} ranks")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # A pass's collectives wait at most this long for a rank that hangs (a dead rank's closed
    # sockets fail them at once); plans and reports wait for as long as the server is idle.
    timeout = datetime.timedelta(seconds=float(os.environ.get("TENSORFOLD_SPLIT_TIMEOUT", 600)))
    idle = datetime.timedelta(days=365)
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=idle)
    reports = dist.new_group(backend="gloo", timeout=idle)
    return Group(dist.get_rank(), world, None, control, reports)


def _broadcast(obj, control) -> object:
    import torch.distributed as dist

    box = [obj]
    try:
        dist.broadcast_object_list(box, src=0, group=control)
    except Exception as exc:
        raise RankLost(f"a pass plan could not reach every rank: {exc}") from exc
    return box[0]


def _gather(obj, control, world: int) -> list:
    import torch.distributed as dist

    out = [None] * world
    try:
        dist.all_gather_object(out, obj, group=control)
    except Exception as exc:
        raise RankLost(f"a report could not be gathered from every rank: {exc}") from exc
    return out


STOP = "stop"  # rank 0's last /memory report round: the report threads end


@dataclass(frozen=True)
class LanePlan:
    """One lane's rows of a pass, as a following rank needs them."""

    key: str
    slot: int
    start: int  # position of the first row
    tokens: tuple[int, ...]  # the rows' token ids
    pages: tuple[int, ...] | None  # None: as in the last pass (a lane's table never changes)
    capacity: int
    wanted: tuple[int, int]  # logit_rows of the pass: [start, stop) offsets


@dataclass(frozen=True)
class Plan:
    ops: tuple  # cache operations since the last plan, in order
    kind: str  # "hello", "pass", "fingerprint" or "stop"
    lanes: tuple[LanePlan, ...] = ()
    body: tuple = ()


class CacheLog:
    """Records the leader's cache operations for the followers to repeat in the same order. The
    pools' methods are wrapped on the instances, so the scheduler and the prompt cache stay as
    they are; a snapshot dropped by the prompt cache is logged when it is collected."""

    def __init__(self, caches: ModelCaches) -> None:
        self.ops: deque = deque()
        self._ids: dict[int, int] = {}  # id(snapshot) -> its number
        self._count = itertools.count()
        states, kv = caches.states, caches.kv
        reset, snapshot, restore, copy = states.reset, states.snapshot, states.restore, kv.copy_page
        states.reset = lambda slot: (self.ops.append(("reset", slot)), reset(slot))[1]
        states.restore = lambda slot, snap: (
            self.ops.append(("restore", slot, self._ids[id(snap)])),
            restore(slot, snap),
        )[1]
        kv.copy_page = lambda src, dst: (self.ops.append(("copy", src, dst)), copy(src, dst))[1]
        states.snapshot = lambda slot: self._snapshot(snapshot, slot)

    def _snapshot(self, snapshot, slot: int):
        snap, n = snapshot(slot), next(self._count)
        self._ids[id(snap)] = n
        self.ops.append(("snapshot", slot, n))
        weakref.finalize(snap, self._dropped, id(snap), n)
        return snap

    def _dropped(self, key: int, n: int) -> None:
        self._ids.pop(key, None)
        self.ops.append(("drop", n))

    def take(self) -> tuple:
        out = []
        while self.ops:
            out.append(self.ops.popleft())
        return tuple(out)


def apply_ops(ops: tuple, caches: ModelCaches, snaps: dict) -> None:
    """A follower repeats the leader's cache operations on its own pools."""
    for op in ops:
        if op[0] == "reset":
            caches.states.reset(op[1])
        elif op[0] == "snapshot":
            snaps[op[2]] = caches.states.snapshot(op[1])
        elif op[0] == "restore":
            caches.states.restore(op[1], snaps[op[2]])
        elif op[0] == "drop":
            snaps.pop(op[1], None)
        elif op[0] == "copy":
            caches.kv.copy_page(op[1], op[2])


@dataclass(frozen=True)
class RankMemory:
    """One rank's bytes by owner (/memory)."""

    rank: int
    device: str
    weights_bytes: int
    kv_pool_bytes: int
    state_pool_bytes: int
    process_rss_bytes: int
    device_allocated_bytes: int | None


def rank_memory(model: Qwen35Model, caches: ModelCaches, rank: int) -> RankMemory:
    cuda = model.device.type == "cuda"
    return RankMemory(
        rank,
        str(model.device),
        model.weight_bytes,
        caches.kv.nbytes,
        caches.states.nbytes,
        rss_bytes(),
        torch.cuda.memory_allocated(model.device) if cuda else None,
    )


class SplitRunner(ModelRunner):
    """The leader's runner: each pass's plan goes to every rank before its own forward."""

    def __init__(self, model: Qwen35Model, caches: ModelCaches, *args) -> None:
        super().__init__(model, caches, *args)
        self.group: Group = model.group
        self.world = self.group.world
        self.vocab_widths = row_widths(model.config.vocab_size, self.world)  # the head's cut
        self.log = CacheLog(caches)
        pools = (caches.kv.num_pages, caches.kv.page_size, caches.states.num_slots)
        hello = (identity(model), *pools, model.gdn_form, *args)
        self._send(Plan((), "hello", body=hello))
        self._report_lock = threading.Lock()
        self._tables: dict[str, tuple[int, ...]] = {}  # page tables the followers hold
        atexit.register(self._close_at_exit)  # a forgotten close() must not leave ranks waiting

    def _send(self, plan: Plan) -> None:
        _broadcast(plan, self.group.control)

    def execute(self, plan: PassPlan) -> dict[int, torch.Tensor]:
        lanes, tables = [], {}
        for lane in plan:
            tables[lane.key] = lane.pages
            lanes.append(
                LanePlan(
                    lane.key,
                    lane.slot,
                    lane.start,
                    lane.token_ids,
                    None if self._tables.get(lane.key) == lane.pages else lane.pages,
                    lane.capacity,
                    (lane.logits.start, lane.logits.stop),
                )
            )
        self._tables = tables  # the followers keep the tables of the last pass's lanes
        lanes = tuple(lanes)
        start = time.perf_counter()
        self._send(Plan(self.log.take(), "pass", lanes))
        sent = time.perf_counter() - start
        out = super().execute(plan)
        seconds, calls = self.group.take_time()
        seconds += sent
        self.collective.seconds += seconds
        self.collective.calls += calls
        self.collective.last_pass_seconds = seconds
        return out

    def greedy(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.tensor(split_argmax(rows, self.vocab_widths), dtype=torch.long)

    def fingerprint(self, lane: LaneRows, logits: torch.Tensor | None) -> str:
        """The whole model's fingerprint of the lane, from every rank's part of its states."""
        body = (lane.slot, lane.pages, lane.capacity, lane.start)
        self._send(Plan(self.log.take(), "fingerprint", body=body))
        pieces = _gather(lane_pieces(self.caches, *body), self.group.control, self.world)
        return whole_fingerprint(pieces, self.model, logits)

    def ranks_memory(self) -> list[RankMemory]:
        """Every rank's bytes (any thread: the reports travel on their own group)."""
        own = rank_memory(self.model, self.caches, self.group.rank)
        if self.group.stopped:  # the other ranks no longer report
            return [own]
        with self._report_lock:
            try:
                return _gather(own, self.group.reports, self.world)
            except RankLost:  # the split is lost: the engine stops on its next pass
                return [own]

    def close(self) -> None:
        """Tells the other ranks to stop (once per split, whichever runner leads it then)."""
        if self.group.stopped:
            return
        self.group.stopped = True
        self._send(Plan(self.log.take(), "stop"))
        with self._report_lock:  # ends the other ranks' report threads too
            _gather(STOP, self.group.reports, self.world)
        _release()

    def _close_at_exit(self) -> None:
        try:
            self.close()
        except RankLost:  # nothing left to stop
            pass


def _release() -> None:
    """Tears the process groups down while the interpreter still runs: left to its exit, gloo's
    teardown sometimes aborted the process (terminate called without an active exception)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def identity(model: Qwen35Model) -> str:
    """What every rank of a split must agree on: the config, the dtype, the layout, the split."""
    digest = hashlib.sha256(repr(model.config).encode()).hexdigest()[:16]
    return f"config {digest}, {model.dtype}, {model.layout}, {model.group.world} ranks"


def lane_pieces(caches: ModelCaches, slot: int, pages, capacity: int, computed: int) -> dict:
    """This rank's part of a lane's states and KV rows (CPU copies)."""
    rows = caches.kv.rows(list(pages), capacity)[:computed]
    state = [t.cpu() for t in caches.states.slot_bytes(slot, computed)]
    return {
        "conv": state[0::4],
        "recurrent": state[1::4],
        "tail": state[2::4],
        "tail_gates": state[3::4],
        "k": [t[rows].cpu() for t in caches.kv.k],
        "v": [t[rows].cpu() for t in caches.kv.v],
    }


def whole_fingerprint(pieces: list[dict], model: Qwen35Model, logits) -> str:
    """ModelRunner.fingerprint of the whole model, from the ranks' pieces: conv channels
    [q | k | v] and heads put back in order, a replicated head taken once."""
    cfg = model.config
    shards = [_shard_of(model, r) for r in range(len(pieces))]
    h = hashlib.sha256()

    def channels(name: str, layer: int) -> torch.Tensor:  # conv channels [q | k | v] in order
        q, k, v = [], [], []
        for shard, p in zip(shards, pieces):
            x, kd = p[name][layer], cfg.linear_key_head_dim * shard.k_heads.count
            if shard.owns(shard.k_heads):
                q.append(x[..., :kd])
                k.append(x[..., kd : 2 * kd])
            v.append(x[..., 2 * kd :])
        return torch.cat(q + k + v, dim=-1)

    for layer in range(len(pieces[0]["conv"])):
        h.update(tensor_bytes(channels("conv", layer)))
        h.update(tensor_bytes(torch.cat([p["recurrent"][layer] for p in pieces])))
        h.update(tensor_bytes(channels("tail", layer)))
        h.update(tensor_bytes(torch.cat([p["tail_gates"][layer] for p in pieces], dim=-1)))
    for layer in range(len(pieces[0]["k"])):
        owners = [p for s, p in zip(shards, pieces) if s.owns(s.kv_heads)]
        h.update(tensor_bytes(torch.cat([p["k"][layer] for p in owners], dim=1)))
        h.update(tensor_bytes(torch.cat([p["v"][layer] for p in owners], dim=1)))
    if logits is not None:
        h.update(tensor_bytes(logits))
    return h.hexdigest()


def _shard_of(model: Qwen35Model, rank: int):
    from ..models.split import plan_shard

    return plan_shard(model.config, rank, model.shard.world, model.dtype)


def follow(model: Qwen35Model) -> None:
    """A following rank: repeats the leader's passes until it says stop (or a rank is lost).
    Each engine the leader builds says hello first: the pools are then built anew."""
    group: Group = model.group
    held: list[ModelCaches] = []  # the current pools, for the memory reports
    runner, snaps, rows, reports = None, {}, {}, None
    while True:
        plan: Plan = _broadcast(None, group.control)
        if plan.kind == "hello":
            leader, pages, page_size, slots, form, threads, graphs, context = plan.body
            if leader != identity(model):
                raise SplitRefused(
                    f"rank {group.rank} loaded another model than rank 0 "
                    f"({identity(model)} against {leader})"
                )
            model.set_gdn_form(form)  # the leader's exact form of the gated delta rule
            caches = build_caches(model, pages, page_size, slots, chunk_tail(grid_chunked(form)))
            runner, snaps, rows = ModelRunner(model, caches, threads, graphs, context), {}, {}
            held[:] = [caches]
            if reports is None:
                reports = threading.Thread(
                    target=_report_memory, args=(model, held, group), daemon=True
                )
                reports.start()
            continue
        apply_ops(plan.ops, runner.caches, snaps)
        if plan.kind == "stop":
            if reports is not None:
                reports.join(timeout=30)  # rank 0's last report round tells it to end
            return
        if plan.kind == "fingerprint":
            _gather(lane_pieces(runner.caches, *plan.body), group.control, group.world)
            continue
        ours, rows = _views(plan.lanes, runner.caches, rows)
        runner.execute(ours)
        group.take_time()


def _views(lanes, caches: ModelCaches, known: dict) -> tuple[PassPlan, dict]:
    """The pass's lanes as a PassPlan, and their KV rows by lane (those of the last pass's lanes
    are reused: rank 0 sends a lane's page table only when it is new)."""
    plan, rows = [], {}
    for lane in lanes:
        kv_rows = known.get(lane.key) if lane.pages is None else None
        if kv_rows is None:
            kv_rows = caches.kv.rows(list(lane.pages), lane.capacity)
        rows[lane.key] = kv_rows
        logits = range(*lane.wanted)
        plan.append(LaneRows(lane.key, lane.slot, lane.start, lane.tokens, kv_rows, (), logits))
    return PassPlan(tuple(plan)), rows


def _report_memory(model: Qwen35Model, held: list[ModelCaches], group: Group) -> None:
    """A following rank's /memory reports, one per request of rank 0, until rank 0 stops."""
    try:
        while (
            _gather(rank_memory(model, held[0], group.rank), group.reports, group.world)[0] != STOP
        ):
            pass
    except RankLost:
        return


def build_caches(
    model: Qwen35Model, pages: int, page_size: int, slots: int, tails: int = 0
) -> ModelCaches:
    """The pools of a following rank: the leader's page and slot counts and tail rows (the chunk
    form's), its own heads' widths."""
    w = model.cache_widths
    plan = PoolPlan(
        model.config, w.kv_heads, w.conv_dim, w.v_heads, model.dtype, pages, page_size, slots,
        tails,
    )  # fmt: skip
    return plan.allocate(model.device)
