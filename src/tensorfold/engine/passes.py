"""A pass's plan from the schedule: every lane's rows, and which of them return logits.

A plan reads each lane's computed count, its committed ids and its drafted proposal, nothing of
the pass before but through them: the one dependency a host planning pass N+1 while pass N runs
would wait for is the token pass N is choosing (a decoding lane's next row feeds it), and that
token stays on the device (engine/overlap.py)."""

from __future__ import annotations

from ..runner.plan import Fed, LaneRows, PassPlan
from .request import Request
from .scheduler import Work


def logit_rows(req: Request, n: int) -> range:
    """Offsets of the rows whose logits a pass of `n` rows from the lane's computed position
    must return: every row when watched for all logits, else the last row when it yields the
    next token or ends at a watched cut (a cache cut needs none); a verify pass wants the last
    committed row and every drafted row. The runner and the CUDA graphs ask only this."""
    if req.watch is not None and req.watch.keep_logits:
        return range(n)
    if req.params.prompt_logprobs is not None and req.in_prompt:
        return range(n)  # every prompt row scores the token after it
    end = req.lane.computed + n
    if req.drafting and end > req.num_tokens:
        return range(req.num_tokens - 1 - req.lane.computed, n)
    watched = req.watch is not None and end in req.watch.cuts
    return range(n - 1, n) if end == req.num_tokens or watched else range(0)


def plan_pass(
    work: list[Work], forks: tuple[LaneRows, ...] = (), fed: Fed | None = None
) -> PassPlan:
    """The scheduled lanes in order, then a drafting pass's forks (which return no logits);
    `fed`: its rows whose tokens the device chose and the host has not read."""
    lanes = tuple(w.request.rows(w.rows, logit_rows(w.request, w.rows)) for w in work)
    return PassPlan(lanes + forks, fed)
