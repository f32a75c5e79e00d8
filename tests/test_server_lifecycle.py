"""The server's life around requests: a full queue gets 429 with Retry-After, a signal finishes
or cancels what runs, a failed pass fails only its requests, and a device fault stops the engine
while the server refuses new work by name."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

import httpx
import pytest
from server_harness import (
    CHAT,
    CMPL,
    MSG,
    PROBE,
    assert_error,
    make_engine,
    sse_events,
    start_server,
    wait_for,
)

from tensorfold.engine.engine import Engine


class GatedEngine(Engine):
    """Passes wait for the test to open the gate, so a queue can be filled without racing."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()

    def step(self):
        self.gate.wait(60)
        return super().step()


def test_full_queue_gets_429_with_retry_after(hf_tiny):
    engine = make_engine(hf_tiny, engine_cls=GatedEngine, parallel=1, max_queue=1)
    server = start_server(engine)
    try:
        results: queue.Queue = queue.Queue()

        def first_request() -> None:
            results.put(httpx.post(f"{server.url}{CMPL}", json=PROBE, timeout=60))

        first = threading.Thread(target=first_request)
        first.start()
        wait_for(engine.has_work, "the first request to be queued")
        with server.client() as http:
            r = http.post(CMPL, json=PROBE)
            assert_error(r, 429, None, "queue_full")
            assert r.headers["Retry-After"] == "1"
            assert r.json()["error"]["type"] == "rate_limit_error"
            engine.gate.set()
            first.join(60)
            assert results.get_nowait().status_code == 200
            assert http.post(CMPL, json=PROBE).status_code == 200
            text = http.get("/metrics").text
            assert 'tensorfold_requests_total{outcome="queue_full"} 1.0' in text
    finally:
        engine.gate.set()
        server.stop()


@dataclass
class Spawned:
    """`tensorfold serve` in a subprocess, its stderr collected by a reader thread."""

    proc: subprocess.Popen
    url: str
    reader: threading.Thread
    lines: list[str]

    def log(self) -> str:
        self.reader.join(30)  # stderr is at EOF once the process has exited
        return "".join(self.lines)


def _spawn(checkpoint, *flags: str) -> Spawned:
    code = "import sys; from tensorfold.cli import main; sys.exit(main(sys.argv[1:]))"
    cmd = [
        sys.executable,
        "-c",
        code,
        "serve",
        str(checkpoint),
        "--port",
        "0",
        "--parallel",
        "2",
        "--context",
        "512",
        "--prompt-cache-gib",
        "0.01",
        *flags,
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    started: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if "Uvicorn running on " in line:
                started.put(line.split("Uvicorn running on ")[1].split()[0])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return Spawned(proc, started.get(timeout=120), reader, lines)


@pytest.mark.parametrize(
    "sig,grace,finishes",
    [(signal.SIGTERM, "30", True), (signal.SIGINT, "0", False)],
    ids=["sigterm-finishes", "sigint-cancels"],
)
def test_shutdown_finishes_or_cancels(hf_tiny, sig, grace, finishes):
    server = _spawn(hf_tiny, "--shutdown-grace", grace)
    try:
        body = {**PROBE, "max_tokens": 300, "stream": True}
        got, reasons, done = [], [], False
        with httpx.stream("POST", f"{server.url}{CMPL}", json=body, timeout=60) as stream:
            events = sse_events(stream)
            got += next(events)["choices"][0]["token_ids"]
            server.proc.send_signal(sig)
            for event in events:
                done = done or event is None
                if event is not None:
                    got += event["choices"][0]["token_ids"]
                    reasons.append(event["choices"][0]["finish_reason"])
        assert server.proc.wait(60) == 0
        assert done and reasons[-1] == ("length" if finishes else "cancelled")
        assert (len(got) == 300) == finishes
        log = server.log()
        assert "engine stopped" in log and "INFO stopped" in log and "Traceback" not in log
    finally:
        server.proc.kill()


class FailingEngine(Engine):
    """Passes raise `fault` while it is set (a bad kernel launch, a lost device)."""

    fault: Exception | None = None

    def step(self):
        if self.fault is not None and self.scheduler.running:
            raise self.fault
        return super().step()


def test_a_failed_pass_fails_its_requests_and_the_server_goes_on(hf_tiny):
    server = start_server(make_engine(hf_tiny, FailingEngine))
    try:
        with server.client() as c:
            want = c.post(CMPL, json=PROBE).json()["choices"][0]["token_ids"]
            server.engine.fault = RuntimeError("a planted kernel failure")
            r = c.post(CMPL, json=PROBE)
            assert (
                r.status_code == 500 and "a planted kernel failure" in r.json()["error"]["message"]
            )
            # The failed lane is given back at once, not retried pass after pass while the fault lasts.
            wait_for(lambda: not server.engine.has_work(), "the engine to go idle")
            assert server.engine.scheduler.busy_lanes == 0
            server.engine.fault = None
            assert c.post(CMPL, json=PROBE).json()["choices"][0]["token_ids"] == want
            assert c.get("/health").status_code == 200
    finally:
        server.stop()


def test_a_device_fault_stops_the_engine_and_refuses_new_work(hf_tiny):
    server = start_server(make_engine(hf_tiny, FailingEngine))
    try:
        with server.client() as c:
            server.engine.fault = RuntimeError(
                "CUDA error: an illegal memory access was encountered"
            )
            assert c.post(CMPL, json=PROBE).status_code == 500
            wait_for(lambda: c.get("/health").status_code == 503, "the engine to stop")
            assert "illegal memory access" in c.get("/health").json()["fault"]
            r = c.post(CHAT, json={"messages": MSG, "max_tokens": 2})
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_stopped"
    finally:
        server.stop()


def test_a_reply_that_sets_no_limit_ends_at_the_servers(hf_tiny, tmp_path):
    """`--max-tokens`: a request without max_tokens stops there (finish_reason length), one that
    sets its own keeps it; the default comes from generation_config's max_new_tokens, else 8192
    (a JSON-mode reply that never closes no longer runs to the end of --context)."""
    import json

    from tensorfold.server.cli import DEFAULT_MAX_TOKENS, reply_limit

    server = start_server(make_engine(hf_tiny, max_tokens=5))
    try:
        with server.client() as http:
            free = {"prompt": "Once upon a time", "temperature": 0, "ignore_eos": True}
            short = http.post(CMPL, json=free).json()
            own = http.post(CMPL, json={**free, "max_tokens": 9}).json()
    finally:
        server.stop()
    assert short["choices"][0]["finish_reason"] == "length"
    assert short["usage"]["completion_tokens"] == 5 and own["usage"]["completion_tokens"] == 9
    from tensorfold.server.serving import SamplingDefaults

    def limit(flag):
        return reply_limit(flag, SamplingDefaults.from_checkpoint(tmp_path))

    assert limit(None) == DEFAULT_MAX_TOKENS == 8192
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": 123}))
    assert limit(None) == 123 and limit(0) == 0
