"""Small helpers shared by the commands, the server and the receipts."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import resource
from pathlib import Path

import numpy as np
import torch

DTYPES = {
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
    "fp64": torch.float64,
}


def longs(values, device=None) -> torch.Tensor:
    """Python ints (a sequence, or equal-length sequences) as an int64 tensor, made through
    numpy: a pass's fed ids and positions, its index lists. torch.tensor from a list reads it
    element by element: 4.9 against 1.8 µs for 2 × 1 values, 43 against 8 for 2 × 128. On
    `device` by a non-blocking copy (a blocking one waits for the card's queue: an overlapped
    engine plans the next pass while the card runs this one)."""
    host = torch.from_numpy(np.array(values, dtype=np.int64))
    return host if device is None else host.to(device, non_blocking=True)


def join(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Tensors as one along their first axis: a lone one as it is (torch.cat would copy it, a
    launch on a GPU), more joined."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def token_sha(ids: list[int]) -> str:
    """sha256 hex of the ids written as comma-separated decimals."""
    return hashlib.sha256(",".join(str(i) for i in ids).encode()).hexdigest()


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device is available")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose one of auto, bfloat16, float32, float64")
    return DTYPES[dtype]


def default_checkpoint(path: str | None) -> Path:
    """The given folder, or the bundled demo model's."""
    if path is not None:
        return Path(path)
    from .demo import demo_checkpoint

    return demo_checkpoint()


def rss_bytes() -> int:
    """This process's resident memory."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux: the peak is the best we have
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, pool=None):
    """torch.cuda.graph(graph, pool) with Python's cycle collector held off: a collection inside
    the capture may free an old CUDA graph, whose teardown is not allowed while a stream
    captures and invalidates this capture. No collection is forced here (the tile book captures
    once per timing, and a full collection costs ~0.1 s): old garbage goes at a later one,
    outside every capture."""
    was = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool):
            yield
    finally:
        if was:
            gc.enable()
