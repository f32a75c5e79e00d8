"""Seconds and calls of an engine's parts, kept by wrappers the profilers put around them."""

from __future__ import annotations

import time
from collections import defaultdict

import torch


class Clock:
    """Seconds and calls by name, kept by wrappers around the engine's parts."""

    def __init__(self, sync=lambda: None) -> None:
        self.sync = sync
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, owner, name: str, label, restore: list) -> None:
        """Times owner.name under `label`, a name or a function of the call's arguments; what
        it replaced goes on `restore` as (owner, name, original)."""
        if isinstance(label, str):
            label = lambda *a, _name=label, **k: _name  # noqa: E731
        fn = getattr(owner, name)
        restore.append((owner, name, fn))

        def timed(*args, **kwargs):
            self.sync()
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sync()
                key = label(*args, **kwargs)
                self.seconds[key] += time.perf_counter() - t
                self.calls[key] += 1

        setattr(owner, name, timed)


class ReplayEvents:
    """CUDA events around every graph replay: the device's time of the passes."""

    def __init__(self, restore: list) -> None:
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        replay = torch.cuda.CUDAGraph.replay

        def timed(graph):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            replay(graph)
            end.record()
            self.events.append((start, end))

        torch.cuda.CUDAGraph.replay = timed
        restore.append((torch.cuda.CUDAGraph, "replay", replay))

    def seconds(self) -> float:
        torch.cuda.synchronize()
        return sum(s.elapsed_time(e) for s, e in self.events) / 1000


def restored(restore: list) -> None:
    """Puts back what the wrappers replaced (`restore`: (owner, name, original)), last first."""
    for owner, name, fn in reversed(restore):
        setattr(owner, name, fn)
