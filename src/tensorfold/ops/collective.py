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
    stopped: bool = False  # rank 0 has told the others to stop

    def gather_cols(self, x: torch.Tensor, widths: tuple[int, ...] | None = None) -> torch.Tensor:
        """[..., n] on every rank -> [..., sum of widths]: the ranks' columns side by side, in rank
        order. `widths` are the ranks' n (None: all equal); a narrower piece travels padded to
        the widest and is cut back, so only copies touch the values."""
        import torch.distributed as dist

        start = time.perf_counter()
        n = x.shape[-1]
        most = n if widths is None else max(widths)
        x = torch.nn.functional.pad(x, (0, most - n)) if most > n else x.contiguous()
        out = x.new_empty((self.world * x.shape[0], *x.shape[1:]))  # the ranks' pieces stacked
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        try:
            gather(out, x, group=self.process_group)
        except Exception as exc:  # gloo raises RuntimeError, NCCL DistBackendError
            raise RankLost(f"an all-gather across {self.world} ranks failed: {exc}") from exc
        self.seconds += time.perf_counter() - start
        self.calls += 1
        pieces = out.view(self.world, *x.shape)  # [world, ..., most]
        if widths is not None and min(widths) < most:
            return torch.cat([pieces[r, ..., :w] for r, w in enumerate(widths)], dim=-1)
        if self.world == 1:
            return out
        pieces = pieces.movedim(0, -2)  # [..., world, n]
        return pieces.reshape(*x.shape[:-1], self.world * most)

    def take_time(self) -> tuple[float, int]:
        """(seconds, calls) in collectives since the last call."""
        out = (self.seconds, self.calls)
        self.seconds, self.calls = 0.0, 0
        return out


def split_argmax(rows: torch.Tensor, widths: tuple[int, ...]) -> list[int]:
    """The greedy token of each row [R, V] as the split picks it: each rank's argmax over its
    vocabulary slice (`widths`: the slices' sizes in rank order; the first maximum), then the
    largest of those, the lowest rank (so the lowest id) on ties. Equal to the whole row's first
    maximum; a NaN or inf fails closed. One transfer to the host for all rows."""
    starts = torch.tensor([0, *widths]).cumsum(0)[:-1].to(rows.device)
    pieces = rows.split(list(widths), dim=-1)
    local = torch.stack([p.argmax(-1) for p in pieces], -1)  # [R, parts] each rank's first max
    values = torch.stack(
        [p.gather(-1, i[:, None]).squeeze(-1) for p, i in zip(pieces, local.T)], -1
    )
    rank = values.argmax(-1)  # the first rank holding the largest value
    picks = starts[rank] + local.gather(-1, rank[:, None]).squeeze(-1)
    finite = torch.isfinite(rows).all(-1)
    out, ok = torch.stack([picks, finite.long()]).tolist()
    if not all(ok):
        raise NonFiniteLogits(f"logit row {ok.index(0)} of the pass holds NaN or inf")
    return out
