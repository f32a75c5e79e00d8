"""The OpenAI-compatible API through the official openai client, against a live server."""

from __future__ import annotations

import logging

import pytest
from server_harness import make_engine, metric, solo

from tensorfold.engine.request import SamplingParams
from tensorfold.server.protocol import IGNORED

PROMPT = "The quick brown fox jumps over the lazy dog."
OTHER = "Once upon a time"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 3?"}]
IDS_OUT = {"ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def reference(hf_tiny):
    return make_engine(hf_tiny)


@pytest.fixture(scope="module")
def client(live):
    return live.openai()


def greedy(n: int, **extra) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, **extra)


def test_models_health_memory(live, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [live.name]
    assert models.data[0].model_extra["max_model_len"] == 512
    with live.client() as http:
        assert http.get("/health").json() == {"status": "ok"}
        mem = http.get("/memory").json()
    engine = live.engine
    assert mem["weights_bytes"] == engine.model.weight_bytes > 0
    assert mem["kv_pool_bytes"] == engine.caches.kv.nbytes > 0
    assert mem["state_pool_bytes"] == engine.caches.states.nbytes > 0
    assert mem["prompt_cache_bytes"] == 0 == mem["prompt_cache_budget_bytes"]
    assert mem["process_rss_bytes"] > 0
    assert mem["device"] == "cpu" and mem["device_allocated_bytes"] is None


def test_openapi_documents_metrics_as_prometheus_text(live):
    with live.client() as http:
        doc = http.get("/openapi.json").json()
        served = http.get("/metrics")
    content = doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(content) == ["text/plain"]
    assert served.headers["content-type"].startswith("text/plain")


def test_completion_matches_offline_engine(live, client, reference):
    ids = live.tokenizer.encode(PROMPT)
    want = solo(reference, ids, greedy(12, ignore_eos=True))
    out = client.completions.create(
        model=live.name, prompt=PROMPT, max_tokens=12, temperature=0, extra_body=IDS_OUT
    )
    choice = out.choices[0]
    assert choice.model_extra["token_ids"] == want
    assert choice.text == live.tokenizer.decode(want)
    assert choice.finish_reason == "length" and out.object == "text_completion"
    assert out.id.startswith("cmpl-") and out.model == live.name
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 12
    assert out.usage.total_tokens == len(ids) + 12
    assert out.usage.prompt_tokens_details.cached_tokens == 0


def test_token_id_prompts_and_batches(live, client):
    ids, other = live.tokenizer.encode(PROMPT), live.tokenizer.encode(OTHER)
    kw = dict(model=live.name, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    by_text = client.completions.create(prompt=PROMPT, **kw).choices[0].text
    assert client.completions.create(prompt=ids, **kw).choices[0].text == by_text
    alone = client.completions.create(prompt=other, **kw).choices[0].text
    batch = client.completions.create(prompt=[ids, other], **kw)
    assert [(c.index, c.text) for c in batch.choices] == [(0, by_text), (1, alone)]
    texts = client.completions.create(prompt=[PROMPT, OTHER], **kw)
    assert [c.text for c in texts.choices] == [by_text, alone]
    assert texts.usage.prompt_tokens == len(ids) + len(other)


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_with_and_without_thinking(live, client, reference, thinking):
    kwargs = {"enable_thinking": thinking}
    ids = live.tokenizer.chat(CHAT, **kwargs)
    assert live.tokenizer.decode(ids).endswith("<think>\n" if thinking else "</think>\n\n")
    with live.client() as http:
        body = {"messages": CHAT, "chat_template_kwargs": kwargs}
        assert http.post("/tokenize", json=body).json()["tokens"] == ids
    want = solo(reference, ids, greedy(10))
    out = client.chat.completions.create(
        model=live.name,
        messages=CHAT,
        max_tokens=10,
        temperature=0,
        extra_body={"chat_template_kwargs": kwargs, "return_token_ids": True},
    )
    choice = out.choices[0]
    assert choice.model_extra["token_ids"] == want
    assert choice.message.role == "assistant"
    field = "reasoning_content" if thinking else "content"  # a cut trace stays the trace
    said = choice.message.model_extra.get(field) if thinking else choice.message.content
    assert said == live.tokenizer.decode(want).strip("\n")
    assert out.usage.prompt_tokens == len(ids) and out.object == "chat.completion"


def test_developer_role_is_the_system_role(live, client):
    """The OpenAI SDK sends the system prompt as role "developer" for newer models: it is
    rendered as a system message (same prompt tokens, same reply)."""
    developer = [{**CHAT[0], "role": "developer"}, CHAT[1]]
    kw = dict(model=live.name, max_tokens=8, temperature=0, extra_body={"return_token_ids": True})
    as_system = client.chat.completions.create(messages=CHAT, **kw)
    as_developer = client.chat.completions.create(messages=developer, **kw)
    assert as_developer.usage.prompt_tokens == as_system.usage.prompt_tokens
    ids = [c.model_extra["token_ids"] for c in (as_system.choices[0], as_developer.choices[0])]
    assert ids[0] == ids[1]
    with live.client() as http:
        counted = [
            http.post("/tokenize", json={"messages": m}).json()["tokens"] for m in (CHAT, developer)
        ]
    assert counted[0] == counted[1]


def test_chat_stream_with_usage(live, client):
    kw = dict(model=live.name, messages=CHAT, max_tokens=16, temperature=0)
    whole = client.chat.completions.create(**kw)
    chunks = list(
        client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    text = "".join(d.content or "" for d in deltas)
    trace = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert text == (whole.choices[0].message.content or "")
    assert trace == whole.choices[0].message.model_extra["reasoning_content"]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert [f for f in finishes if f] == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_completion_stream_matches_whole(live, client):
    kw = dict(model=live.name, prompt=PROMPT, max_tokens=20, temperature=0.8, seed=7)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.usage is None for c in chunks)


def test_completion_logprobs(live, client):
    out = client.completions.create(
        model=live.name, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3, extra_body=IDS_OUT
    )
    lp, ids = out.choices[0].logprobs, out.choices[0].model_extra["token_ids"]
    assert lp.tokens == [live.tokenizer.token_text(t) for t in ids]
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    for value, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= 3 and value <= 0.0
        assert max(top.values()) == pytest.approx(value)  # greedy picks the most likely
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(8)]


def test_chat_logprobs_stream_and_whole(live, client):
    kw = dict(
        model=live.name,
        messages=CHAT,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body=IDS_OUT,
    )
    choice = client.chat.completions.create(**kw).choices[0]
    whole, ids = choice.logprobs.content, choice.model_extra["token_ids"]
    assert [e.token for e in whole] == [live.tokenizer.token_text(t) for t in ids]
    for entry in whole:
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
    raw = bytes(b for e in whole for b in e.bytes)  # the bytes rebuild the reply exactly
    assert raw.decode(errors="replace") == live.tokenizer.decode(ids, skip_special_tokens=False)
    streamed = [
        e
        for c in client.chat.completions.create(stream=True, **kw)
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in whole]


def test_n_choices_match_solo_streams(live, client, reference):
    ids = live.tokenizer.encode(PROMPT)
    out = client.completions.create(
        model=live.name,
        prompt=ids,
        max_tokens=10,
        temperature=1.0,
        seed=11,
        n=2,
        extra_body=IDS_OUT,
    )
    got = {c.index: c.model_extra["token_ids"] for c in out.choices}
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=11, ignore_eos=True)
    assert got == {i: solo(reference, ids, params, choice=i) for i in (0, 1)}
    assert got[0] != got[1] and out.usage.completion_tokens == 20
    chat = client.chat.completions.create(
        model=live.name, messages=CHAT, max_tokens=6, n=2, seed=3, temperature=1.0
    )
    assert [c.index for c in chat.choices] == [0, 1]


