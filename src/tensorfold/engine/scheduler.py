"""Lanes and passes. There is no prefill phase and no decode phase: every pass takes one row
from each lane that is generating and up to `chunk` prompt rows from each lane still reading
its prompt, under a token budget. Lanes reserve their KV pages and state slot at admission,
so a running lane never waits for memory and is never preempted."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..cache import KVPool, StatePool
from ..errors import QueueFull
from .request import Request, Status


@dataclass(frozen=True)
class SchedulerConfig:
    parallel: int = 4
    context: int = 4096
    chunk: int = 128
    token_budget: int | None = None      # rows per pass; default chunk + parallel
    max_queue: int = 64

    @property
    def budget(self) -> int:
        return self.token_budget or self.chunk + self.parallel


@dataclass(frozen=True)
class Work:
    request: Request
    rows: int


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVPool, states: StatePool) -> None:
        self.config, self.kv, self.states = config, kv, states
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def enqueue(self, req: Request) -> None:
        if len(self.waiting) >= self.config.max_queue:
            raise QueueFull(f"the queue is full ({self.config.max_queue} waiting)")
        self.waiting.append(req)

    def admit(self) -> None:
        while self.waiting and len(self.running) < self.config.parallel:
            req = self.waiting[0]
            pages = self.kv.pages_for(req.capacity)
            if pages > self.kv.free_pages or self.states.free_slots == 0:
                return
            self.waiting.popleft()
            req.pages = self.kv.allocate(pages)
            req.slot = self.states.allocate()
            req.kv_rows = self.kv.rows(req.pages, req.capacity)
            req.status = Status.RUNNING
            self.running.append(req)

    def schedule(self) -> list[Work]:
        budget = self.config.budget
        work: list[Work] = []
        for req in self.running:                 # decode rows first: one each
            if not req.in_prompt and budget > 0:
                work.append(Work(req, 1))
                budget -= 1
        for req in self.running:                 # then prompt rows, oldest lane first
            if req.in_prompt and budget > 0:
                n = min(self.config.chunk, len(req.prompt_ids) - req.num_computed, budget)
                n = min(n, self._to_next_cut(req))
                work.append(Work(req, n))
                budget -= n
        return work

    @staticmethod
    def _to_next_cut(req: Request) -> int:
        ahead = [c - req.num_computed for c in req.cuts if c > req.num_computed]
        return min(ahead) if ahead else len(req.prompt_ids)

    def finish(self, req: Request) -> None:
        """Frees the lane's pages and slot; a waiting request is simply dropped."""
        if req.status == Status.RUNNING:
            self.running.remove(req)
            self.kv.release(req.pages)
            self.states.release(req.slot)
            req.pages, req.slot = [], -1
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = Status.FINISHED

    @property
    def busy_lanes(self) -> int:
        return len(self.running)
