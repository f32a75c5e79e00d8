"""The token rule: which token a request chooses from a row of logits (docs/exactness.md,
'Sampling'). Plain decoding and drafting's acceptance both choose through it."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import InvalidRequest
from ..ops import dispatch as op
from ..ops.sampling import uniform
from ..util import join
from .constraints import GrammarBook, end_only, unpack
from .logits_rules import shape_rows, shapes_logits
from .request import Request


class Sampler:
    """Chooses tokens: the request's own rule (penalties, bias, grammar), then greedy's first
    maximum or a draw keyed by (seed, choice, position). `greedy(rows)` is the runner's argmax
    of many rows at once (on the device; a split takes it across its ranks, on the host)."""

    def __init__(self, greedy, eos_ids: set[int], grammars: GrammarBook) -> None:
        self.greedy, self.eos_ids, self.grammars = greedy, eos_ids, grammars

    def choose(self, ready: list[tuple[Request, torch.Tensor]]) -> list[int]:
        """Next tokens of the lanes that produce one (`pick`, read back in one sync)."""
        if not ready:  # a verify step's lanes are walked by drafting, not chosen here
            return []
        order, tokens = self.pick(ready)
        out = [0] * len(ready)
        for i, t in zip(order, tokens.tolist()):
            out[i] = t
        return out

    def pick(self, ready: list[tuple[Request, torch.Tensor]]) -> tuple[list[int], torch.Tensor]:
        """The next tokens of `ready`'s lanes chosen on the rows' device, not read back:
        (order, tokens) with tokens[j] the choice of ready[order[j]]. Plain greedy rows in one
        argmax; every other row through its request's rule (all rules in one `rule_rows`),
        then the greedy ones' argmax in one call and the sampled ones' draws in one `sample`
        call (`choose_token` is the same rule for one row)."""
        flags = [plain_greedy(req) for req, _ in ready]
        order = [i for i, flag in enumerate(flags) if flag]
        parts = []
        if order:
            rows = [ready[i][1] for i in order]  # one lane's row as a view: no copy launched
            parts.append(self.greedy(rows[0][None] if len(rows) == 1 else torch.stack(rows)))
        rest = [i for i, flag in enumerate(flags) if not flag]
        if rest:  # rows with a rule of their own (the usual step has none)
            order += self._ruled(ready, rest, parts)
        if not parts:
            return [], torch.empty(0, dtype=torch.long)
        if len(parts) == 1:  # the usual step: one kind of rule, nothing to join
            return order, parts[0]
        # a split's argmax comes back on the host, its sampled rows on the device
        return order, torch.cat([p.to(parts[0].device) for p in parts])

    def _ruled(self, ready, rest: list[int], parts: list[torch.Tensor]) -> list[int]:
        """The `rest` rows through their requests' rules, then one argmax for the greedy ones
        and one `sample` call for the sampled, each appended to `parts`; their order."""
        shaped = self.rule_rows([(ready[i][0], ready[i][0].output_ids, ready[i][1]) for i in rest])
        greedy = [(i, x) for i, x in zip(rest, shaped) if ready[i][0].params.temperature <= 0.0]
        sampled = [(i, x) for i, x in zip(rest, shaped) if ready[i][0].params.temperature > 0.0]
        if greedy:  # one argmax (first maximum) over the stacked rows
            parts.append(torch.argmax(torch.stack([x for _, x in greedy]), dim=1))
        if sampled:
            parts.append(self.sample([(ready[i][0], x) for i, x in sampled]))
        return [i for i, _ in greedy] + [i for i, _ in sampled]

    def rule_rows(self, asks: list[tuple[Request, list[int], torch.Tensor]]) -> list[torch.Tensor]:
        """`rule_row` of each (request, output ids, row), the rules of all rows that shape
        their logits applied in one `shape_rows` call and their grammars' masks in one fill
        (each row's result is its own)."""
        out = [row for _, _, row in asks]
        shaping = [i for i, (req, _, _) in enumerate(asks) if custom(req)]
        if not shaping:
            return out
        rules = [(asks[i][0].params, asks[i][0].prompt_ids, asks[i][1]) for i in shaping]
        x = shape_rows(rules, torch.stack([asks[i][2] for i in shaping]), self.eos_ids)
        words = [(j, self._words(asks[i][0], asks[i][1])) for j, i in enumerate(shaping)]
        words = [(j, w) for j, w in words if w is not None]
        if words:  # the packed masks sent once, unpacked on the rows' device
            packed = torch.from_numpy(np.stack([w for _, w in words])).to(
                x.device, non_blocking=True
            )
            at = torch.tensor([j for j, _ in words]).to(x.device, non_blocking=True)
            x[at] = x[at].masked_fill(~unpack(packed, x.shape[1]), float("-inf"))
        for j, i in enumerate(shaping):
            out[i] = x[j]
        return out

    def sample(self, rows: list[tuple[Request, torch.Tensor]]) -> torch.Tensor:
        """The sampled tokens of rows (each through its request's rule) in one call: each
        request's temperature, top-k, top-p, min-p and its draw at its next position."""
        if not rows:
            return torch.empty(0, dtype=torch.long)
        params = [
            (r.params.temperature, r.params.top_k, r.params.top_p, r.params.min_p) for r, _ in rows
        ]
        us = [uniform(r.seed, r.num_tokens, r.choice) for r, _ in rows]
        return op.sample_rows([x for _, x in rows], params, us)

    def rule_row(self, req: Request, output_ids: list[int], row: torch.Tensor) -> torch.Tensor:
        """The row the request samples from after `output_ids` (its reply so far, or any prefix
        of it: a drafted position): its own rule, then its grammar's mask (fp32). A function of
        the request's parameters, prompt, `output_ids` and `row` alone: `rule_rows` of one."""
        return self.rule_rows([(req, output_ids, row)])[0]

    def _words(self, req: Request, output_ids: list[int]) -> np.ndarray | None:
        """The request's grammar mask after `output_ids` as packed words (Matcher.words); None
        without a grammar or before it starts."""
        p = req.params
        if p.grammar is None:
            return None
        lane = req.lane
        if lane.matcher is None:
            try:
                lane.matcher = self.grammars.matcher(p.grammar)
            except InvalidRequest:  # checked at admission; should it still fail, only end
                return end_only(self.grammars.vocab_size, self.eos_ids)
        return lane.matcher.words(output_ids)

    def choose_token(self, req: Request, logits: torch.Tensor) -> int:
        """The token the request chooses from one row of logits at its next position
        (req.num_tokens)."""
        row = self.rule_row(req, req.output_ids, logits)
        if req.params.temperature <= 0.0:
            return int(torch.argmax(row))
        return int(self.sample([(req, row)])[0])  # the batched passes' rule, one row

    def greedy_picks(
        self, lanes: list[tuple[Request, torch.Tensor]], along: torch.Tensor | None = None
    ) -> tuple[list[list[int]], list[int]]:
        """choose_token of every row of each (request, rows) at once where the request is plain
        greedy (its choice does not depend on the tokens before it), else [] for it (choose row
        by row): one argmax over all their rows, read back in one copy (a verify pass of 16 lanes
        read each lane's apart, a wait on the device each, then launched one argmax a lane).
        `along`: ids on the rows' device read back in the same copy (the drafts a pass fed from
        the device), returned second."""
        plain = [plain_greedy(req) for req, _ in lanes]
        rows = [x for (_, x), p in zip(lanes, plain) if p]
        ids = [self.greedy(joined(rows))] if rows else []
        if along is not None:
            ids.append(along.to(torch.long))
        flat = join(ids).tolist() if ids else []
        picks, at = [], 0
        for (_, x), p in zip(lanes, plain):
            n = x.shape[0] if p else 0
            picks.append(flat[at : at + n])
            at += n
        return picks, flat[at:]


def joined(rows: list[torch.Tensor]) -> torch.Tensor:
    """Row blocks [r_i, V] as one [sum r_i, V]: a view where each starts where the one before
    ends in the same tensor (a graph's lanes that want all their rows), else a copy. Adjacent
    addresses are not enough: two allocations may lie end to end in one block of memory."""
    if len(rows) == 1:  # one lane's rows: already one block
        return rows[0]
    first, at = rows[0], rows[0].data_ptr()
    storage = first.untyped_storage().data_ptr()
    for x in rows:
        same = x.untyped_storage().data_ptr() == storage and x.stride() == first.stride()
        if not (same and x.data_ptr() == at and x.is_contiguous()):
            return torch.cat(rows)
        at += x.numel() * x.element_size()
    return first.as_strided((sum(x.shape[0] for x in rows), first.shape[1]), first.stride())


def custom(req: Request) -> bool:
    """The request shapes its rows (penalties, bias, a grammar)."""
    return req.params.grammar is not None or shapes_logits(req.params)


def plain_greedy(req: Request) -> bool:
    """Greedy with no rule of its own: its rows' choices are one argmax, batched."""
    return req.params.temperature <= 0.0 and not custom(req)
