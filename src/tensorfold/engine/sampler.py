"""The token rule: which token a request chooses from a row of logits (docs/exactness.md,
'Sampling'). Plain decoding and drafting's acceptance both choose through it."""

from __future__ import annotations

import torch

from ..errors import InvalidRequest
from ..ops.sampling import sample_row, uniform
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
        """Next tokens of the lanes that produce one: plain greedy rows in one argmax; a row
        with its own rule, or sampled, through `choose_token`."""
        plain = [i for i, (req, _) in enumerate(ready) if plain_greedy(req)]
        tokens: list[int] = [0] * len(ready)
        if plain:
            for i, t in zip(plain, self.greedy(torch.stack([ready[i][1] for i in plain]))):
                tokens[i] = t
        batched = set(plain)
        for i, (req, row) in enumerate(ready):
            if i not in batched:
                tokens[i] = self.choose_token(req, row)
        return tokens

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
        p = req.params
        row = self.rule_row(req, req.output_ids, logits)
        if p.temperature <= 0.0:
            return int(torch.argmax(row))
        u = uniform(req.seed, req.num_tokens, req.choice)
        return sample_row(row, p.temperature, p.top_k, p.top_p, p.min_p, u)

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
