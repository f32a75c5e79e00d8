"""Edge values are refused with a 400 (413 for a size) naming the field, never a 500 and never
taken silently; each refusal is counted by reason; log lines cannot be forged; a request that can
never fit the queue is told so instead of being asked to retry."""

from __future__ import annotations

import logging

import httpx
import pytest
from server_harness import CHAT, CMPL, MSG, metric
from server_harness import PROBE as GREEDY

TOKENIZE = "/tokenize"
PROBE = {**GREEDY, "logprobs": 1}
VOCAB = 576

CASES = [  # (id, path, body: dict or raw bytes, status, param, code)
    # answered 500 before
    ("lone-surrogate-prompt", CMPL, b'{"prompt": "\\ud800"}', 400, "prompt", "invalid_encoding"),
    (
        "lone-surrogate-tokenize",
        TOKENIZE,
        b'{"prompt": "a\\udfff"}',
        400,
        "prompt",
        "invalid_encoding",
    ),
    (
        "lone-surrogate-message",
        CHAT,
        b'{"messages": [{"role": "user", "content": "\\ud83d"}]}',
        400,
        "messages[0].content",
        "invalid_encoding",
    ),
    ("echo-negative-id", CMPL, {"prompt": [-1], "echo": True}, 400, "prompt", "invalid_value"),
    (
        "echo-id-past-2-32",
        CMPL,
        {"prompt": [1, 2**32], "echo": True},
        400,
        "prompt",
        "invalid_value",
    ),
    # accepted before
    (
        "temperature-infinity",
        CMPL,
        b'{"prompt": "x", "temperature": Infinity}',
        400,
        "temperature",
        "invalid_value",
    ),
    (
        "temperature-1e308",
        CMPL,
        {"prompt": "x", "temperature": 1e308},
        400,
        "temperature",
        "invalid_value",
    ),
    (
        "unknown-role",
        CHAT,
        {"messages": [{"role": "wizard", "content": "hi"}]},
        400,
        "messages[0].role",
        "invalid_value",
    ),
    ("stream-yes", CMPL, {"prompt": "x", "stream": "yes"}, 400, "stream", "invalid_type"),
    ("echo-yes", CMPL, {"prompt": "x", "echo": "yes"}, 400, "echo", "invalid_type"),
    ("stop-empty", CMPL, {"prompt": "x", "stop": [""]}, 400, "stop", "invalid_value"),
    (
        "stop-too-many",
        CMPL,
        {"prompt": "x", "stop": [f"s{i}" for i in range(17)]},
        400,
        "stop",
        "invalid_value",
    ),
    ("stop-too-long", CHAT, {"messages": MSG, "stop": "x" * 129}, 400, "stop", "invalid_value"),
    (
        "stop-token-negative",
        CMPL,
        {"prompt": "x", "stop_token_ids": [-1]},
        400,
        "stop_token_ids",
        "invalid_value",
    ),
    (
        "stop-token-past-vocab",
        CHAT,
        {"messages": MSG, "stop_token_ids": [VOCAB]},
        400,
        "stop_token_ids",
        "invalid_value",
    ),
    ("seed-past-int64", CMPL, {"prompt": "x", "seed": 2**64}, 400, "seed", "invalid_value"),
    (
        "kwargs-tools",
        CHAT,
        {
            "messages": MSG,
            "chat_template_kwargs": {"tools": [{"type": "function", "function": {"name": "f"}}]},
        },
        400,
        "chat_template_kwargs",
        "invalid_value",
    ),
    (
        "kwargs-not-plain",
        CHAT,
        {"messages": MSG, "chat_template_kwargs": {"enable_thinking": {"nested": True}}},
        400,
        "chat_template_kwargs.enable_thinking",
        "invalid_value",
    ),
    # named the wrong parameter, or none, before
    (
        "prompt-past-context-with-max-tokens",
        CMPL,
        {"prompt": [65] * 600, "max_tokens": 5},
        400,
        "prompt",
        "context_length_exceeded",
    ),
    (
        "chat-past-context-with-max-tokens",
        CHAT,
        {"messages": [{"role": "user", "content": "a " * 600}], "max_tokens": 5},
        400,
        "messages",
        "context_length_exceeded",
    ),
    ("invalid-utf8-in-a-field", CMPL, b'{"prompt": "caf\xe9"}', 400, "prompt", "invalid_encoding"),
    (
        "invalid-utf8-in-a-message",
        CHAT,
        b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}',
        400,
        "messages[0].content",
        "invalid_encoding",
    ),
    (
        "5000-digit-integer",
        CMPL,
        b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
        400,
        "max_tokens",
        "invalid_encoding",
    ),
    (
        "5000-digit-token-id",
        CMPL,
        b'{"prompt": [1, ' + b"9" * 5000 + b"]}",
        400,
        "prompt[1]",
        "invalid_encoding",
    ),
    # cost the event loop per item before (a million validation errors, a pydantic object each)
    (
        "a-bad-item-in-a-long-list",
        CMPL,
        {"prompt": [1] * 10000 + ["a"]},
        400,
        "prompt",
        "invalid_type",
    ),
    (
        "too-many-json-objects",
        CHAT,
        {"messages": [{"role": "user", "content": [{}] * 5000}]},
        413,
        "messages",
        "too_many_objects",
    ),
    # answered 429 with Retry-After before, though no retry could ever fit
    ("n-past-the-queue", CMPL, {"prompt": "x", "n": 100}, 400, "n", "too_many_choices"),
    ("batch-past-the-queue", CMPL, {"prompt": ["x"] * 65}, 400, "prompt", "too_many_choices"),
    # answered 500 (RecursionError) before
    (
        "json-nested-3000-deep",
        CMPL,
        b'{"prompt": "x", "metadata": ' + b"[" * 3000 + b"]" * 3000 + b"}",
        400,
        None,
        "invalid_json",
    ),
    ("n-past-its-cap", CMPL, {"prompt": "x", "n": 200}, 400, "n", "invalid_value"),
    # named the union's member ("prompt.str") before
    ("prompt-an-object", CMPL, {"prompt": {"text": "x"}}, 400, "prompt", "invalid_type"),
]


