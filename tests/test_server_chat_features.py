"""Reasoning split and tool calls through the openai client, against the demo model (whose
template is Qwen3.5's: think blocks and <tool_call> blocks)."""

from __future__ import annotations

import json

import pytest
from server_harness import make_engine, start_server

from tensorfold.demo import demo_checkpoint
from tensorfold.engine.reasoning import ReasoningSplitter, split_reasoning
from tensorfold.server.toolcalls import ToolCallStream

Q = [{"role": "user", "content": "What is 17 × 23?"}]
TRACE = "17 × 23 = 17 × 20 + 17 × 3 = 340 + 51 = 391."
CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expr": {"type": "string"}, "digits": {"type": "integer"}},
            "required": ["expr"],
        },
    },
}
CALL = (
    "<tool_call>\n<function=calc>\n<parameter=expr>\n17*23\n</parameter>\n</function>\n</tool_call>"
)


@pytest.fixture(scope="module")
def demo():
    engine = make_engine(
        demo_checkpoint(), parallel=4, context=1024, chunk=64, prompt_cache_bytes=16 << 20
    )
    server = start_server(engine, name="tensorfold-demo")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(demo):
    return demo.openai()


def ask(client, **kw):
    return client.chat.completions.create(
        model="tensorfold-demo", messages=kw.pop("messages", Q), temperature=0, **kw
    )


def streamed(client, **kw):
    """(reasoning, content, tool calls by index, finish_reason) accumulated from a stream."""
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in ask(client, stream=True, **kw):
        for c in chunk.choices:
            d = c.delta
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            content += d.content or ""
            for t in d.tool_calls or []:
                slot = calls.setdefault(t.index, {"id": None, "name": None, "arguments": ""})
                slot["id"] = t.id or slot["id"]
                slot["name"] = (t.function.name if t.function else None) or slot["name"]
                slot["arguments"] += (t.function.arguments if t.function else "") or ""
            finish = c.finish_reason or finish
    return reasoning, content, calls, finish


def test_thinking_reply_is_split(client):
    out = ask(client, max_tokens=96)
    msg = out.choices[0].message
    assert msg.content == "391"
    assert msg.model_extra["reasoning_content"] == TRACE == msg.model_extra["reasoning"]
    assert out.choices[0].finish_reason == "stop"
    assert streamed(client, max_tokens=96) == (TRACE, "391", {}, "stop")


def test_trace_cut_by_max_tokens_stays_reasoning(client):
    out = ask(client, max_tokens=8)
    msg = out.choices[0].message
    assert msg.content is None and out.choices[0].finish_reason == "length"
    assert TRACE.startswith(msg.model_extra["reasoning_content"]) and msg.model_extra["reasoning"]
    reasoning, content, _, finish = streamed(client, max_tokens=8)
    assert (reasoning, content, finish) == (msg.model_extra["reasoning_content"], "", "length")


def test_thinking_off_and_include_reasoning_false(client):
    off = ask(
        client, max_tokens=32, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert off.choices[0].message.content == "391"
    assert "reasoning_content" not in (off.choices[0].message.model_extra or {})
    hidden = ask(client, max_tokens=96, extra_body={"include_reasoning": False})
    assert hidden.choices[0].message.content == "391"
    assert "reasoning_content" not in (hidden.choices[0].message.model_extra or {})


def test_completions_text_unchanged(client, demo):
    prompt = demo.tokenizer.decode(demo.tokenizer.chat(Q), skip_special_tokens=False)
    out = client.completions.create(
        model="tensorfold-demo", prompt=prompt, max_tokens=96, temperature=0
    )
    assert out.choices[0].text == TRACE + "\n</think>\n\n391"


def test_second_turn_with_the_trace_resumes_from_the_cache(client):
    first = ask(client, max_tokens=96)
    msg = first.choices[0].message
    history = Q + [
        {
            "role": "assistant",
            "content": msg.content,
            "reasoning_content": msg.model_extra["reasoning_content"],
        },
        {"role": "user", "content": "What is the capital of France?"},
    ]
    second = ask(client, messages=history, max_tokens=64)
    # the whole first exchange re-renders token for token; the cache holds its end
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens + 16


def test_splitter_any_chunking():
    text = f"{TRACE}\n</think>\n\n391"
    for size in range(1, 9):
        s, got = ReasoningSplitter(True), ("", "")
        for i in range(0, len(text), size):
            r, c = s.feed(text[i : i + size])
            got = (got[0] + r, got[1] + c)
        r, c = s.finish()
        assert (got[0] + r, got[1] + c) == (TRACE, "391")
    assert split_reasoning("391", False) == (None, "391")
    assert split_reasoning("<think>\nab\n</think>\n\nxy", False) == ("ab", "xy")


def test_tool_call_text_parses_in_any_chunking():
    two = CALL + "\n" + CALL.replace("17*23", "2+3")
    for size in (1, 2, 5, 13, len(two)):
        s, shown, calls = ToolCallStream([CALC]), "", []
        for i in range(0, len(two), size):
            t, c = s.feed(two[i : i + size])
            shown, calls = shown + t, calls + c
        shown += s.finish()
        assert shown == ""
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [
            ("calc", {"expr": "17*23"}),
            ("calc", {"expr": "2+3"}),
        ]
    one = ToolCallStream([CALC], parallel=False)
    assert len(one.feed(two)[1]) == 1


@pytest.mark.parametrize(
    "bad",
    [
        CALL.replace("calc", "nope"),  # a function the request did not offer
        CALL.replace("</parameter>", ""),  # a parameter left open
        CALL[:-5],  # the block never closes
    ],
)
def test_malformed_tool_call_is_text(bad):
    s = ToolCallStream([CALC])
    text, calls = s.feed("ok " + bad)
    assert calls == [] and text + s.finish() == "ok " + bad


def test_tool_role_history_renders_with_the_template(client, demo):
    history = [
        {"role": "user", "content": "What is 17 × 23?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calc", "arguments": '{"expr": "17*23"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "391"},
    ]
    with demo.client() as http:
        ids = http.post("/tokenize", json={"messages": history, "tools": [CALC]}).json()["tokens"]
    text = demo.tokenizer.decode(ids, skip_special_tokens=False)
    assert (
        CALL in text
        and "<tool_response>\n391\n</tool_response>" in text
        and '"name": "calc"' in text
    )
    out = ask(client, messages=history, tools=[CALC], max_tokens=48)
    assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
