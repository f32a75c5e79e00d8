"""No request can stall the others: a huge prompt, a looping template, a huge template, a memory
bomb are each sent while a probe streams; the probe never waits more than 0.5 s between chunks,
its tokens and logprobs do not change, and the hostile request gets its refusal."""

from __future__ import annotations

import time

import httpx
import pytest
from probe_util import Probe, assert_unharmed, reference
from server_harness import CONTEXT, make_engine, metric, start_server

from tensorfold.server.limits import MIB, Limits
from tensorfold.tokenizer import Tokenizer

CMPL, CHAT, TOKENIZE = "/v1/completions", "/v1/chat/completions", "/tokenize"
MSG = [{"role": "user", "content": "hi"}]
JSON = {"content-type": "application/json"}
LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
BOMB = "{{ ('a' * 2000000000) | length }}"
RECURSION = "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}"
AT_ONCE_S = 2.0  # a refusal that needs no work, with room for a loaded machine


@pytest.fixture(scope="module")
def trusted(hf_tiny):
    """A server that renders a request's own template, with a prompt cap that lets big bodies
    reach the tokenizer."""
    limits = Limits.for_context(
        CONTEXT,
        64,
        trust_request_chat_template=True,
        template_timeout_s=1.0,
        max_prompt_bytes=8 * MIB,
    )
    server = start_server(make_engine(hf_tiny), limits=limits)
    yield server
    server.stop()


def probed(server, action):
    """action() while the probe streams; the probe must come through unharmed."""
    want = reference(server.url)
    with Probe(server.url) as probe:
        result = action()
    report = probe.report()
    assert_unharmed(report, want)
    print(f"probe: {len(report.runs)} runs, max gap {report.max_gap:.3f}s")
    return result