@pytest.fixture(scope="module")
def probe(live):
    with live.client() as http:
        choice = http.post(CMPL, json=PROBE).json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def send(http: httpx.Client, path: str, body) -> httpx.Response:
    if isinstance(body, bytes):
        return http.post(path, content=body, headers={"content-type": "application/json"})
    return http.post(path, json=body)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_edge_value_is_refused_naming_its_field(live, probe, case):
    _, path, body, status, param, code = case
    before = metric(live.metrics(), "tensorfold_refusals_total", reason=code)
    with live.client() as http:
        r = send(http, path, body)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert (err["param"], err["code"]) == (param, code), err
        after = http.post(CMPL, json=PROBE).json()["choices"][0]
    assert (after["token_ids"], after["logprobs"]["token_logprobs"]) == probe
    assert metric(live.metrics(), "tensorfold_refusals_total", reason=code) == before + 1


def test_the_n_refusal_names_the_limit_in_force(live):
    """n past 128 names the queue's 64 (--max-queue), the limit a client can actually reach."""
    with live.client() as http:
        r = http.post(CMPL, json={"prompt": "x", "n": 200})
    assert r.json()["error"]["message"] == "n=200 must be between 1 and 64"


def test_n_up_to_the_queue_is_served(live):
    with live.client() as http:
        r = http.post(CMPL, json={"prompt": "x", "n": 64, "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert sorted(c["index"] for c in r.json()["choices"]) == list(range(64))


def test_log_lines_cannot_be_forged(live, caplog):
    forged = {"a\nINFO forged line": 1, **{f"field{i}": i for i in range(1000)}}
    with caplog.at_level(logging.INFO, logger="tensorfold.server"), live.client() as http:
        assert http.post(CMPL, json={"prompt": "x", "max_tokens": 1, **forged}).status_code == 200
        r = http.post(CMPL, json={"model": "m\r\nERROR forged", "prompt": "x"})
        assert r.status_code == 404
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "tensorfold.server"]
    unknown = next(m for m in lines if "unknown field" in m)
    assert "'a\\nINFO forged line'" in unknown and "and 993 more" in unknown
    assert len(unknown) < 1000
    assert any("m\\r\\nERROR forged" in m for m in lines)
    for m in lines:
        assert "\n" not in m and "\r" not in m and len(m) <= 2100
