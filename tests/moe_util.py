"""Watching and steering the MoE layers' routing in tests.

`recorded` logs every router call of a run (its logits and the route taken). `forced` replays a
recorded run's expert choices in another run (the float64 reading), each with that run's own
probabilities renormalised over them, and logs what that run would have chosen itself. The
calls of two runs of one request with one chunk size pair up one to one: same passes, same
layers, same (padded) rows.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from tensorfold.ops import dispatch
from tensorfold.ops import moe as ref_moe


@dataclass
class RouteLog:
    logits: list[torch.Tensor] = field(default_factory=list)  # router logits per call
    ids: list[torch.Tensor] = field(default_factory=list)  # the experts taken per call
    preferred: list[torch.Tensor] = field(default_factory=list)  # forced runs: its own choice


@contextmanager
def recorded(route=None):
    """Every call of dispatch.moe_route logged; `route` replaces ops.moe.route (a planted fault)."""
    log, real = RouteLog(), dispatch.moe_route
    choose = route or real

    def spy(logits, top_k, last=None):
        r = choose(logits, top_k)
        log.logits.append(logits.detach().clone())
        log.ids.append(r.ids.clone())
        return with_last(r, last)

    dispatch.moe_route = spy
    try:
        yield log
    finally:
        dispatch.moe_route = real


@contextmanager
def forced(taken: list[torch.Tensor]):
    """The k-th router call takes taken[k]'s experts, weighted by this run's probabilities."""
    log, real, calls = RouteLog(), dispatch.moe_route, iter(taken)

    def steer(logits, top_k, last=None):
        ids = next(calls).to(logits.device)
        own = ref_moe.route(logits, top_k)
        probs = torch.softmax(logits.to(ref_moe.accumulator(logits.dtype)), dim=-1).gather(1, ids)
        log.logits.append(logits.detach().clone())
        log.ids.append(ids)
        log.preferred.append(own.ids)
        return with_last(ref_moe.Route(ids, probs / probs.sum(-1, keepdim=True)), last)

    dispatch.moe_route = steer
    try:
        yield log
    finally:
        dispatch.moe_route = real


def with_last(r: ref_moe.Route, last: int | None) -> ref_moe.Route:
    """The route with a joint shared expert's id after each row's k, as moe_route(last=) gives."""
    if last is None:
        return r
    ids = torch.cat([r.ids, r.ids.new_full((r.ids.shape[0], 1), last)], 1)
    return ref_moe.Route(ids, r.weights)


@dataclass(frozen=True)
class Flip:
    """A row where the reading would have chosen other experts than the run it follows."""

    call: int
    row: int
    margin: float  # the reading's logit of its own choice minus ours, for the closest swap
    rounding: float  # our router's rounding in that call (see routing_flips)


def routing_flips(ours: RouteLog, reading: RouteLog) -> list[Flip]:
    """Rows where the forced reading preferred other experts, each with float64's margin between
    the swapped experts and our router's rounding in that call: the largest |ours - reading| over
    the call's router logits, the swapped experts' own left out (their error is the flip)."""
    flips = []
    for call, (mine, theirs, want) in enumerate(
        zip(ours.logits, reading.logits, reading.preferred)
    ):
        taken, exact = reading.ids[call], theirs.double()
        err = (mine.double() - exact).abs()
        swaps = []
        for row in torch.nonzero((taken != want).any(-1)).flatten().tolist():
            ours_only = sorted(set(taken[row].tolist()) - set(want[row].tolist()))
            theirs_only = sorted(set(want[row].tolist()) - set(taken[row].tolist()))
            err[row, ours_only + theirs_only] = 0.0
            swaps.append(
                (
                    row,
                    min(
                        float(exact[row, b] - exact[row, a]) for a in ours_only for b in theirs_only
                    ),
                )
            )
        flips += [Flip(call, row, margin, float(err.max())) for row, margin in swaps]
    return flips


def contract_selection(logits: torch.Tensor, top_k: int) -> list[list[int]]:
    """The routing contract, written out independently of ops.moe: per row, the top_k experts
    ordered by (fp32 probability descending, expert id ascending), returned ascending."""
    probs = torch.softmax(logits.to(ref_moe.accumulator(logits.dtype)), dim=-1).tolist()
    return [sorted(sorted(range(len(p)), key=lambda e: (-p[e], e))[:top_k]) for p in probs]
