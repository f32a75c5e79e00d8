"""The MTP head over every proposing lane at once: drafters/mtp.py's catch-up and chain, batched.

With CUDA graphs each lane's proposal replays a catch-up graph and a chain graph of its own, with
host work between them, lane after lane: on the H200 a 16-lane verify pass with the head
proposing cost 13-16 plain passes (docs/BENCHMARKS.md, 2026-12-03). Here one eager pass runs
every proposing lane's held rows through the head (a segment a lane, through the layers' own
kernels), and each of the K - 1 chain steps is one pass of one row a lane; the drafts are read
once, at the end. A row's bits do not depend on the lanes beside it in those kernels (concurrent
= solo), so each lane gets the drafts a pass of its own would give. Drafts are guesses: how the
head's passes are grouped never changes a token.
"""

from __future__ import annotations

import torch

from ..batch import Segment
from ..runner.model_runner import eager_batch
from ..util import longs


def propose_lanes(drafter, asks: list[tuple]) -> list[list[int]]:
    """asks: (MTPLane, the request's tokens, k) per lane; each lane's drafts, none for a lane
    whose head cannot start (its last catch-up left its first draft in a graph's buffers)."""
    caught = [lane.held(tokens) for lane, tokens, _ in asks]
    held = [i for i, rows in enumerate(caught) if rows is not None]
    if held:
        _catch_up(drafter, [asks[i][0] for i in held], [caught[i] for i in held])
    ready = [
        i
        for i, (lane, tokens, _) in enumerate(asks)
        if lane.logits is not None and lane.done == len(tokens) - 1
    ]
    out: list[list[int]] = [[] for _ in asks]
    if ready:
        chains = _chain(drafter, [asks[i] for i in ready])
        for i, drafts in zip(ready, chains):
            out[i] = drafts
    return out


def _catch_up(drafter, lanes, rows) -> None:
    """One pass of every lane's held rows; each lane keeps its last row's logits and output."""
    segments, ids, row = [], [], 0
    for lane, (tokens, _) in zip(lanes, rows):
        n = len(tokens)
        kv_rows = lane.req.lane.kv_rows
        segments.append(Segment(lane.req.lane.slot, lane.done, row, n, kv_rows[: lane.done + n]))
        ids += tokens
        row += n
    last = [s.row0 + s.length - 1 for s in segments]
    dev = drafter.target.device
    token_ids = longs(ids, dev)
    batch = eager_batch(drafter.target, tuple(segments), token_ids, last)
    hidden = torch.cat([p for _, pieces in rows for p in pieces]).to(drafter.head.fc.weight.dtype)
    kv = (drafter.kv.k[0], drafter.kv.v[0])
    with torch.inference_mode():
        logits, x = drafter.head.forward_pass(
            drafter.target, token_ids, hidden, batch, kv, last=batch.logit_rows
        )
    for i, (lane, (tokens, _)) in enumerate(zip(lanes, rows)):
        lane.logits, lane.out = logits[i], x[last[i] : last[i] + 1]
        lane.ran(len(tokens))


def _chain(drafter, asks) -> list[list[int]]:
    """K - 1 passes of one row a lane, each feeding the drafts before back in at the next
    position; a lane asking fewer drafts than the longest rides to the end at its last place."""
    lanes = [lane for lane, _, _ in asks]
    drafts = [torch.stack([lane.logits.argmax() for lane in lanes])]
    out = torch.cat([lane.out for lane in lanes])
    kv = (drafter.kv.k[0], drafter.kv.v[0])
    most = max(k for _, _, k in asks)
    for j in range(most - 1):
        segments = []
        for i, (lane, tokens, _) in enumerate(asks):
            kv_rows = lane.req.lane.kv_rows
            pos = min(len(tokens) - 1 + j, kv_rows.shape[0] - 1)  # past its k: its outputs unread
            segments.append(Segment(lane.req.lane.slot, pos, i, 1, kv_rows[: pos + 1]))
        rows = range(len(asks))
        batch = eager_batch(drafter.target, tuple(segments), drafts[-1], list(rows))
        with torch.inference_mode():
            logits, out = drafter.head.forward_pass(
                drafter.target, drafts[-1], out, batch, kv, last=batch.logit_rows
            )
        drafts.append(logits.argmax(-1))
    table = torch.stack(drafts, dim=1).tolist()  # the one read of the proposal
    return [row[:k] for row, (_, _, k) in zip(table, asks)]
