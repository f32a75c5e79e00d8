"""A CUDA graph's capture holds Python's cycle collector off: a collection during the capture may
free an old graph, whose teardown a capturing stream refuses (the capture is then lost). The
collector's state comes back afterwards, an error inside included."""

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


def test_no_collection_inside_a_capture(monkeypatch):
    seen = _seen(monkeypatch)
    gc.collect()
    old = _Cycle()
    gone = weakref.ref(old)
    del old  # a cycle: only a collection frees it
    with capturing(object()):
        # far past the young generation's threshold: an enabled collector would run here
        churn = [[i] for i in range(50_000)]
        assert gone() is not None
    del churn
    assert seen == [False] and gc.isenabled()
    gc.collect()
    assert gone() is None


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
