"""Exactness over HTTP: a request's tokens do not depend on what else the server is doing, and a
client that leaves (mid-prompt, mid-decode, or waiting for a whole answer) frees its lane."""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlparse

import pytest
from server_harness import make_engine, metric, solo, sse_events, start_server, wait_for

from tensorfold.engine.request import SamplingParams
from tensorfold.util import token_sha

STORY = (
    "Once upon a time, in a land of rivers and hills, a small fox kept a ledger of every "
    "bird that crossed the valley. "
)
CANCELLED = {"outcome": "cancelled"}


@dataclass(frozen=True)
class Case:
    path: str
    body: dict
    prompt_ids: list[int]
    params: SamplingParams

    def stream_body(self) -> dict:
        return {**self.body, "stream": True, "return_token_ids": True, "ignore_eos": True}


@pytest.fixture(scope="module")
def reference(hf_tiny):
    return make_engine(hf_tiny)  # chunk 16 here, 8 on the server: chunking is free


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "overlapped"])
def live(hf_tiny, request):
    """The server with plain steps, and with overlapped ones (each pass launched before the
    tokens of the one before are read: the GPU's default, run here on the CPU)."""
    server = start_server(make_engine(hf_tiny, chunk=8, overlap=request.param))
    yield server
    server.stop()


def completion(live, prompt, max_tokens: int, **sampling) -> Case:
    ids = prompt if isinstance(prompt, list) else live.tokenizer.encode(prompt)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling)
    return Case(
        "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, **sampling}, ids, params
    )


def chat(live, text: str, max_tokens: int, **sampling) -> Case:
    messages = [{"role": "user", "content": text}]
    ids = live.tokenizer.chat(messages, enable_thinking=False)
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "chat_template_kwargs": {"enable_thinking": False},
        **sampling,
    }
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling)
    return Case("/v1/chat/completions", body, ids, params)


def stream_ids(live, case: Case, on_token: threading.Event | None = None) -> list[int]:
    ids: list[int] = []
    with live.client() as http, http.stream("POST", case.path, json=case.stream_body()) as r:
        assert r.status_code == 200, r.read()
        for event in sse_events(r):
            if event is not None and event["choices"]:
                ids += event["choices"][0].get("token_ids") or []
                if ids and on_token is not None:
                    on_token.set()
    return ids


def in_threads(calls: list[Callable[[], list[int]]]) -> Callable[[], list[list[int]]]:
    """Starts every call at once; the returned join() gives their results (or re-raises)."""
    results: list = [None] * len(calls)
    barrier = threading.Barrier(len(calls))

    def run(i: int) -> None:
        try:
            barrier.wait(30)
            results[i] = calls[i]()
        except BaseException as exc:  # handed to the test thread by join()
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()

    def join() -> list[list[int]]:
        for t in threads:
            t.join(120)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results

    return join


def test_four_concurrent_streams_equal_alone_and_serial(live, reference):
    cases = [
        completion(live, STORY, 40, temperature=0.0),
        completion(
            live, live.tokenizer.encode(STORY * 3)[:150], 32, temperature=0.8, top_p=0.9, seed=1
        ),
        chat(live, "Tell me about the fox.", 24, temperature=1.0, top_k=20, seed=2),
        completion(live, STORY * 2, 48, temperature=0.7, min_p=0.05, seed=3),
    ]
    alone = [token_sha(solo(reference, c.prompt_ids, c.params)) for c in cases]

    def passes() -> float:
        return metric(live.metrics(), "tensorfold_engine_passes")

    start = passes()
    serial = [token_sha(stream_ids(live, c)) for c in cases]
    middle = passes()
    together = [
        token_sha(ids) for ids in in_threads([lambda c=c: stream_ids(live, c) for c in cases])()
    ]
    assert serial == alone
    assert together == alone
    assert passes() - middle < middle - start  # the four really shared passes


@pytest.fixture(scope="module")
def probes(live, reference):
    cases = [
        completion(live, STORY, 200, temperature=0.0),
        chat(live, "Count the birds.", 200, temperature=0.9, seed=9),
    ]
    return cases, [token_sha(solo(reference, c.prompt_ids, c.params)) for c in cases]


