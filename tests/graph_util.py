"""CUDA graph recording stood in for on the CPU: a recorded pass runs once, eagerly, and a
replay does nothing (the runner's graph bookkeeping is then checked without a card)."""

import torch


class FakeGraph:
    def replay(self):
        pass


def stand_in_recording(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g, pool=None: torch.no_grad())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
