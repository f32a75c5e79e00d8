"""A request: its tokens, how far it is computed, how to sample, when to stop."""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..drafters.base import LaneDraft
from ..errors import InvalidRequest
from ..runner.plan import PENDING, LaneRows
from .constraints import Grammar, Matcher
from .text import ReplyText


class TokenView(Sequence[int]):
    """A prompt and its reply read as one sequence without copying either: a drafter reads a
    few tokens of it a step, and a context may hold tens of thousands (a copy a step would cost
    more than the lookup). Indexes and slices (a slice is a new list) as a list would."""

    __slots__ = ("head", "tail")

    def __init__(self, head: list[int], tail: list[int]) -> None:
        self.head, self.tail = head, tail

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)

    def __getitem__(self, i):
        n = len(self.head)
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return [self[j] for j in range(start, stop, step)]
            if stop <= n:
                return self.head[start:stop]
            if start >= n:
                return self.tail[start - n : stop - n]
            return self.head[start:] + self.tail[: stop - n]
        j = i + len(self) if i < 0 else i
        if not 0 <= j < len(self):
            raise IndexError("token index out of range")
        return self.head[j] if j < n else self.tail[j - n]


@dataclass(frozen=True)
class SamplingParams:
    """vLLM-shaped sampling parameters. temperature 0 is greedy."""

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), ids ascending
    min_tokens: int = 0  # eos and stop ids are forbidden before this many tokens
    prompt_logprobs: int | None = None  # each prompt token's logprob and the top k (no cache)
    grammar: Grammar | None = None  # structured output: the reply must match it

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        )
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        bias = dict(
            self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        )
        object.__setattr__(
            self, "logit_bias", tuple(sorted((int(k), float(v)) for k, v in bias.items()))
        )
        checks = [
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be at least 1"),
            (self.temperature >= 0.0, "temperature", "must be >= 0"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (self.top_k >= -1, "top_k", "must be >= -1 (0 or -1 turn it off)"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (
                self.logprobs is None or 0 <= self.logprobs <= 20,
                "logprobs",
                "must be between 0 and 20",
            ),
            (
                self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20,
                "prompt_logprobs",
                "must be between 0 and 20",
            ),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]"),
            (0.0 < self.repetition_penalty <= 100.0, "repetition_penalty", "must be in (0, 100]"),
            (
                all(-100.0 <= b <= 100.0 for _, b in self.logit_bias),
                "logit_bias",
                "values must be in [-100, 100]",
            ),
            (
                self.min_tokens >= 0
                and (self.max_tokens is None or self.min_tokens <= self.max_tokens),
                "min_tokens",
                "must be between 0 and max_tokens",
            ),
        ]
        for ok, name, why in checks:
            if not ok:
                raise InvalidRequest(f"{name}={getattr(self, name)!r} {why}", param=name)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class TokenEvent:
    """One step's news for a request: new tokens and text, and the finish if it finished."""

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    # with the first token, when asked: each prompt token's (logprob, rank, top), None first
    prompt_logprobs: list[tuple[float, int, list[tuple[int, float]]] | None] | None = None


@dataclass
class Watch:
    """What a tool or test watches in one request (none of it changes a token): seams where
    `on_cut` fingerprints the lane, the end, and the logits of every computed position."""

    cuts: tuple[int, ...] = ()  # prompt positions where a pass ends and on_cut is called
    on_cut: Callable[[Request, int, torch.Tensor | None], None] | None = None
    on_finish: Callable[[Request, torch.Tensor | None], None] | None = None  # before the release
    keep_logits: bool = False  # keep every computed position's logits (teacher forcing)
    logits: dict[int, torch.Tensor] = field(default_factory=dict)  # position -> logits, if kept

    def passed(self, req: Request, start: int, logits: torch.Tensor | None) -> None:
        """After a pass over positions [start, req.lane.computed) that returned `logits`."""
        if self.keep_logits and logits is not None:  # kept: one row per position
            for offset, row in enumerate(logits):
                self.logits[start + offset] = row.clone()
        end = req.lane.computed
        if self.on_cut is not None and end in self.cuts:
            self.on_cut(req, end, logits[-1] if logits is not None else None)


@dataclass
class Times:
    """When the request arrived, got a lane (the end of its queue time) and its first token."""

    arrival: float = field(default_factory=time.monotonic)
    admitted: float | None = None
    first_token: float | None = None


@dataclass
class Lane:
    """What the engine holds for a request while it runs: the scheduler sets its state slot, KV
    pages and rows and its cuts at admission; passes advance `computed`."""

    slot: int = -1
    pages: list[int] = field(default_factory=list)
    kv_rows: torch.Tensor | None = None  # [capacity] KV cache row of every position
    cuts: tuple[int, ...] = ()  # prompt positions where a pass must end (seams, snapshots)
    cache_cuts: frozenset[int] = frozenset()  # where the lane snapshots into the prompt cache
    computed: int = 0  # positions whose state the lane holds
    cached: int = 0  # prompt tokens resumed from the prompt cache
    matcher: Matcher | None = None  # the grammar's, made on the engine thread at first use
    draft: LaneDraft | None = None  # its drafting, when it drafts
    pending: int = -1  # its next token, chosen on the device and not read back: its index there
    writes: int = -1  # the slot its next pass leaves its state in, when not `slot` (drafting)


@dataclass
class Request:
    """One choice of one prompt: what the client asked for (params with max_tokens and seed
    resolved), what it got, and its lane."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    choice: int = 0  # which of a prompt's n choices: keys the random numbers
    watch: Watch | None = None
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: str | None = None
    reply: ReplyText = field(default_factory=ReplyText)
    prompt_logprobs: list = field(default_factory=list)  # filled while the prompt is read
    times: Times = field(default_factory=Times)
    lane: Lane = field(default_factory=Lane)

    @property
    def max_tokens(self) -> int:
        return self.params.max_tokens

    @property
    def seed(self) -> int:
        return self.params.seed

    @property
    def cached_tokens(self) -> int:
        return self.lane.cached

    @property
    def all_ids(self) -> TokenView:
        """The prompt and the reply so far, as one sequence (not a copy)."""
        return TokenView(self.prompt_ids, self.output_ids)

    @property
    def num_drafted(self) -> int:
        """Drafted tokens in flight (fed after the committed ones)."""
        return len(self.lane.draft.proposal) if self.lane.draft is not None else 0

    @property
    def drafting(self) -> bool:
        """Drafted tokens are in flight (their rows follow the committed ones)."""
        return self.lane.draft is not None and bool(self.lane.draft.proposal)

    @property
    def num_tokens(self) -> int:
        """Its tokens: the prompt, the reply, and a token chosen but not read back yet."""
        return len(self.prompt_ids) + len(self.output_ids) + (self.lane.pending >= 0)

    @property
    def in_prompt(self) -> bool:
        return self.lane.computed < len(self.prompt_ids)

    @property
    def capacity(self) -> int:
        """Positions this request may fill: its prompt and every token it may generate."""
        return len(self.prompt_ids) + self.max_tokens

    @property
    def text(self) -> str:
        """The reply's text emitted so far (a stop string and what follows it never are)."""
        return self.reply.text

    def fed(self, start: int, end: int) -> list[int]:
        """Positions [start, end) of what a pass feeds: the committed ids, then a token chosen
        on the device (PENDING: the pass's Fed writes it), then the drafted tokens in flight
        (sliced part by part: a long context's list is never copied whole)."""
        p, o = len(self.prompt_ids), len(self.output_ids)
        ids = self.prompt_ids[start:end] + self.output_ids[max(0, start - p) : max(0, end - p)]
        if start <= p + o < end and self.lane.pending >= 0:
            ids.append(PENDING)
        top = self.num_tokens  # drafts follow the pending token (drafted while it was unread)
        if end > top and self.drafting:
            ids += self.lane.draft.proposal[max(0, start - top) : end - top]
        return ids

    def rows(self, n: int = 0, logits: range = range(0)) -> LaneRows:
        """The lane's next `n` rows as a runner reads them (none: the lane as it stands)."""
        lane, start = self.lane, self.lane.computed
        ids = tuple(self.fed(start, start + n))
        pages = tuple(lane.pages)
        return LaneRows(
            self.request_id, lane.slot, start, ids, lane.kv_rows, pages, logits, lane.writes
        )
