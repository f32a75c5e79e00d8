"""The collectives of a tensor split, over torch.distributed (gloo on the CPU, NCCL on GPUs).

Only all-gathers: each rank's piece is a set of whole output columns, and the pieces are
concatenated in rank order, so no value is ever summed across ranks (docs/exactness.md,
'Tensor split'). A failed collective (a rank died, a socket closed) becomes `RankLost`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..errors import NonFiniteLogits, RankLost


@dataclass
class Group:
    """The ranks of one split. `seconds`/`calls` add up the time spent in collectives (read and
    reset by the runner once per pass: /metrics)."""

    rank: int
    world: int
    process_group: object = None  # a torch.distributed ProcessGroup; None: the default group
    control: object = None  # the gloo group of the pass plans (None: the default group)
    reports: object = None  # the gloo group of the ranks' /memory reports
    seconds: float = 0.0
    calls: int = 0

    def gather_cols(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n] on every rank -> [..., world*n]: the ranks' columns side by side, in rank order."""
        import torch.distributed as dist

        start = time.perf_counter()
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world)]
        try:
            dist.all_gather(parts, x, group=self.process_group)
        except Exception as exc:  # gloo raises RuntimeError, NCCL DistBackendError
            raise RankLost(f"an all-gather across {self.world} ranks failed: {exc}") from exc
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return parts[0] if self.world == 1 else torch.cat(parts, dim=-1)

    def take_time(self) -> tuple[float, int]:
        """(seconds, calls) in collectives since the last call."""
        out = (self.seconds, self.calls)
        self.seconds, self.calls = 0.0, 0
        return out


def split_argmax(rows: torch.Tensor, parts: int) -> list[int]:
    """The greedy token of each row [R, V] as the split picks it: each rank's argmax over its
    vocabulary slice (the first maximum), then the largest of those, the lowest id on ties.
    Equal to the whole row's first maximum; a NaN or inf fails closed."""
    if not bool(torch.isfinite(rows).all()):
        bad = int((~torch.isfinite(rows)).any(-1).nonzero()[0])
        raise NonFiniteLogits(f"logit row {bad} of the pass holds NaN or inf")
    width = rows.shape[-1] // parts
    picks = []
    for row in rows:
        best_value, best_id = None, -1
        for r in range(parts):
            piece = row[r * width : (r + 1) * width]
            i = int(torch.argmax(piece))
            value = float(piece[i])
            if best_value is None or value > best_value:  # ties keep the lower rank: lower id
                best_value, best_id = value, r * width + i
        picks.append(best_id)
    return picks
