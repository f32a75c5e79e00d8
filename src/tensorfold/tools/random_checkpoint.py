"""A random checkpoint that exists only in memory: the tensors of make_random's files, drawn when
the loader reads them (for a shape whose files would not fit the disk, e.g. the 122B-A10B at
4 bits, ~69 GB). The loader's own path runs unchanged (headers checked first, then each tensor
read, split, packed and placed as from a file); only `read` draws instead of mapping a file.
For benchmarks and tests, never a served model."""

from __future__ import annotations

from pathlib import Path

import torch

from ..models.checkpoint import DTYPES, Checkpoint, TensorInfo
from ..models.loader import load_model
from .make_random import RandomPlan

NAMES = {dtype: name for name, dtype in DTYPES.items()}


class RandomCheckpoint(Checkpoint):
    """Checkpoint's interface over a RandomPlan: headers from shapes alone (nothing drawn), each
    entry drawn on its first read (the last entry kept, as a packed weight is read as three)."""

    def __init__(self, folder: str | Path, plan: RandomPlan) -> None:
        self.folder, self.plan = Path(folder), plan
        self.infos: dict[str, TensorInfo] = {}
        self._entry: dict[str, int] = {}
        where = self.folder / "(in memory)"
        for i in range(len(plan.entries)):
            for name, t in plan.draw(i, "meta").items():
                nbytes = t.numel() * t.element_size()
                self.infos[name] = TensorInfo(
                    name, NAMES[t.dtype], tuple(t.shape), where, 0, nbytes
                )
                self._entry[name] = i
        self._maps = {}
        self._last: tuple[int, dict[str, torch.Tensor]] = (-1, {})
        self.reads = 0

    def read(self, name: str) -> torch.Tensor:
        self.info(name)  # a missing name is refused as from a file
        i = self._entry[name]
        if self._last[0] != i:
            self._last = (-1, {})  # the previous entry's tensors freed before the next is drawn
            self._last = (i, self.plan.draw(i))
        self.reads += 1
        return self._last[1][name]


def load_random(
    folder: str | Path, plan: RandomPlan, dtype: torch.dtype, device: str = "cuda", **kw
):
    """The model of `plan` loaded with no weight file: config.json written to `folder` (a few
    kB), the tensors drawn in memory as the loader reads them."""
    path = plan.write_config(folder)
    return load_model(
        path, dtype=dtype, device=device, checkpoint=RandomCheckpoint(path, plan), **kw
    )
