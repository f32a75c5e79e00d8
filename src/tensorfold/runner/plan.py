"""What a runner is asked to compute: a frozen plan of lanes' rows. The engine builds it from its
schedule; the runner reads nothing else of a request."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..util import longs


@dataclass(frozen=True)
class LaneRows:
    """One lane's consecutive rows of a pass. With no rows it names the lane as it stands after
    `start` positions (what a fingerprint reads)."""

    key: str  # names the lane across passes: a CUDA graph's members, a split's page tables
    slot: int  # its Gated DeltaNet state slot
    start: int  # position of its first row
    token_ids: tuple[int, ...]  # the token fed at each row
    kv_rows: torch.Tensor  # [capacity] KV cache row of every position the lane may fill
    pages: tuple[int, ...]  # its KV pages (a split sends them to the other ranks)
    logits: range = range(0)  # offsets of the rows whose logits the pass returns
    writes: int = -1  # the slot the pass leaves its state in when not `slot` (a verify's spare)

    @property
    def rows(self) -> int:
        return len(self.token_ids)

    @property
    def capacity(self) -> int:
        return int(self.kv_rows.shape[0])

    @property
    def out(self) -> int:
        """The slot the pass leaves the lane's state in."""
        return self.slot if self.writes < 0 else self.writes


def same_lanes(plan, members: tuple) -> bool:
    """Whether a graph's loaded (key, KV rows) members are `plan`'s lanes, in order: the KV rows
    are compared as objects (a lane's are made once at admission and never changed), which the
    members hold, so no new lane's can take a gone one's identity."""
    return len(members) == len(plan) and all(
        key == lane.key and rows is lane.kv_rows for (key, rows), lane in zip(members, plan)
    )


@dataclass(frozen=True)
class Fed:
    """Tokens a pass feeds that were chosen on the device and not read back yet (an overlapped
    engine plans pass N+1 while pass N's tokens are chosen): the pass's row `rows[j]` feeds
    `tokens[picks[j]]`, and its LaneRows hold PENDING there."""

    rows: tuple[int, ...]
    tokens: torch.Tensor  # [chosen] token ids, on the pass's device
    picks: tuple[int, ...]

    def apply(self, ids: torch.Tensor) -> None:
        """Writes the chosen tokens into a pass's fed ids [rows] (stream-ordered, no sync)."""
        r0, p0, n = self.rows[0], self.picks[0], len(self.rows)
        if self.rows == tuple(range(r0, r0 + n)) and self.picks == tuple(range(p0, p0 + n)):
            ids[r0 : r0 + n].copy_(self.tokens[p0 : p0 + n])  # the usual step: one device copy
            return
        rows, picks = longs((self.rows, self.picks), ids.device)  # one copy for both
        ids[rows] = self.tokens[picks].to(ids.dtype)

    def shifted(self, after: int, by: int) -> Fed:
        """The same feeds with rows from `after` on moved `by` rows (padding inserted there)."""
        return Fed(tuple(r + by if r >= after else r for r in self.rows), self.tokens, self.picks)


PENDING = -1  # a fed token the device chose and the host has not read (Fed writes it)


@dataclass(frozen=True)
class PassPlan:
    """The lanes of one pass, in row order; logits come back keyed by a lane's index here."""

    lanes: tuple[LaneRows, ...]
    fed: Fed | None = None  # tokens the device chose for it, not yet read back

    def __len__(self) -> int:
        return len(self.lanes)

    def __iter__(self):
        return iter(self.lanes)

    @property
    def rows(self) -> int:
        return sum(lane.rows for lane in self.lanes)


def padded(plan: PassPlan, lanes: int, pad: LaneRows, at: int | None = None) -> PassPlan:
    """`plan` with copies of `pad` after its first `at` lanes (all of them by default) up to
    `lanes` lanes: a CUDA graph recorded for a bucket of lane counts replays a smaller pass (a
    mixed graph's prompt lane stays last). A padding lane writes only its own scratch state slot
    and KV page, and every lane's rows are computed apart from the others' (the
    batch-invariance of docs/exactness.md), so the real lanes' bits do not change."""
    if lanes < len(plan):
        raise ValueError(f"cannot pad a pass of {len(plan)} lanes to {lanes}")
    at = len(plan) if at is None else at
    extra = lanes - len(plan)
    fed = plan.fed
    if fed is not None:  # rows after the padding move past it
        fed = fed.shifted(sum(lane.rows for lane in plan.lanes[:at]), extra * pad.rows)
    return PassPlan(plan.lanes[:at] + (pad,) * extra + plan.lanes[at:], fed)
