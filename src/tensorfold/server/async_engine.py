"""The bridge between asyncio and the engine: one thread runs every pass, handlers await events.

Handlers call submit() on the event loop; the engine thread loops step() while there is work and
waits on engine.wakeup otherwise, handing each TokenEvent to its request's asyncio queue.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import torch

from ..engine.engine import Engine
from ..engine.request import Request, SamplingParams, TokenEvent
from ..engine.stats import EngineFacts, EngineStats, MemoryReport
from ..errors import RankLost

log = logging.getLogger("tensorfold.server")


@dataclass(frozen=True)
class Choice:
    """One choice of one prompt: an engine request of its own."""

    index: int  # the choice's index in the response
    prompt_ids: list[int]
    params: SamplingParams
    choice: int = 0  # which choice of its prompt: keys the random numbers with the seed
    draft: bool = True  # false: served without drafting
    prediction: tuple[int, ...] | None = None  # a predicted reply's token ids (drafted from)


def is_device_fault(exc: BaseException) -> bool:
    """A CUDA error such as an illegal address poisons the process's device context: every later
    pass would fail too. So does a lost rank of a tensor split."""
    fault_type = getattr(torch, "AcceleratorError", None)
    return (
        isinstance(exc, RankLost)
        or (fault_type is not None and isinstance(exc, fault_type))
        or "CUDA error" in str(exc)
        or "illegal memory access" in str(exc)
    )


class EngineFailed(RuntimeError):
    """A pass raised: the requests in flight fail with it; the engine thread goes on."""


class EngineLoading(RuntimeError):
    """The warm-up is still choosing and compiling launch shapes: nothing is admitted yet."""


@dataclass(frozen=True)
class _Route:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    index: int


class Generation:
    """The choices of one HTTP request; iterate events() for (choice index, TokenEvent) pairs."""

    def __init__(self, bridge: AsyncEngine, requests: list[Request], queue: asyncio.Queue) -> None:
        self.bridge, self.requests, self.queue = bridge, requests, queue
        self.unfinished = {r.request_id for r in requests}

    async def events(self) -> AsyncIterator[tuple[int, TokenEvent]]:
        while self.unfinished:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                self.unfinished.clear()
                raise item
            index, event = item
            if event.finished:
                self.unfinished.discard(event.request_id)
            yield index, event

    def cancel(self) -> None:
        """Ends every unfinished choice at the next pass; safe to call twice or after the end."""
        for request_id in self.unfinished:
            self.bridge.engine.cancel(request_id)


class AsyncEngine:
    def __init__(self, engine: Engine, warmup: Callable[[], object] | None = None) -> None:
        """`warmup` runs on the engine thread before it serves (its report is logged)."""
        self.engine = engine
        self._warmup = warmup
        self.loading = warmup is not None  # /health says "loading" until the warm-up ends
        self.facts: EngineFacts = engine.facts
        self.stats = EngineStats()  # after the engine thread's last step (read by /metrics)
        self._routes: dict[str, _Route] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fault: str | None = None  # set when a device fault ended the engine thread

    # -- event loop side ----------------------------------------------------------------------
    def submit(self, request_id: str, choices: list[Choice]) -> Generation:
        """Admits every choice or none: a refusal (InvalidRequest, QueueFull...) withdraws all."""
        self.check_alive()
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        requests: list[Request] = []
        try:
            for c in choices:
                rid = f"{request_id}-{c.index}"
                with self._lock:  # routed before admission, so no event can miss its queue
                    self._routes[rid] = _Route(loop, queue, c.index)
                requests.append(
                    self.engine.add_request(
                        c.prompt_ids,
                        c.params,
                        rid,
                        choice=c.choice,
                        draft=c.draft,
                        prediction=list(c.prediction) if c.prediction else None,
                    )
                )
        except BaseException:
            self._withdraw([f"{request_id}-{c.index}" for c in choices], requests)
            raise
        return Generation(self, requests, queue)

    def memory(self) -> MemoryReport:
        return self.engine.memory()

    def grammar_error(self, grammar) -> str:
        """Why a reply's grammar does not compile against the served vocabulary ("" if it does);
        validating reads only the grammar book's tokenizer, so a worker thread may ask."""
        return self.engine.grammars.check(grammar)

    def _withdraw(self, ids: list[str], admitted: list[Request]) -> None:
        with self._lock:
            for rid in ids:
                self._routes.pop(rid, None)
        for req in admitted:
            self.engine.cancel(req.request_id)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def check_alive(self) -> None:
        """Refuses new work while warming up, and once the engine thread has ended (a device
        fault, or a stop)."""
        if self.loading:
            raise EngineLoading("the server is warming up (compiling its kernels); retry shortly")
        if not self.alive:
            why = f" after a device fault ({self.fault})" if self.fault else ""
            raise EngineFailed(f"the engine has stopped{why}; restart the server")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tensorfold-engine", daemon=True)
        self._thread.start()

    def cancel_all(self) -> int:
        """Cancels every request in flight; each ends with finish_reason "cancelled"."""
        with self._lock:
            pending = list(self._routes)
        for rid in pending:
            self.engine.cancel(rid)
        return len(pending)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancels whatever is still running, lets one pass release it, then ends the thread."""
        cancelled = self.cancel_all()
        self._stop.set()
        self.engine.wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout)
        log.info(
            "engine stopped after %d passes (%d requests cancelled at stop)",
            self.stats.passes,
            cancelled,
        )

    def close(self) -> None:
        """After stop: lets the other ranks of a split go (never raises: the split may be lost)."""
        if self.alive:
            return  # the engine thread still runs a pass: it owns the ranks
        try:
            self.engine.close()
        except Exception as exc:  # a lost rank: nothing is left to release
            log.warning("closing the split: %s", exc)

    # -- engine thread ------------------------------------------------------------------------
    def _run_warmup(self) -> None:
        try:
            if self._warmup is not None:
                report = self._warmup()
                log.info("%s", getattr(report, "summary", lambda: report)())
        except Exception:  # noqa: BLE001 - shapes not chosen now are chosen on first use
            log.exception("warm-up failed; serving without it")
        finally:
            self.loading = False

    def _loop(self) -> None:
        self._run_warmup()
        while True:
            self.engine.wakeup.clear()
            if not self.engine.has_work():
                if self._stop.is_set():
                    return
                self.engine.wakeup.wait()
                continue
            try:
                events = self.engine.step()
            except Exception as exc:  # a failed pass fails its requests, never the server
                log.exception("engine pass failed")
                self._fail_all(exc)
                self.engine.abandon_all()  # nothing left to retry the failed pass with
                self.stats = self.engine.stats()
                if is_device_fault(exc):
                    self.fault = f"{type(exc).__name__}: {exc}"
                    log.error(
                        "the device faulted; the engine stops (restart the server): %s", self.fault
                    )
                    return
                continue
            self._dispatch(events)
            self.stats = self.engine.stats()

    def _dispatch(self, events: list[TokenEvent]) -> None:
        for event in events:
            with self._lock:
                route = (
                    self._routes.pop(event.request_id, None)
                    if event.finished
                    else self._routes.get(event.request_id)
                )
            if route is not None:
                self._post(route, (route.index, event))

    def _fail_all(self, exc: Exception) -> None:
        with self._lock:
            routes, self._routes = self._routes, {}
        for rid, route in routes.items():
            self.engine.cancel(rid)
            self._post(route, EngineFailed(f"the engine failed: {type(exc).__name__}: {exc}"))

    @staticmethod
    def _post(route: _Route, item) -> None:
        try:
            route.loop.call_soon_threadsafe(route.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass
