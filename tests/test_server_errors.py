"""Refusals: each bad request gets its status and an OpenAI error body naming the parameter, and
the server keeps serving everyone else, byte for byte; API keys. (A full queue, shutdown and
failed passes: test_server_lifecycle.py.)"""

from __future__ import annotations

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
)

CASES = [  # (id, path, body, status, param, code)
    ("malformed-json", CMPL, '{"prompt": "x",', 400, None, "invalid_json"),
    ("not-an-object", CMPL, "[1, 2]", 400, None, "invalid_json"),
    ("no-body", CMPL, "", 400, None, "invalid_json"),
    ("prompt-wrong-type", CMPL, {"prompt": 5}, 400, "prompt", "invalid_type"),
    ("bools-as-ids", CMPL, {"prompt": [True, False]}, 400, "prompt", "invalid_type"),
    (
        "max-tokens-wrong-type",
        CMPL,
        {"prompt": "x", "max_tokens": "many"},
        400,
        "max_tokens",
        "invalid_type",
    ),
    (
        "temperature-wrong-type",
        CHAT,
        {"messages": MSG, "temperature": "hot"},
        400,
        "temperature",
        "invalid_type",
    ),
    (
        "message-without-role",
        CHAT,
        {"messages": [{"content": "hi"}]},
        400,
        "messages[0].role",
        "invalid_type",
    ),
    ("messages-missing", CHAT, {"model": "tiny"}, 400, "messages", "invalid_type"),
    ("unknown-model", CMPL, {"model": "gpt-4o", "prompt": "x"}, 404, "model", "model_not_found"),
    (
        "unknown-model-chat",
        CHAT,
        {"model": "gpt-4o", "messages": MSG},
        404,
        "model",
        "model_not_found",
    ),
    ("max-tokens-zero", CMPL, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    (
        "max-completion-tokens-negative",
        CHAT,
        {"messages": MSG, "max_completion_tokens": -1},
        400,
        "max_completion_tokens",
        "invalid_value",
    ),
    (
        "past-context",
        CMPL,
        {"prompt": "x", "max_tokens": 512},
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    (
        "stream-past-context",
        CMPL,
        {"prompt": "x", "max_tokens": 512, "stream": True},
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    (
        "chat-reply-past-context",
        CHAT,
        {"messages": MSG, "max_completion_tokens": 600},
        400,
        "max_completion_tokens",
        "context_length_exceeded",
    ),
    ("prompt-past-context", CMPL, {"prompt": [65] * 600}, 400, "prompt", "context_length_exceeded"),
    (
        "chat-past-context",
        CHAT,
        {"messages": [{"role": "user", "content": "a " * 600}]},
        400,
        "messages",
        "context_length_exceeded",
    ),
    ("empty-prompt", CMPL, {"prompt": ""}, 400, "prompt", "invalid_value"),
    ("empty-id-prompt", CMPL, {"prompt": []}, 400, "prompt", "invalid_value"),
    ("empty-in-batch", CMPL, {"prompt": ["x", ""]}, 400, "prompt", "invalid_value"),
    ("empty-messages", CHAT, {"messages": []}, 400, "messages", "invalid_value"),
    ("id-past-vocab", CMPL, {"prompt": [1, 576]}, 400, "prompt", "invalid_value"),
    ("negative-id", CMPL, {"prompt": [[3], [-1]]}, 400, "prompt", "invalid_value"),
    (
        "temperature-negative",
        CMPL,
        {"prompt": "x", "temperature": -0.5},
        400,
        "temperature",
        "invalid_value",
    ),
    ("top-p-zero", CMPL, {"prompt": "x", "top_p": 0}, 400, "top_p", "invalid_value"),
    ("min-p-above-one", CHAT, {"messages": MSG, "min_p": 1.5}, 400, "min_p", "invalid_value"),
    ("n-zero", CMPL, {"prompt": "x", "n": 0}, 400, "n", "invalid_value"),
    ("logprobs-too-many", CMPL, {"prompt": "x", "logprobs": 21}, 400, "logprobs", "invalid_value"),
    (
        "top-logprobs-too-many",
        CHAT,
        {"messages": MSG, "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
        "invalid_value",
    ),
    (
        "top-logprobs-alone",
        CHAT,
        {"messages": MSG, "top_logprobs": 2},
        400,
        "top_logprobs",
        "invalid_value",
    ),
    (
        "presence-penalty-past-2",
        CMPL,
        {"prompt": "x", "presence_penalty": 2.5},
        400,
        "presence_penalty",
        "invalid_value",
    ),
    (
        "repetition-penalty-zero",
        CMPL,
        {"prompt": "x", "repetition_penalty": 0},
        400,
        "repetition_penalty",
        "invalid_value",
    ),
    (
        "logit-bias-past-vocab",
        CHAT,
        {"messages": MSG, "logit_bias": {"5000": 10}},
        400,
        "logit_bias",
        "invalid_value",
    ),
    (
        "logit-bias-not-an-id",
        CHAT,
        {"messages": MSG, "logit_bias": {"a": 10}},
        400,
        "logit_bias",
        "invalid_value",
    ),
    (
        "logit-bias-past-100",
        CMPL,
        {"prompt": "x", "logit_bias": {"5": 101}},
        400,
        "logit_bias",
        "invalid_value",
    ),
    (
        "min-tokens-past-max-tokens",
        CMPL,
        {"prompt": "x", "max_tokens": 2, "min_tokens": 3},
        400,
        "min_tokens",
        "invalid_value",
    ),
    (
        "tool-without-name",
        CHAT,
        {"messages": MSG, "tools": [{"type": "function", "function": {}}]},
        400,
        "tools[0].function.name",
        "invalid_value",
    ),
    (
        "tool-choice-unknown-function",
        CHAT,
        {
            "messages": MSG,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        400,
        "tool_choice",
        "invalid_value",
    ),
    (
        "tool-choice-required-without-tools",
        CHAT,
        {"messages": MSG, "tool_choice": "required"},
        400,
        "tool_choice",
        "invalid_value",
    ),
    (
        "stream-options-without-stream",
        CMPL,
        {"prompt": "x", "stream_options": {"include_usage": True}},
        400,
        "stream_options",
        "invalid_value",
    ),
    (
        "vllm-structured-outputs",
        CHAT,
        {"messages": MSG, "structured_outputs": {"regex": "a+"}},
        400,
        "structured_outputs",
        "unsupported",
    ),
    (
        "llama-cpp-grammar",
        CMPL,
        {"prompt": "x", "grammar": 'root ::= "a"'},
        400,
        "grammar",
        "unsupported",
    ),
    (
        "beam-search",
        CMPL,
        {"prompt": "x", "use_beam_search": True},
        400,
        "use_beam_search",
        "unsupported",
    ),
    (
        "truncate-prompt-tokens",
        CMPL,
        {"prompt": "x", "truncate_prompt_tokens": 4},
        400,
        "truncate_prompt_tokens",
        "unsupported",
    ),
    ("chat-echo", CHAT, {"messages": MSG, "echo": True}, 400, "echo", "unsupported"),
    (
        "continue-final-message",
        CHAT,
        {"messages": MSG, "continue_final_message": True},
        400,
        "continue_final_message",
        "unsupported",
    ),
    (
        "message-without-content",
        CHAT,
        {"messages": [{"role": "user"}]},
        400,
        "messages[0].content",
        "invalid_value",
    ),
    (
        "message-without-role",
        CHAT,
        {"messages": [{"content": "x"}]},
        400,
        "messages[0].role",
        "invalid_type",
    ),
    ("messages-not-a-list", CHAT, {"messages": "hi"}, 400, "messages", "invalid_type"),
    (
        "streamed-chat-prompt-logprobs",
        CHAT,
        {"messages": MSG, "prompt_logprobs": 1, "stream": True},
        400,
        "prompt_logprobs",
        "unsupported",
    ),
    (
        "prompt-logprobs-past-20",
        CMPL,
        {"prompt": "x", "prompt_logprobs": 21},
        400,
        "prompt_logprobs",
        "invalid_value",
    ),
    (
        "image-part",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages[0].content",
        "unsupported",
    ),
    (
        "reserved-template-kwarg",
        CHAT,
        {"messages": MSG, "chat_template_kwargs": {"tokenize": 1}},
        400,
        "chat_template_kwargs",
        "invalid_value",
    ),
    ("detokenize-past-vocab", "/detokenize", {"tokens": [1, 600]}, 400, "tokens", "invalid_value"),
    (
        "tokenize-unknown-model",
        "/tokenize",
        {"model": "x", "prompt": "hi"},
        404,
        "model",
        "model_not_found",
    ),
]


@pytest.fixture(scope="module")
def probe_ids(live):
    with live.client() as http:
        return http.post(CMPL, json=PROBE).json()["choices"][0]["token_ids"]


def post(http: httpx.Client, path: str, body) -> httpx.Response:
    if isinstance(body, str):
        return http.post(path, content=body, headers={"content-type": "application/json"})
    return http.post(path, json=body)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_refusal_names_the_parameter(live, probe_ids, case):
    _, path, body, status, param, code = case
    with live.client() as http:
        err = assert_error(post(http, path, body), status, param, code)
        assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
        after = http.post(CMPL, json=PROBE)
    assert after.status_code == 200 and after.json()["choices"][0]["token_ids"] == probe_ids


def test_refusals_leave_a_running_stream_untouched(live):
    body = {**PROBE, "max_tokens": 400, "stream": True}
    with live.client() as http:
        want = http.post(CMPL, json={**body, "stream": False}).json()["choices"][0]["token_ids"]
        got: list[int] = []
        with http.stream("POST", CMPL, json=body) as stream:
            events = sse_events(stream)
            got += next(events)["choices"][0]["token_ids"]
            with live.client() as other:
                for _, path, bad, status, *_ in CASES:
                    assert post(other, path, bad).status_code == status
            for event in events:
                if event is not None:
                    got += event["choices"][0]["token_ids"]
    assert got == want
    text = live.metrics()
    assert 'tensorfold_requests_total{outcome="invalid"}' in text


def test_api_key(hf_tiny):
    server = start_server(make_engine(hf_tiny), api_key="sekret")
    try:
        with server.client() as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
                r = http.post(CMPL, json=PROBE, headers=headers)
                assert_error(r, 401, None, "invalid_api_key")
            assert_error(http.post(CMPL, content="{oops", headers={}), 401, None, "invalid_api_key")
            assert http.get("/health").status_code == 200
            assert http.get("/metrics").status_code == 200
            assert http.get("/v1/models").status_code == 401
        import openai

        with pytest.raises(openai.AuthenticationError) as caught:
            server.openai(api_key="wrong").models.list()
        assert caught.value.status_code == 401
        out = server.openai(api_key="sekret").completions.create(
            model="tiny", prompt="hi", max_tokens=2
        )
        assert len(out.choices) == 1
    finally:
        server.stop()
