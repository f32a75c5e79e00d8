"""Prometheus metrics of one app (its own CollectorRegistry: two apps in a process never mix)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily

from ..engine.stats import EngineStats

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_COUNT_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
OUTCOMES_DOC = (
    "Choices served, by finish reason (stop, length, cancelled), and requests refused "
    "(invalid, unauthorized, queue_full, overloaded, error)"
)
REFUSALS_DOC = (
    "Requests and connections refused, by reason: the error code of the reply "
    "(e.g. prompt_too_large, invalid_value, queue_full), or a connection's "
    "(header_timeout, body_timeout, too_many_connections)"
)
DRAFT_DOC = "Tokens committed per verify pass: accepted drafted tokens plus the bonus token"


@dataclass(frozen=True)
class ChoiceTimes:
    """A choice's monotonic times: arrival, getting a lane (None if it never did), its end."""

    arrival: float
    admitted: float | None
    end: float


class Metrics:
    def __init__(self, stats: Callable[[], EngineStats], lanes: int) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("tensorfold_requests", OUTCOMES_DOC, ["outcome"], registry=r)
        self.refusals = Counter("tensorfold_refusals", REFUSALS_DOC, ["reason"], registry=r)
        self.prompt_tokens = Counter(
            "tensorfold_prompt_tokens", "Prompt tokens admitted", registry=r
        )
        self.generated_tokens = Counter(
            "tensorfold_generation_tokens", "Tokens generated", registry=r
        )
        self.cache_hits = Counter(
            "tensorfold_prompt_cache_hits", "Choices that resumed from the prompt cache", registry=r
        )
        self.cached_tokens = Counter(
            "tensorfold_prompt_cache_tokens",
            "Prompt tokens resumed from the prompt cache",
            registry=r,
        )
        self.ttft = Histogram(
            "tensorfold_time_to_first_token_seconds",
            "Arrival to first token",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.token_latency = Histogram(
            "tensorfold_time_per_output_token_seconds",
            "Time between successive tokens of one choice",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self._vllm_named(r, stats)
        self._gauge("tensorfold_queue_depth", "Requests waiting for a lane", lambda: stats().queued)
        self._gauge("tensorfold_lanes_busy", "Lanes holding a request", lambda: stats().busy_lanes)
        self._gauge(
            "tensorfold_lanes_prompt",
            "Busy lanes still reading their prompt",
            lambda: stats().prompt_lanes,
        )
        self._gauge("tensorfold_lanes_total", "Lanes (--parallel)", lambda: lanes)
        self._gauge("tensorfold_engine_passes", "Forward passes run so far", lambda: stats().passes)
        self._gauge(
            "tensorfold_prompt_cache_misses",
            "Prompt-cache lookups with no cached prefix",
            lambda: stats().cache_misses,
        )
        self._gauge(
            "tensorfold_prompt_cache_evictions",
            "Prompt-cache entries evicted (LRU)",
            lambda: stats().cache_evictions,
        )
        self._gauge(
            "tensorfold_prompt_cache_inserts",
            "Prompt-cache entries stored",
            lambda: stats().cache_inserts,
        )
        self._gauge(
            "tensorfold_prompt_cache_bytes",
            "Bytes the prompt cache holds (within its budget)",
            lambda: stats().cache_bytes,
        )

        self._gauge(
            "tensorfold_draft_proposed_tokens",
            "Drafted tokens scored by verify passes",
            lambda: stats().draft_proposed,
        )
        self._gauge(
            "tensorfold_draft_accepted_tokens",
            "Drafted tokens the target chose too (kept)",
            lambda: stats().draft_accepted,
        )
        self._gauge(
            "tensorfold_collective_seconds",
            "A tensor split: seconds in collectives (plans and all-gathers) on rank 0, in total",
            lambda: stats().collective_seconds,
        )
        self._gauge(
            "tensorfold_collective_last_pass_seconds",
            "A tensor split: seconds in collectives during the last pass on rank 0",
            lambda: stats().collective_last_pass_seconds,
        )
        self._gauge(
            "tensorfold_collective_calls",
            "A tensor split: all-gathers run on rank 0, in total",
            lambda: stats().collective_calls,
        )
        r.register(AcceptanceLengths(stats))

    def _vllm_named(self, r: CollectorRegistry, stats: Callable[[], EngineStats]) -> None:
        """The quantities vLLM's dashboards read, under our prefix (docs/server.md maps them)."""
        self.request_prompt = Histogram(
            "tensorfold_request_prompt_tokens",
            "Prompt tokens per choice",
            buckets=TOKEN_COUNT_BUCKETS,
            registry=r,
        )
        self.request_generation = Histogram(
            "tensorfold_request_generation_tokens",
            "Generated tokens per choice",
            buckets=TOKEN_COUNT_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "tensorfold_request_queue_time_seconds",
            "Arrival to getting a lane",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "tensorfold_e2e_request_latency_seconds",
            "Arrival to the end of a choice",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.cache_queries = Counter(
            "tensorfold_prefix_cache_queries",
            "Prompt tokens looked up in the prompt cache",
            registry=r,
        )
        self.cache_hit_tokens = Counter(
            "tensorfold_prefix_cache_hits",
            "Prompt tokens found in the prompt cache",
            registry=r,
        )
        self._gauge(
            "tensorfold_kv_cache_usage_perc",
            "Share of KV pages held by lanes and the prompt cache (0 to 1)",
            lambda: stats().kv_pages_used / max(1, stats().kv_pages_total),
        )

    def _gauge(self, name: str, doc: str, read: Callable[[], float]) -> None:
        Gauge(name, doc, registry=self.registry).set_function(read)

    def refused(self, outcome: str, reason: str) -> None:
        """A request refused: counted by outcome and by its reason (the error code)."""
        self.requests.labels(outcome=outcome).inc()
        self.refusals.labels(reason=reason).inc()

    def dropped(self, reason: str) -> None:
        """A connection closed before it made a request (a read timeout)."""
        self.refusals.labels(reason=reason).inc()

    def finished(
        self,
        outcome: str,
        prompt_tokens: int,
        completion_tokens: int,
        cached: int,
        times: ChoiceTimes | None = None,
    ) -> None:
        """One choice ended; each choice is its own lane, so its prompt counts once per choice."""
        self.requests.labels(outcome=outcome).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generated_tokens.inc(completion_tokens)
        self.request_prompt.observe(prompt_tokens)
        self.request_generation.observe(completion_tokens)
        self.cache_queries.inc(prompt_tokens)
        self.cache_hit_tokens.inc(cached)
        if cached:
            self.cache_hits.inc()
            self.cached_tokens.inc(cached)
        if times is not None:
            if times.admitted is not None:
                self.queue_time.observe(times.admitted - times.arrival)
            self.e2e.observe(times.end - times.arrival)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class AcceptanceLengths:
    """Tokens committed per verify pass (accepted drafts + the bonus token), as a histogram."""

    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        self.stats = stats

    def describe(self):
        return [HistogramMetricFamily("tensorfold_draft_acceptance_length", DRAFT_DOC)]

    def collect(self):
        lengths = dict(self.stats().draft_lengths)
        top = max(lengths, default=1)
        buckets, seen = [], 0
        for le in range(1, top + 1):
            seen += lengths.get(le, 0)
            buckets.append((str(float(le)), seen))
        buckets.append(("+Inf", seen))
        total = sum(n * c for n, c in lengths.items())
        yield HistogramMetricFamily(
            "tensorfold_draft_acceptance_length", DRAFT_DOC, buckets=buckets, sum_value=total
        )
