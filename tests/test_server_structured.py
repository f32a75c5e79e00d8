"""Structured outputs (response_format json_object / json_schema, tool_choice required / named)
through the openai client against the demo model: valid by jsonschema, streamed = whole, the
mask a function of the request's own tokens (concurrent = solo), bad schemas named."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import numpy as np
import pytest
import torch
from llguidance import LLMatcher
from server_harness import make_engine, start_server

from tensorfold.demo import demo_checkpoint
from tensorfold.demo.agent import JSON_SYSTEM
from tensorfold.engine.constraints import Grammar
from tensorfold.server.structured import json_grammar, tools_grammar

Q = [{"role": "user", "content": "What is 17 × 23?"}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": [391, 392]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}
AS_SCHEMA = {"type": "json_schema", "json_schema": {"name": "a", "strict": True, "schema": SCHEMA}}
CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "parameters": {
            "type": "object",
            "properties": {
                "op": {"type": "string", "enum": ["mul", "add"]},
                "x": {"enum": [17, 23]},
            },
            "required": ["op", "x"],
        },
    },
}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"key": {"enum": [1, 2]}},
            "required": ["key"],
        },
    },
}


@pytest.fixture(scope="module")
def demo():
    server = start_server(
        make_engine(demo_checkpoint(), parallel=4, context=1024, chunk=64), name="d"
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(demo):
    return demo.openai()


def ask(client, **kw):
    kw = {"messages": Q, "temperature": 0, "max_tokens": 80} | kw
    return client.chat.completions.create(model="d", **kw)


def streamed(client, **kw):
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in ask(client, stream=True, **kw):
        for c in chunk.choices:
            content += c.delta.content or ""
            reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
            for t in c.delta.tool_calls or []:
                slot = calls.setdefault(t.index, ["", ""])
                slot[0] += (t.function.name or "") if t.function else ""
                slot[1] += (t.function.arguments or "") if t.function else ""
            finish = c.finish_reason or finish
    return content, reasoning, calls, finish


@pytest.mark.parametrize("extra", [NO_THINK, {}], ids=["no-think", "think"])
def test_json_schema_reply_is_valid(client, extra):
    out = ask(client, response_format=AS_SCHEMA, extra_body=extra)
    msg = out.choices[0].message
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(msg.content), SCHEMA)
    if extra == {}:  # the trace is free text; the grammar starts after </think>
        assert msg.model_extra["reasoning_content"].endswith("= 391.")
    content, _, _, finish = streamed(client, response_format=AS_SCHEMA, extra_body=extra)
    assert (content, finish) == (msg.content, "stop")


# the demo's own kinds of question, asked as LangChain's json_mode asks them: no word of JSON
JSON_ANSWERS = {
    "What is 17 × 23?": 391,
    "Reverse the word planet.": "tenalp",
    "What is the capital of Japan?": "Tokyo",
    "What is the capital of France?": "Paris",
    "What is 456 + 789?": 1245,
}


@pytest.mark.parametrize("extra", [NO_THINK, {}], ids=["no-think", "think"])
def test_json_object_alone_gives_the_right_answer_as_json(client, extra):
    """`response_format: json_object` and nothing else (no system message, no max_tokens): the
    reply ends, within the server's default length, as the demo's right answer in JSON."""
    for prompt, answer in JSON_ANSWERS.items():
        out = client.chat.completions.create(
            model="d",
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            response_format={"type": "json_object"},
            extra_body=extra,
        )
        assert out.choices[0].finish_reason == "stop", (prompt, out.choices[0].message)
        assert json.loads(out.choices[0].message.content) == {"answer": answer}, prompt


def test_json_object_reply_is_an_object(client):
    messages = [{"role": "system", "content": JSON_SYSTEM}, *Q]
    out = ask(client, messages=messages, response_format={"type": "json_object"})
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(out.choices[0].message.content), dict)


def test_unconstrained_reply_is_not_json(client):
    """The grammar is what makes the reply JSON: free, the demo answers in plain text."""
    free = ask(client, extra_body=NO_THINK).choices[0].message.content
    assert free == "391"  # the known answer, not an object
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(free), SCHEMA)


@pytest.mark.parametrize(
    "choice, names",
    [
        ("required", None),
        ({"type": "function", "function": {"name": "lookup"}}, ["lookup"]),
    ],
)
def test_forced_tool_calls(client, choice, names):
    out = ask(client, tools=[CALC, LOOKUP], tool_choice=choice, extra_body=NO_THINK)
    c = out.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    calls = c.message.tool_calls
    assert calls and all(t.id.startswith("call_") and t.type == "function" for t in calls)
    if names is not None:
        assert [t.function.name for t in calls] == names
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (CALC, LOOKUP)}
    for t in calls:
        jsonschema.validate(json.loads(t.function.arguments), schemas[t.function.name])
    _, _, got, finish = streamed(
        client, tools=[CALC, LOOKUP], tool_choice=choice, extra_body=NO_THINK
    )
    assert finish == "tool_calls"
    assert [tuple(got[k]) for k in sorted(got)] == [
        (t.function.name, t.function.arguments) for t in calls
    ]


def test_tool_choice_none_parses_nothing(client):
    out = ask(client, tools=[CALC], tool_choice="none", extra_body=NO_THINK)
    assert (
        out.choices[0].message.tool_calls is None and out.choices[0].finish_reason != "tool_calls"
    )


@pytest.mark.parametrize(
    "body, param",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "objectx"}},
                }
            },
            "response_format",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"properties": {"a": {"type": "nope"}}},
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
        ),
    ],
)
def test_invalid_schemas_are_named(demo, body, param):
    with demo.client() as http:
        r = http.post("/v1/chat/completions", json={"messages": Q, **body})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == "invalid_value"
    for ours in ("LEAD", "x-guidance", "%json", " | "):  # the grammar around the schema
        assert ours not in err["message"], err["message"]


def test_a_schema_that_does_not_compile_is_named_in_its_own_terms(demo):
    bad = {"type": "json_schema", "json_schema": {"schema": {"type": "objectx"}}}
    with demo.client() as http:
        r = http.post("/v1/chat/completions", json={"messages": Q, "response_format": bad})
    assert r.json()["error"]["message"] == (
        "the response_format schema does not compile: Invalid type: objectx"
    )


def test_json_object_with_a_schema_follows_it(client):
    """llama.cpp's form, `{"type": "json_object", "schema": ...}`, constrains the reply by its
    schema (it was ignored: any object passed); a schema that is no object is refused by name."""
    fmt = {"type": "json_object", "schema": SCHEMA}
    out = ask(client, response_format=fmt, extra_body=NO_THINK)
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
    assert (
        out.choices[0].message.content
        == ask(client, response_format=AS_SCHEMA, extra_body=NO_THINK).choices[0].message.content
    )
    with pytest.raises(Exception, match="response_format.schema"):
        ask(client, response_format={"type": "json_object", "schema": [1]})


def test_concurrent_mix_equals_solo(client):
    asks = [
        dict(response_format=AS_SCHEMA),
        dict(response_format=AS_SCHEMA, extra_body=NO_THINK),
        dict(response_format={"type": "json_object"}, temperature=0.9, seed=3),
        dict(tools=[CALC, LOOKUP], tool_choice="required", extra_body=NO_THINK),
        dict(tools=[CALC], extra_body=NO_THINK),
        dict(extra_body={"presence_penalty": 1.0, "min_tokens": 3}),
        dict(),
    ]

    def one(kw):
        kw = dict(kw)
        extra = {**kw.pop("extra_body", {}), "return_token_ids": True}
        out = ask(client, extra_body=extra, **kw)
        return out.choices[0].model_extra["token_ids"]

    alone = [one(kw) for kw in asks]
    with ThreadPoolExecutor(len(asks)) as pool:
        together = list(pool.map(one, asks * 2))
    assert together == alone * 2


def test_mask_depends_only_on_the_tokens_so_far(demo):
    """Asked about positions out of order (as a drafter would), the matcher gives each position
    the mask a fresh matcher gives it."""
    book = demo.engine.grammars
    for source in (json_grammar(SCHEMA), tools_grammar([CALC, LOOKUP], None, True)):
        grammar = Grammar(LLMatcher.grammar_from_lark(source))
        text = (
            '{"answer": 391, "sure": true}'
            if "answer" in source
            else (
                "<tool_call>\n<function=lookup>\n<parameter=key>\n2\n</parameter>\n</function>\n</tool_call>"
            )
        )
        ids = demo.tokenizer.encode(text)
        fresh = [book.matcher(grammar).allowed(ids[:k]) for k in range(len(ids) + 1)]
        reused = book.matcher(grammar)
        for k in [3, 0, len(ids), 1, len(ids) - 2, 2, len(ids)]:
            assert torch.equal(reused.allowed(ids[:k]), fresh[k]), k
        assert all(fresh[k][ids[k]] for k in range(len(ids)))


@pytest.mark.parametrize("extra", [NO_THINK, {}], ids=["no-think", "think"])
def test_auto_tool_calls_name_only_the_offered_tools(client, extra):
    """tool_choice auto, a question for a tool that is not offered: the demo model opens a
    `<tool_call>` of the tool it learned (capital_of); under the auto grammar (free text that
    opens no call, or calls of the offered tools) the reply is a call of an offered tool, never
    the raw block in `content` with finish_reason stop naming capital_of, as before. The free
    branch: the demo's agent turns answer a tool's result in text (tests/test_demo_agent.py)."""
    from tensorfold.demo.agent import CALCULATOR

    q = [{"role": "user", "content": "Use a tool: what is the capital of Peru?"}]
    choice = ask(client, messages=q, tools=[CALCULATOR], extra_body=extra).choices[0]
    assert "<tool_call>" not in (choice.message.content or "")
    assert choice.finish_reason == "tool_calls"
    assert [t.function.name for t in choice.message.tool_calls] == ["calculator"]


def test_packed_masks_unpack_to_the_grammars_bits_together_and_alone(demo):
    """The sampler sends each lane's mask packed (32 tokens a word) and unpacks the lanes'
    masks at once: each equals its lane's mask alone and llguidance's bitmask read bit by bit
    (the end tokens only once the grammar is done)."""
    from tensorfold.engine.constraints import unpack

    book = demo.engine.grammars
    grammar = Grammar(LLMatcher.grammar_from_lark(json_grammar(SCHEMA)))
    ids = demo.tokenizer.encode('{"answer": 391, "sure": true}')
    words, alone = [], []
    for k in range(len(ids) + 1):
        m = book.matcher(grammar)
        words.append(m.words(ids[:k]))
        alone.append(m.allowed(ids[:k]))
        bits = bytearray(m.m.compute_bitmask()) if not m.m.is_error() else bytearray()
        want = [bool(bits[t // 8] >> (t % 8) & 1) if t // 8 < len(bits) else False
                for t in range(book.vocab_size)]  # fmt: skip
        if not any(want):
            want = [t in book.eos_ids for t in range(book.vocab_size)]
        assert alone[-1].tolist() == want, k
    together = unpack(torch.from_numpy(np.stack(words)), book.vocab_size)
    assert torch.equal(together, torch.stack(alone))
    assert alone[-1].sum() >= 1 and not alone[-1][ids[0]]  # a finished object: ends only
