"""The host beside the device: pass N+1 is planned and launched while pass N's tokens are
chosen, and those tokens are read back (committed, streamed, checked for a stop) while pass
N+1 runs.

The one thing pass N+1 needs of pass N is the token each decoding lane chose; it stays on the
device (a lane's `pending` index into `Chosen.tokens`) and the pass's Fed writes it into the
fed ids, stream-ordered. Every lane's rows are still computed apart from the others', so a
lane's tokens and states are the sequential engine's: only when the host learns them moves. A
lane whose token ends it has already fed that token in the pass launched meanwhile (as a
finishing lane's catch-up would): its prompt-cache cut then holds the whole reply."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ops.sampling import top_logprobs_of
from ..runner.plan import Fed
from ..util import join
from .request import Request
from .scheduler import Work


@dataclass
class Chosen:
    """The tokens of a pass's ready lanes, chosen on the device: tokens[j] is ready[j]'s; with
    the logprobs the lanes that ask for them will report, computed beside them."""

    ready: list[tuple[Request, torch.Tensor]]  # (request, the logits row it chose from)
    tokens: torch.Tensor
    # tokens, then (when a lane asks) logprob values and their ids: landed once `event` has
    host: tuple[torch.Tensor, ...]
    asks: list[tuple[int, int]]  # (index in ready, top k) of the lanes asking for logprobs
    event: torch.cuda.Event | None = None

    @classmethod
    def pick(cls, sampler, ready: list[tuple[Request, torch.Tensor]]) -> Chosen:
        """Chooses every ready lane's next token without waiting for it; each lane is marked
        pending (its token's index here) and its host copy is on its way."""
        order, tokens = sampler.pick(ready)
        ready = [ready[i] for i in order]
        for j, (req, _) in enumerate(ready):
            req.lane.pending = j
        asks = [
            (j, req.params.logprobs)
            for j, (req, _) in enumerate(ready)
            if req.params.logprobs is not None
        ]
        found = (tokens, *_logprobs(ready, tokens, asks)) if asks else (tokens,)
        if not tokens.is_cuda:
            return cls(ready, tokens, found, asks)
        host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in found)
        for h, t in zip(host, found):
            h.copy_(t, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return cls(ready, tokens, host, asks, event)

    def read(self) -> list[tuple[int, tuple | None]]:
        """Each lane's (token, its logprobs or None) once they have landed on the host: waits
        for them alone, not for the pass launched after them."""
        if self.event is not None:
            self.event.synchronize()
        tokens = self.host[0].tolist()
        out: list[tuple[int, tuple | None]] = [(t, None) for t in tokens]
        if not self.asks:  # no logprobs were computed or copied
            return out
        values, ids = (t.tolist() for t in self.host[1:])
        at = top_at = 0  # values hold 1 + k entries a lane, ids k
        for j, k in self.asks:  # each: its token's logprob, then its top k (value, id)
            top = list(zip(ids[top_at : top_at + k], values[at + 1 : at + 1 + k]))
            out[j] = (tokens[j], (values[at], top))
            at, top_at = at + 1 + k, top_at + k
        return out


def _logprobs(ready, tokens: torch.Tensor, asks) -> tuple[torch.Tensor, torch.Tensor]:
    """On the device, for each asking lane: its token's logprob and its top k, row by row as
    ops.sampling.top_logprobs computes them (values [Σ 1 + k] and ids [Σ k])."""
    dev = tokens.device
    values, ids = [torch.empty(0, device=dev)], [torch.empty(0, dtype=torch.long, device=dev)]
    for j, k in asks:
        lp, top_values, top_ids = top_logprobs_of(ready[j][1], tokens[j : j + 1], k)
        values += [lp, top_values]
        ids.append(top_ids)
    return torch.cat(values), torch.cat(ids)


def fed(work: list[Work], chosen: Chosen | None) -> Fed | None:
    """The rows of a pass (its lanes in `work` order) that feed a token still on the device:
    a token `chosen` by the pass before and not read, and drafts a drafter left there
    (`LaneDraft.on_device`), all from one tensor of the sources in turn."""
    sources = [chosen.tokens] if chosen is not None else []
    rows, picks, row0 = [], [], 0
    base = chosen.tokens.shape[0] if chosen is not None else 0
    for w in work:
        req, lane = w.request, w.request.lane
        at = req.num_tokens - 1 - lane.computed  # the pending token's row in the lane's
        if lane.pending >= 0 and 0 <= at < w.rows:
            rows.append(row0 + at)
            picks.append(lane.pending)
        d = lane.draft
        if d is not None and d.on_device is not None and req.drafting:
            first = req.num_tokens - lane.computed  # the drafts follow the lane's tokens
            for j in range(min(len(d.proposal), w.rows - first)):
                rows.append(row0 + first + j)
                picks.append(base + j)
            sources.append(d.on_device)
            base += d.on_device.shape[0]
        row0 += w.rows
    if not rows:
        return None
    tokens = join(sources)
    return Fed(tuple(rows), tokens, tuple(picks))
