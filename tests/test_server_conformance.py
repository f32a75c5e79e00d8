"""What other servers' suites expect of an OpenAI server, adapted: CORS, vLLM-named metrics,
continuous usage chunks, /tokenize's token strings, refusals by name (never a silent 200)."""

from __future__ import annotations

import httpx
import pytest
from server_harness import make_engine, metric, start_server

MSG = [{"role": "user", "content": "2 + 3?"}]


@pytest.fixture(scope="module")
def cors(hf_tiny):
    server = start_server(
        make_engine(hf_tiny, prompt_cache_bytes=4 << 20),
        api_key="k",
        allowed_origins=("http://app.example",),
        web=False,
    )
    yield server
    server.stop()


def test_cors_preflight_and_replies(cors):
    pre = httpx.options(
        f"{cors.url}/v1/chat/completions",
        headers={
            "Origin": "http://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    assert pre.status_code == 200
    assert pre.headers["access-control-allow-origin"] == "http://app.example"
    assert "POST" in pre.headers["access-control-allow-methods"]
    r = httpx.get(
        f"{cors.url}/v1/models",
        headers={"Origin": "http://app.example", "Authorization": "Bearer k"},
    )
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example"
    other = httpx.options(
        f"{cors.url}/v1/models",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "GET"},
    )
    assert "access-control-allow-origin" not in other.headers


def test_cors_is_off_by_default(live):
    r = httpx.get(f"{live.url}/v1/models", headers={"Origin": "http://app.example"})
    assert "access-control-allow-origin" not in r.headers
    pre = httpx.options(
        f"{live.url}/v1/models",
        headers={"Origin": "http://app.example", "Access-Control-Request-Method": "GET"},
    )
    assert "access-control-allow-origin" not in pre.headers


def test_vllm_named_metrics(cors):
    client = cors.openai(api_key="k")
    before = cors.metrics()
    for _ in range(2):  # the second resumes from the prompt cache
        client.chat.completions.create(model=cors.name, messages=MSG, max_tokens=4, temperature=0)
    after = cors.metrics()

    def grew(name: str) -> float:
        return metric(after, name) - metric(before, name)

    assert grew("tensorfold_request_prompt_tokens_count") == 2
    assert grew("tensorfold_request_generation_tokens_sum") == 8
    assert grew("tensorfold_request_queue_time_seconds_count") == 2
    assert grew("tensorfold_e2e_request_latency_seconds_count") == 2
    queried, hit = (
        grew("tensorfold_prefix_cache_queries_total"),
        grew("tensorfold_prefix_cache_hits_total"),
    )
    assert queried == grew("tensorfold_prompt_tokens_total") and 0 < hit < queried
    assert 0 < metric(after, "tensorfold_kv_cache_usage_perc") <= 1  # the cache holds pages


def test_continuous_usage_stats(live):
    client = live.openai()
    chunks = list(
        client.chat.completions.create(
            model=live.name,
            messages=MSG,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True},
        )
    )
    assert all(c.usage is not None for c in chunks)  # the first (the role's) chunk too
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].usage.completion_tokens == 0
    counts = [c.usage.completion_tokens for c in chunks if c.choices and c.usage]
    assert counts == sorted(counts) and counts[-1] == 6
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_return_token_ids_also_gives_the_prompts_ids(live):
    """vLLM's shape: prompt_token_ids on each completion choice (a stream: its first chunk) and
    at the top of a chat reply (a stream: its first chunk)."""
    ids = live.tokenizer.encode("Once upon a time")
    chat_ids = live.tokenizer.chat(MSG)
    cmpl = {"prompt": "Once upon a time", "max_tokens": 3, "return_token_ids": True}
    chat = {"messages": MSG, "max_tokens": 3, "return_token_ids": True}
    with live.client() as http:
        whole = http.post("/v1/completions", json=cmpl).json()
        assert whole["choices"][0]["prompt_token_ids"] == ids
        assert http.post("/v1/chat/completions", json=chat).json()["prompt_token_ids"] == chat_ids
        assert (
            "prompt_token_ids"
            not in http.post("/v1/completions", json={**cmpl, "return_token_ids": False}).json()[
                "choices"
            ][0]
        )
        for path, body in (("/v1/completions", cmpl), ("/v1/chat/completions", chat)):
            r = http.post(path, json={**body, "stream": True})
            events = [e for e in r.text.split("\n\n") if e.startswith("data: {")]
            first, rest = events[0], events[1:]
            assert '"prompt_token_ids"' in first and not any(
                '"prompt_token_ids"' in e for e in rest
            )


def test_tokenize_token_strings(live):
    with live.client() as http:
        out = http.post(
            "/tokenize", json={"prompt": "hello world", "return_token_strs": True}
        ).json()
    assert out["token_strs"] == [live.tokenizer.token_text(t) for t in out["tokens"]]
    assert "".join(out["token_strs"]) == "hello world"


def test_tokenize_refuses_continue_final_message_as_chat_does(live):
    """It was silently ignored: the ids counted for a prompt other than the one asked for."""
    body = {"messages": [*MSG, {"role": "assistant", "content": "5"}]}
    with live.client() as http:
        for path in ("/tokenize", "/v1/chat/completions"):
            r = http.post(path, json={**body, "continue_final_message": True})
            assert r.status_code == 400, path
            err = r.json()["error"]
            assert (err["param"], err["code"]) == ("continue_final_message", "unsupported"), path
