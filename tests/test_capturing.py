"""A CUDA graph's capture holds Python's cycle collector off: a collection during the capture may
free an old graph, whose teardown a capturing stream refuses (the capture is then lost). Garbage
from before the capture is collected first, and the collector's state comes back afterwards."""

import contextlib
import gc
import weakref

import pytest
import torch

from tensorfold.util import capturing


class _Cycle:
    def __init__(self):
        self.me = self


def _seen(monkeypatch) -> list:
    """torch.cuda.graph stood in for: records whether the collector was on inside it."""
    seen = []

    @contextlib.contextmanager
    def graph(g, pool=None):
        seen.append(gc.isenabled())
        yield

    monkeypatch.setattr(torch.cuda, "graph", graph)
    return seen


def test_collector_off_inside_and_garbage_gone_before(monkeypatch):
    seen = _seen(monkeypatch)
    old = _Cycle()
    gone = weakref.ref(old)
    del old  # a cycle: only the collector frees it
    assert gc.isenabled()
    with capturing(object()):
        assert gone() is None
        inside = gc.isenabled()
    assert seen == [False] and not inside
    assert gc.isenabled()


def test_collector_state_restored_after_an_error(monkeypatch):
    _seen(monkeypatch)
    with pytest.raises(RuntimeError, match="capture failed"):
        with capturing(object()):
            raise RuntimeError("capture failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with capturing(object()):
            pass
        assert not gc.isenabled()  # was off before: stays off
    finally:
        gc.enable()