def error_of(r: httpx.Response, status: int, param: str | None, code: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (param, code), err
    return err


def timed_post(url: str, path: str, **kwargs) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    r = httpx.post(f"{url}{path}", timeout=60, **kwargs)
    return r, time.monotonic() - start


def test_ten_megabyte_prompt_is_refused_at_once(live):
    body = b'{"prompt": "' + b"a" * (10 * MIB) + b'"}'
    before = metric(live.metrics(), "tensorfold_refusals_total", reason="prompt_too_large")

    def send():
        out = [timed_post(live.url, path, content=body, headers=JSON) for path in (CMPL, TOKENIZE)]
        chunked = iter([body[:MIB], body[MIB:]])  # no Content-Length: counted as it comes
        out.append(timed_post(live.url, CMPL, content=chunked, headers=JSON))
        return out

    for r, seconds in probed(live, send):
        error_of(r, 413, "prompt", "prompt_too_large")
        assert seconds < AT_ONCE_S
    after = metric(live.metrics(), "tensorfold_refusals_total", reason="prompt_too_large")
    assert after == before + 3


class SlowTokenizer(Tokenizer):
    """Takes `seconds` over any text with SLOW in it, as a huge prompt would."""

    seconds = 0.0

    def encode(self, text: str) -> list[int]:
        if "SLOW" in text:
            time.sleep(self.seconds)
        return super().encode(text)


def test_tokenizing_runs_off_the_event_loop_under_a_time_limit(hf_tiny):
    engine = make_engine(hf_tiny)
    engine.tokenizer = slow = SlowTokenizer(hf_tiny)
    server = start_server(engine, limits=Limits.for_context(CONTEXT, 64, prompt_timeout_s=1.5))
    try:

        def send():
            slow.seconds = 0.8  # slow, yet within the limit: served
            ok = httpx.post(
                f"{server.url}{CMPL}", json={"prompt": "SLOW", "max_tokens": 2}, timeout=60
            )
            slow.seconds = 3.0  # past the limit: 503, and the others go on
            late = timed_post(
                server.url, CHAT, json={"messages": [{"role": "user", "content": "SLOW"}]}
            )
            return ok, late

        ok, (late, seconds) = probed(server, send)
        assert ok.status_code == 200, ok.text
        error_of(late, 503, None, "prompt_timeout")
        assert late.headers["Retry-After"] == "1" and 1.5 <= seconds < 1.5 + AT_ONCE_S
    finally:
        server.stop()


def test_a_big_prompt_is_refused_by_its_token_count(trusted):
    """A quarter megabyte of text passes the (raised) byte cap: tokenized on a worker thread,
    then refused naming the field that holds it."""
    text = "The quick brown fox jumps over the lazy dog. " * (MIB // 4 // 45)

    def send():
        return (
            httpx.post(f"{trusted.url}{CMPL}", json={"prompt": text}, timeout=60),
            httpx.post(
                f"{trusted.url}{CHAT}",
                timeout=60,
                json={"messages": [{"role": "user", "content": text}]},
            ),
        )

    completion, chat = probed(trusted, send)
    error_of(completion, 400, "prompt", "context_length_exceeded")
    error_of(chat, 400, "messages", "context_length_exceeded")


def test_costly_json_is_refused_cheaply(trusted):
    """Two megabytes that pydantic would validate item by item (a million errors, or a model
    object per JSON object) are refused after the first bad item, or by counting objects."""
    bodies = [
        b'{"prompt": [' + b"1," * 600_000 + b'"a"]}',
        b'{"messages": [{"role": "user", "content": [' + b"{}," * 600_000 + b"{}]}]}",
    ]

    def send():
        return [
            timed_post(trusted.url, path, content=body, headers=JSON)
            for path, body in zip((CMPL, CHAT), bodies)
        ]

    (ids, seconds), (objects, _) = probed(trusted, send)
    error_of(ids, 400, "prompt", "invalid_type")
    error_of(objects, 413, "messages", "too_many_objects")
    assert seconds < AT_ONCE_S


def test_a_body_for_a_path_that_takes_none_is_never_parsed(live, monkeypatch):
    """A big body POSTed where no route reads one (an unknown path, a trailing slash) is
    answered (404, or the router's redirect) without being read or parsed; the prompt routes
    still parse theirs."""
    from tensorfold.server import bodyguard

    parsed, check = [], bodyguard.check_json
    spy = lambda raw, *a: parsed.append(len(raw)) or check(raw, *a)  # noqa: E731
    monkeypatch.setattr(bodyguard, "check_json", spy)
    body = b'{"input": "' + b"a" * (8 * MIB) + b'"}'

    def send():
        return [
            timed_post(live.url, path, content=body, headers=JSON)
            for path in ("/v1/embeddings", "/v1/completions/")
        ]

    (unknown, s1), (slash, s2) = probed(live, send)
    assert unknown.status_code == 404 and max(s1, s2) < AT_ONCE_S
    assert slash.status_code == 307  # the router's redirect to /v1/completions, body unread
    assert all(size < MIB for size in parsed)  # the probe's own requests only
    big = httpx.post(f"{live.url}{CMPL}", content=body, headers=JSON, timeout=60)
    assert big.status_code == 413 and max(parsed) < MIB  # a prompt route's cap, still unparsed


def test_a_request_template_is_refused_unless_the_server_trusts_them(live):
    cases = [
        (
            CHAT,
            {"messages": MSG, "chat_template": LOOP},
            "chat_template",
            "untrusted_chat_template",
        ),
        (
            TOKENIZE,
            {"messages": MSG, "chat_template": LOOP},
            "chat_template",
            "untrusted_chat_template",
        ),
        (
            CHAT,
            {"messages": MSG, "chat_template_kwargs": {"chat_template": LOOP}},
            "chat_template_kwargs",
            "invalid_value",
        ),
    ]

    def send():
        return [timed_post(live.url, path, json=body) for path, body, *_ in cases]

    for (r, seconds), (_, _, param, code) in zip(probed(live, send), cases):
        error_of(r, 400, param, code)
        assert seconds < AT_ONCE_S


def test_a_looping_template_is_stopped_at_its_time_limit(trusted):
    r, seconds = probed(
        trusted,
        lambda: timed_post(trusted.url, CHAT, json={"messages": MSG, "chat_template": LOOP}),
    )
    error_of(r, 400, "chat_template", "chat_template_timeout")
    assert 1.0 <= seconds < 1.0 + AT_ONCE_S
    # the renderer is replaced: the next template renders at once
    ok = httpx.post(
        f"{trusted.url}{TOKENIZE}",
        timeout=60,
        json={"messages": MSG, "chat_template": "{{ messages[0].content }}"},
    )
    assert ok.json()["tokens"] == trusted.tokenizer.encode("hi")


def test_template_bombs_are_refused_without_the_memory(trusted):
    def rss() -> int:
        return httpx.get(f"{trusted.url}/memory", timeout=30).json()["process_rss_bytes"]

    before = rss()
    answers = probed(
        trusted,
        lambda: [
            httpx.post(
                f"{trusted.url}{CHAT}", json={"messages": MSG, "chat_template": t}, timeout=60
            )
            for t in (BOMB, RECURSION, "{% for i in range(10**6) %}{% endfor %}")
        ],
    )
    error_of(answers[0], 400, "chat_template", "chat_template_limit")
    error_of(answers[1], 400, "chat_template", "chat_template_limit")
    error_of(answers[2], 400, "chat_template", "invalid_chat_template")
    assert rss() - before < 100 * MIB


def test_a_two_megabyte_template_is_refused_at_once(live, trusted):
    template = "{% if messages %}x{% endif %}" * (2 * MIB // 29)

    def send(server):
        return [
            timed_post(server.url, CHAT, json=body)
            for body in (
                {"messages": MSG, "chat_template": template},
                {"messages": MSG, "chat_template_kwargs": {"chat_template": template}},
            )
        ]

    (own, kwargs) = probed(trusted, lambda: send(trusted))
    error_of(own[0], 400, "chat_template", "chat_template_too_large")
    error_of(kwargs[0], 400, "chat_template_kwargs", "invalid_value")
    for r, seconds in probed(live, lambda: send(live)):  # the default cap: 413 before parsing
        error_of(r, 413, "messages", "prompt_too_large")
        assert seconds < AT_ONCE_S


def test_a_template_error_caused_by_kwargs_names_them(trusted):
    template = "{% if d is defined %}{{ 1 // d }}{% endif %}{{ messages[0].content }}"
    with trusted.client() as http:
        r = http.post(TOKENIZE, json={"messages": MSG, "chat_template": template})
        assert r.json()["tokens"] == trusted.tokenizer.encode("hi")
        r = http.post(
            CHAT,
            json={"messages": MSG, "chat_template": template, "chat_template_kwargs": {"d": 0}},
        )
        error_of(r, 400, "chat_template_kwargs", "invalid_chat_template")
        r = http.post(CHAT, json={"messages": MSG, "chat_template": "{% for %}"})
        error_of(r, 400, "chat_template", "invalid_chat_template")
