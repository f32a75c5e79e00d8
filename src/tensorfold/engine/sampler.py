"""The token rule: which token a request chooses from a row of logits (docs/exactness.md,
'Sampling'). Plain decoding and drafting's acceptance both choose through it."""

from __future__ import annotations

import torch

from ..errors import InvalidRequest
from ..ops import dispatch as op
from ..ops.sampling import uniform
from .constraints import GrammarBook, apply_mask
from .logits_rules import shape_logits, shapes_logits
from .request import Request


class Sampler:
    """Chooses tokens: the request's own rule (penalties, bias, grammar), then greedy's first
    maximum or a draw keyed by (seed, choice, position). `greedy(rows)` is the runner's argmax
    of many rows at once (one device sync; a split takes it across its ranks)."""

    def __init__(self, greedy, eos_ids: set[int], grammars: GrammarBook) -> None:
        self.greedy, self.eos_ids, self.grammars = greedy, eos_ids, grammars

    def choose(self, ready: list[tuple[Request, torch.Tensor]]) -> list[int]:
        """Next tokens of the lanes that produce one: plain greedy rows in one argmax; every
        other row through its request's rule, then its argmax (greedy) or, with the other
        sampled rows, one `sample` call (`choose_token` is the same rule for one row)."""
        plain = [i for i, (req, _) in enumerate(ready) if plain_greedy(req)]
        tokens: list[int] = [0] * len(ready)
        if plain:
            for i, t in zip(plain, self.greedy(torch.stack([ready[i][1] for i in plain]))):
                tokens[i] = t
        batched, sampled = set(plain), []
        for i, (req, row) in enumerate(ready):
            if i in batched:
                continue
            x = self.rule_row(req, req.output_ids, row)
            if req.params.temperature <= 0.0:
                tokens[i] = int(torch.argmax(x))
            else:
                sampled.append((i, req, x))
        for (i, _, _), token in zip(sampled, self.sample([(req, x) for _, req, x in sampled])):
            tokens[i] = token
        return tokens

    def sample(self, rows: list[tuple[Request, torch.Tensor]]) -> list[int]:
        """The sampled tokens of rows (each through its request's rule) in one call: each
        request's temperature, top-k, top-p, min-p and its draw at its next position."""
        if not rows:
            return []
        params = [
            (r.params.temperature, r.params.top_k, r.params.top_p, r.params.min_p) for r, _ in rows
        ]
        us = [uniform(r.seed, r.num_tokens, r.choice) for r, _ in rows]
        return op.sample_rows([x for _, x in rows], params, us)

    def rule_row(self, req: Request, output_ids: list[int], row: torch.Tensor) -> torch.Tensor:
        """The row the request samples from after `output_ids` (its reply so far, or any prefix
        of it: a drafted position): its own rule, then its grammar's mask (fp32). A function of
        the request's parameters, prompt, `output_ids` and `row` alone."""
        p = req.params
        if not custom(req):
            return row
        x = shape_logits(p, req.prompt_ids, output_ids, row, self.eos_ids)
        if p.grammar is None:
            return x
        lane = req.lane
        if lane.matcher is None:
            try:
                lane.matcher = self.grammars.matcher(p.grammar)
            except InvalidRequest:  # checked at admission; should it still fail, only end
                only_end = torch.ones_like(x, dtype=torch.bool)
                only_end[sorted(self.eos_ids)] = False
                return x.masked_fill(only_end, float("-inf"))
        return apply_mask(x, lane.matcher.allowed(output_ids))

    def choose_token(self, req: Request, logits: torch.Tensor) -> int:
        """The token the request chooses from one row of logits at its next position
        (req.num_tokens)."""
        row = self.rule_row(req, req.output_ids, logits)
        if req.params.temperature <= 0.0:
            return int(torch.argmax(row))
        return self.sample([(req, row)])[0]  # the batched passes' rule, one row

    def greedy_picks(self, req: Request, rows: torch.Tensor) -> list[int]:
        """choose_token of every row at once for a plain greedy request, whose choice does not
        depend on the tokens before it; else [] (choose row by row)."""
        return self.greedy(rows) if plain_greedy(req) else []


def custom(req: Request) -> bool:
    """The request shapes its rows (penalties, bias, a grammar)."""
    return req.params.grammar is not None or shapes_logits(req.params)


def plain_greedy(req: Request) -> bool:
    """Greedy with no rule of its own: its rows' choices are one argmax, batched."""
    return req.params.temperature <= 0.0 and not custom(req)
