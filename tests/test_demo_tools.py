"""The bundled demo model calls its tools and answers in JSON on its own (no grammar): through the
openai client against a live server, a request with `tools` gets a tool call, the tool's result
gets the answer, and the JSON system message gets a JSON object with the right answer."""

from __future__ import annotations

import json

import jsonschema
import pytest
from server_harness import make_engine, start_server

from tensorfold.demo import demo_checkpoint
from tensorfold.demo.agent import JSON_SYSTEM, TOOLS

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {}},
    "required": ["answer"],
    "additionalProperties": False,
}
CALLS = [
    ("Use the calculator: what is 17 × 23?", "calculator", {"expression": "17 × 23"}, "391"),
    ("Use a tool: what is the capital of France?", "capital_of", {"country": "France"}, "Paris"),
]


@pytest.fixture(scope="module")
def demo():
    server = start_server(
        make_engine(demo_checkpoint(), parallel=4, context=1024, chunk=128), name="tensorfold-demo"
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(demo):
    return demo.openai()


def ask(client, messages, thinking: bool, **kw):
    return client.chat.completions.create(
        model="tensorfold-demo",
        messages=messages,
        temperature=0,
        max_tokens=128,
        extra_body={"chat_template_kwargs": {"enable_thinking": thinking}},
        **kw,
    )


@pytest.mark.parametrize("thinking", [False, True], ids=["no-think", "think"])
@pytest.mark.parametrize("question,name,args,result", CALLS, ids=["calculator", "capital_of"])
def test_tool_call_then_answer(client, question, name, args, result, thinking):
    messages = [{"role": "user", "content": question}]
    out = ask(client, messages, thinking, tools=list(TOOLS)).choices[0]
    assert out.finish_reason == "tool_calls"
    assert not (out.message.content or "").strip()
    (call,) = out.message.tool_calls
    assert call.function.name == name
    assert json.loads(call.function.arguments) == args
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]
    follow = ask(client, messages, False, tools=list(TOOLS)).choices[0]
    assert follow.finish_reason == "stop"
    assert follow.message.content == result and not follow.message.tool_calls


JSON_QUESTIONS = [
    ("What is 17 × 23?", 391),
    ("How many days are in a leap year?", 366),
    ("What is the capital of Japan?", "Tokyo"),
    ("Reverse the word planet.", "tenalp"),
    ("Is 1900 a leap year?", "No"),
    ("What is the chemical symbol for iron?", "Fe"),
]
# With thinking every one; without, the last four (the model's JSON answers without a trace are
# its weak spot: see the demo README).
JSON_CASES = [(q, a, True) for q, a in JSON_QUESTIONS] + [
    (q, a, False) for q, a in JSON_QUESTIONS[2:]
]


@pytest.mark.parametrize("question,answer,thinking", JSON_CASES)
def test_json_system_gets_json(client, question, answer, thinking):
    messages = [{"role": "system", "content": JSON_SYSTEM}, {"role": "user", "content": question}]
    out = ask(client, messages, thinking).choices[0]
    assert out.finish_reason == "stop"
    reply = json.loads(out.message.content)
    jsonschema.validate(reply, ANSWER_SCHEMA)
    assert reply == {"answer": answer}
