"""Zeroed pool tensors whose host memory is taken as it is used: on the CPU the pools are
reserved from calloc'd pages, which the OS maps on first touch, so a 64k-token context's KV pool
costs the pages its lanes have written, not its full size (the demo took 2.8 GB at start)."""

from __future__ import annotations

import math

import numpy as np
import torch


def zeros(*shape: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """torch.zeros(shape), allocated lazily on the CPU (the same values: every byte 0)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if torch.device(device).type != "cpu" or nbytes == 0:
        return torch.zeros(*shape, dtype=dtype, device=device)
    raw = torch.from_numpy(np.zeros(nbytes, dtype=np.uint8))  # calloc: untouched pages are free
    return raw.view(dtype).view(*shape)
