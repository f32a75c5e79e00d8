"""A request: its tokens, how far it is computed, how to sample, when to stop."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Callable

from ..errors import InvalidRequest
from .text import Detokenizer


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ()))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        checks = [
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be at least 1"),
            (self.temperature >= 0.0, "temperature", "must be >= 0"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (self.top_k >= -1, "top_k", "must be >= -1 (0 or -1 turn it off)"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs", "must be between 0 and 20"),
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


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    seed: int
    stream: int = 0                       # which of several choices: keys the random numbers
    cuts: tuple[int, ...] = ()            # prompt positions where a pass must end (seams, snapshots)
    on_cut: Callable | None = None        # called (request, position, logits) after a pass ends at a cut
    on_finish: Callable | None = None     # called (request, logits) before the lane is released
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    status: Status = Status.WAITING
    slot: int = -1
    pages: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    cancelled: bool = False
    arrival: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    finish_time: float | None = None
    text: str = ""
    emitted_text_len: int = 0
    detok: Detokenizer = field(default_factory=lambda: Detokenizer())
    last_logits: object = None
    cached_tokens: int = 0                # prompt tokens resumed from the prompt cache
    cache_cuts: frozenset = frozenset()
    kv_rows: object = None                # [capacity] KV cache row of every position, at admission
    keep_logits: bool = False             # keep the logits of every computed position (teacher forcing)
    logits_by_position: dict = field(default_factory=dict)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def in_prompt(self) -> bool:
        return self.num_computed < len(self.prompt_ids)

    @property
    def capacity(self) -> int:
        """Positions this request may fill: its prompt and every token it may generate."""
        return len(self.prompt_ids) + self.max_tokens