def with_probes(live, probes, drop: Callable[[], None]) -> None:
    """Runs `drop` while two probes are decoding; their tokens must equal the references and
    every lane must be free afterwards."""
    cases, want = probes
    started = [threading.Event(), threading.Event()]
    join = in_threads([lambda i=i: stream_ids(live, cases[i], started[i]) for i in range(2)])
    for e in started:
        assert e.wait(60), "a probe never started"
    cancelled = metric(live.metrics(), "tensorfold_requests_total", **CANCELLED)
    drop()
    wait_for(
        lambda: metric(live.metrics(), "tensorfold_requests_total", **CANCELLED) == cancelled + 1,
        "the dropped request to be cancelled",
    )
    wait_for(
        lambda: metric(live.metrics(), "tensorfold_lanes_busy") <= 2, "the dropped lane to be freed"
    )
    assert [token_sha(ids) for ids in join()] == want
    wait_for(lambda: _idle(live.metrics()), "every lane to be free")


def _idle(text: str) -> bool:
    return metric(text, "tensorfold_lanes_busy") == metric(text, "tensorfold_queue_depth") == 0


def test_drop_mid_decode(live, probes):
    def drop() -> None:
        case = completion(live, STORY, 400, temperature=0.0)
        got = 0
        with live.client() as http, http.stream("POST", case.path, json=case.stream_body()) as r:
            for event in sse_events(r):
                got += len(event["choices"][0]["token_ids"])
                if got >= 3:
                    break  # leaving the block closes the connection

    with_probes(live, probes, drop)


def test_drop_mid_prompt(live, probes):
    generated = metric(live.metrics(), "tensorfold_generation_tokens_total")

    def drop() -> None:
        case = completion(live, live.tokenizer.encode(STORY * 8)[:440], 8, temperature=0.0)
        with live.client() as http, http.stream("POST", case.path, json=case.stream_body()) as r:
            assert r.status_code == 200
            wait_for(
                lambda: metric(live.metrics(), "tensorfold_lanes_prompt") >= 1,
                "the long prompt to be read",
            )

    with_probes(live, probes, drop)
    # only the probes' 2 x 200 tokens: the dropped request never produced one
    assert metric(live.metrics(), "tensorfold_generation_tokens_total") - generated == 400


def test_drop_while_waiting_for_a_whole_answer(live, probes):
    def drop() -> None:
        url = urlparse(live.url)
        body = json.dumps({"prompt": STORY, "max_tokens": 400, "ignore_eos": True}).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
            sock.sendall(head.encode() + body)
            wait_for(
                lambda: metric(live.metrics(), "tensorfold_lanes_busy") == 3, "the request to run"
            )

    with_probes(live, probes, drop)


def test_prompt_cache_resumes_exactly(hf_tiny, reference):
    server = start_server(make_engine(hf_tiny, prompt_cache_bytes=8 << 20))
    try:
        ids = server.tokenizer.encode(STORY * 2)[:100]
        longer = ids + server.tokenizer.encode(" The fox counted again.")
        runs = []
        with server.client() as http:
            for prompt in (ids, ids, longer):
                body = {
                    "prompt": prompt,
                    "max_tokens": 24,
                    "temperature": 0.8,
                    "seed": 4,
                    "ignore_eos": True,
                    "return_token_ids": True,
                }
                out = http.post("/v1/completions", json=body).json()
                runs.append(
                    (
                        out["choices"][0]["token_ids"],
                        out["usage"]["prompt_tokens_details"]["cached_tokens"],
                    )
                )
            assert http.get("/memory").json()["prompt_cache_bytes"] > 0
        params = SamplingParams(max_tokens=24, temperature=0.8, seed=4, ignore_eos=True)
        fresh = [solo(reference, p, params) for p in (ids, longer)]
        assert [r[0] for r in runs] == [fresh[0], fresh[0], fresh[1]]
        assert runs[0][1] == 0 and 0 < runs[1][1] < len(ids) and runs[2][1] >= runs[1][1]
        assert metric(server.metrics(), "tensorfold_prompt_cache_hits_total") == 2
    finally:
        server.stop()
