"""A probe that streams the same greedy completion back to back while a test sends something
hostile: the longest wait between its chunks, and every run's tokens and logprobs."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import httpx

PROBE = {
    "prompt": "Once upon a time",
    "max_tokens": 48,
    "temperature": 0,
    "ignore_eos": True,
    "logprobs": 1,
    "return_token_ids": True,
    "stream": True,
}
# The probe's gaps are ~0.05 s; the bodies these tests send cost seconds when not guarded (600k
# ids validated item by item through the prompt's union: 3.2 s); a loaded 2-core machine once
# paused a stream 0.54 s with the guards in place.
MAX_GAP_S = 1.0


@dataclass
class Run:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


@dataclass
class ProbeReport:
    max_gap: float
    runs: list[Run]


class Probe:
    def __init__(self, url: str, body: dict | None = None) -> None:
        self.url, self.body = url, body or PROBE
        self.stop_event, self.started = threading.Event(), threading.Event()
        self.runs: list[Run] = []
        self.max_gap = 0.0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Probe:
        self.thread.start()
        assert self.started.wait(60), "the probe never got a chunk"
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join(60)

    def report(self) -> ProbeReport:
        assert self.error is None, self.error
        return ProbeReport(self.max_gap, list(self.runs))

    def _loop(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=60) as http:
                while not self.stop_event.is_set():
                    self.runs.append(self._once(http))
        except BaseException as exc:  # reported by report()
            self.error = exc

    def _once(self, http: httpx.Client) -> Run:
        run, last = Run(), time.monotonic()  # the wait for the first chunk counts too
        with http.stream("POST", "/v1/completions", json=self.body) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                now = time.monotonic()
                self.max_gap, last = max(self.max_gap, now - last), now
                if line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"][0]
                    run.tokens += choice.get("token_ids") or []
                    run.logprobs += (choice.get("logprobs") or {}).get("token_logprobs", [])
                    self.started.set()
        return run


def reference(url: str, body: dict | None = None) -> Run:
    """The probe's run alone (nothing else in flight)."""
    with httpx.Client(base_url=url, timeout=60) as http:
        probe = Probe(url, body)
        return probe._once(http)


def assert_unharmed(report: ProbeReport, want: Run) -> None:
    assert report.max_gap < MAX_GAP_S, f"the probe stalled for {report.max_gap:.3f}s"
    assert report.runs, "the probe never finished a run"
    for run in report.runs:
        assert run == want, "the probe's tokens or logprobs changed"
