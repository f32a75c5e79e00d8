"""Requests and cancels handed from any thread to the engine's: a bounded queue, taken whole at
the start of each step."""

from __future__ import annotations

import threading
from collections import deque

from ..errors import QueueFull
from .request import Request


class Inbox:
    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self._requests: deque[Request] = deque()
        self._cancels: deque[str] = deque()
        self._lock = threading.Lock()
        self.wakeup = threading.Event()  # set whenever something arrives

    def put(self, req: Request, waiting: int) -> None:
        """Queues `req` behind the `waiting` requests the engine already holds (QueueFull when
        the two together reach max_queue)."""
        with self._lock:
            if len(self._requests) + waiting >= self.max_queue:
                raise QueueFull(f"the queue is full ({self.max_queue} waiting)")
            self._requests.append(req)
        self.wakeup.set()

    def cancel(self, request_id: str) -> None:
        self._cancels.append(request_id)
        self.wakeup.set()

    def take(self) -> list[Request]:
        """The requests arrived since the last take, in order."""
        with self._lock:
            out = list(self._requests)
            self._requests.clear()
        return out

    def take_cancels(self) -> list[str]:
        out = []
        while self._cancels:
            out.append(self._cancels.popleft())
        return out

    def queued(self, waiting: int) -> int:
        """Requests not yet given a lane: those here and the engine's `waiting`."""
        with self._lock:
            return len(self._requests) + waiting

    def __bool__(self) -> bool:
        return bool(self._requests or self._cancels)