def test_stop_strings_and_stop_token_ids(live, client):
    kw = dict(model=live.name, prompt=PROMPT, temperature=0, max_tokens=24)
    full = client.completions.create(extra_body=IDS_OUT, **kw).choices[0]
    text, ids = full.text, full.model_extra["token_ids"]
    cut = next(
        i for i in range(len(text) // 3, len(text)) if text[i].isprintable() and text[i] != "\ufffd"
    )
    stop = text[cut : cut + 2]
    out = client.completions.create(
        stop=[stop, "never-seen"], extra_body={"ignore_eos": True}, **kw
    ).choices[0]
    assert out.text == text[: text.index(stop)] and out.finish_reason == "stop"
    chunks = client.completions.create(
        stop=stop, stream=True, extra_body={"ignore_eos": True}, **kw
    )
    assert "".join(c.choices[0].text for c in chunks) == out.text
    by_id = client.completions.create(
        extra_body={**IDS_OUT, "stop_token_ids": [ids[5]]}, **kw
    ).choices[0]
    assert by_id.model_extra["token_ids"] == ids[: ids.index(ids[5]) + 1]
    assert by_id.finish_reason == "stop"


def test_sampling_extensions_and_ignored_fields(live, client):
    base = dict(model=live.name, prompt=PROMPT, max_tokens=8, temperature=0.9, seed=5)
    want = client.completions.create(**base).choices[0].text
    values = ("u", {"k": "v"}, False, "auto", "k", "s")
    ignored = dict(zip(IGNORED, values))
    same = client.completions.create(**base, extra_body={"draft": False, **ignored})
    assert same.choices[0].text == want
    greedy_text = client.completions.create(**{**base, "temperature": 0}).choices[0].text
    for narrowing in ({"top_k": 1}, {"min_p": 1.0}):  # only the argmax is left
        out = client.completions.create(**base, extra_body=narrowing)
        assert out.choices[0].text == greedy_text


def test_tokenize_detokenize_round_trip(live):
    with live.client() as http:
        tokens = http.post("/tokenize", json={"prompt": PROMPT}).json()
        assert tokens["tokens"] == live.tokenizer.encode(PROMPT)
        assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 512
        back = http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()
    assert back == {"prompt": PROMPT}


def test_metrics_and_log_line(live, client, caplog):
    caplog.set_level(logging.INFO, logger="tensorfold.server")
    before = live.metrics()
    out = client.completions.create(
        model=live.name, prompt=PROMPT, max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    after = live.metrics()

    def grew(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert grew("tensorfold_requests_total", outcome="length") == 1
    assert grew("tensorfold_prompt_tokens_total") == out.usage.prompt_tokens
    assert grew("tensorfold_generation_tokens_total") == 5
    assert grew("tensorfold_time_to_first_token_seconds_count") == 1
    assert grew("tensorfold_time_per_output_token_seconds_count") == 4
    assert metric(after, "tensorfold_lanes_total") == 4
    assert metric(after, "tensorfold_prompt_cache_hits_total") == 0
    line = next(r.getMessage() for r in caplog.records if out.id in r.getMessage())
    assert f"prompt={out.usage.prompt_tokens} completion=5 cached=0 ttft=" in line
    assert "tok/s=" in line


def test_echo_and_no_op_fields(live, client):
    base = dict(model=live.name, prompt=PROMPT, max_tokens=6, temperature=0)
    plain = client.completions.create(**base).choices[0].text
    assert client.completions.create(echo=True, **base).choices[0].text == PROMPT + plain
    chunks = client.completions.create(echo=True, stream=True, **base)
    assert "".join(c.choices[0].text for c in chunks) == PROMPT + plain
    chat_kw = dict(model=live.name, messages=CHAT, max_tokens=6, temperature=0)
    want = client.chat.completions.create(**chat_kw).choices[0].message.content
    same = client.chat.completions.create(
        tool_choice="none",
        response_format={"type": "text"},
        presence_penalty=0,
        frequency_penalty=0,
        extra_body={"some_future_field": 1},
        **chat_kw,
    )
    assert same.choices[0].message.content == want


def test_batch_with_n_streams_by_index(live, client):
    kw = dict(model=live.name, prompt=[PROMPT, OTHER], max_tokens=8, n=2, temperature=1.0, seed=21)
    whole = {c.index: c.text for c in client.completions.create(**kw).choices}
    assert sorted(whole) == [0, 1, 2, 3]
    streamed = dict.fromkeys(whole, "")
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == whole
