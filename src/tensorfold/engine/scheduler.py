"""Lanes and passes. There is no prefill phase and no decode phase: every pass takes one row
from each lane that is generating (with drafting: its uncomputed committed rows, then its drafted
tokens) and up to `chunk` prompt rows from each lane still reading its prompt, under a token
budget; while any lane decodes, a pass takes at most `mixed_chunk` prompt rows in all, so a
running stream's next token waits for a short pass, not a long prompt's. Lanes reserve their KV
pages (those the prompt and the reply can reach) and state slot at admission, so a running lane
never waits for memory and is never preempted; a request waits until they are free (lanes may
share a pool smaller than their whole contexts: cache/sizing.py)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..cache import KVPool, StatePool
from ..cache.prefix_cache import PrefixCache
from .request import Request, Status


@dataclass(frozen=True)
class SchedulerConfig:
    parallel: int = 4
    context: int = 4096
    chunk: int = 128
    token_budget: int | None = None  # rows per pass; default chunk + parallel
    max_queue: int = 64
    cache_every: int = 1024  # prompt-cache cut every this many prompt rows (page multiple)
    mixed_chunk: int | None = None  # prompt rows per pass beside decoding lanes (None: no cap)

    def __post_init__(self) -> None:
        for name in ("parallel", "context", "chunk", "max_queue", "cache_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        for name in ("token_budget", "mixed_chunk"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (or unset), not {value}")

    @property
    def budget(self) -> int:
        return self.token_budget or self.chunk + self.parallel


@dataclass(frozen=True)
class Work:
    request: Request
    rows: int


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVPool,
        states: StatePool,
        cache: PrefixCache | None = None,
    ) -> None:
        self.config, self.kv, self.states, self.cache = config, kv, states, cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # rows an aligned verify pass may feed past a lane's last token: its KV rows reach that
        # far (within the context), so a lane near its end keeps its graph's shape
        self.lookahead = 0
        # the prompt rows a pass takes beside decoding lanes of these rows each (None:
        # mixed_chunk); with mixed graphs, the graph's room (runner: mixed_room)
        self.mixed_room: Callable[[list[int]], int] | None = None

    def admit(self) -> None:
        while self.waiting and len(self.running) < self.config.parallel and self.states.free_slots:
            req = self.waiting[0]
            # prompt logprobs need every prompt row computed: no resume
            fresh = self.cache is None or req.params.prompt_logprobs is not None
            entry = None if fresh else self.cache.lookup(req.prompt_ids)
            held = self.kv.share(entry.pages) if entry else []  # pinned before any eviction
            partial = 1 if entry and entry.cut % self.kv.page_size else 0
            need = self.kv.pages_for(self.positions(req)) - len(held) + partial
            if self.cache is not None and need > self.kv.free_pages:
                self.cache.make_room(pages=need)
            if need > self.kv.free_pages:
                self.kv.release(held)
                return
            if self.cache is not None:
                self.cache.record(entry)
            self.waiting.popleft()
            self._start(req, entry, held, need)

    def positions(self, req: Request) -> int:
        """Positions the lane's KV rows cover: its capacity and the lookahead, within the context."""
        return min(req.capacity + self.lookahead, max(self.config.context, req.capacity))

    def _start(self, req: Request, entry, held: list[int], need: int) -> None:
        whole = entry.cut // self.kv.page_size if entry else 0
        fresh = self.kv.allocate(need)
        if entry and len(held) > whole:  # the partial last page: copy, never write a shared one
            self.kv.copy_page(held[whole], fresh[0])
            self.kv.release(held[whole:])
        lane = req.lane
        lane.pages = held[:whole] + fresh
        lane.slot = self.states.allocate()
        if entry:
            self.states.restore(lane.slot, entry.snapshot)
            lane.computed = lane.cached = entry.cut
        lane.kv_rows = self.kv.rows(lane.pages, self.positions(req))
        lane.cache_cuts = (
            self._cache_cuts(req) if self.cache is not None and self.cache.enabled else frozenset()
        )
        lane.cuts = tuple(sorted(set(lane.cuts) | lane.cache_cuts))
        req.status = Status.RUNNING
        req.times.admitted = time.monotonic()
        self.running.append(req)

    def _cache_cuts(self, req: Request) -> frozenset[int]:
        """Where a lane snapshots into the prompt cache: every `cache_every` rows, the last page
        boundary before the prompt's end (so the same prompt resumes a few tokens short), the end."""
        n, start, page = len(req.prompt_ids), req.lane.computed, self.kv.page_size
        cuts = set(range(self.config.cache_every, n, self.config.cache_every))
        cuts |= {(n - 1) // page * page, n}
        return frozenset(c for c in cuts if start < c <= n)

    def schedule(self) -> list[Work]:
        budget = self.config.budget
        work: list[Work] = []
        rows: dict[int, int] = {}
        for req in self.running:  # decode rows first: each lane's uncomputed committed rows,
            if not req.in_prompt and budget > 0:
                rows[id(req)] = n = min(req.num_tokens - req.lane.computed, budget)
                budget -= n
        for req in self.running:  # then its drafted rows, while the budget lasts
            if id(req) in rows:
                drafted = min(req.num_drafted, budget)
                work.append(Work(req, rows[id(req)] + drafted))
                budget -= drafted
        if work and self.config.mixed_chunk is not None:  # prompt rows beside decoding lanes
            room = self.mixed_room
            cap = self.config.mixed_chunk if room is None else room([w.rows for w in work])
            budget = min(budget, cap)
        for req in self.running:  # then prompt rows, oldest lane first
            if req.in_prompt and budget > 0:
                n = min(self.config.chunk, len(req.prompt_ids) - req.lane.computed, budget)
                n = min(n, self._to_next_cut(req))
                work.append(Work(req, n))
                budget -= n
        return work

    @staticmethod
    def _to_next_cut(req: Request) -> int:
        done = req.lane.computed
        ahead = [c - done for c in req.lane.cuts if c > done]
        return min(ahead) if ahead else len(req.prompt_ids)

    def finish(self, req: Request) -> None:
        """Frees the lane's pages and slot; a waiting request is simply dropped."""
        if req.status == Status.RUNNING:
            self.running.remove(req)
            self.kv.release(req.lane.pages)
            self.states.release(req.lane.slot)
            req.lane.pages, req.lane.slot = [], -1
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = Status.FINISHED

    @property
    def busy_lanes(self) -> int:
        return len(self.running)
