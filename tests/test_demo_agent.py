"""The demo model's tool-call and JSON training families: each sample renders exactly as the
chat template renders the same messages, and its reply parses as the server will read it."""

from __future__ import annotations

import json
import random

import pytest

from tensorfold.demo import data, demo_checkpoint
from tensorfold.demo.agent import JSON_SYSTEM, TOOLS, AgentSample, agent_sample, generate
from tensorfold.server.toolcalls import ToolCallStream
from tensorfold.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(demo_checkpoint())


def messages_of(s: AgentSample, rng_seed: int) -> tuple[list[dict], list | None]:
    if s.task.family == "json":
        return [
            {"role": "system", "content": JSON_SYSTEM},
            {"role": "user", "content": s.task.prompt},
        ], None
    msgs = [{"role": "user", "content": s.task.prompt}]
    if s.task.family == "tool_answer":
        call = s.history.split("</think>\n\n", 1)[1].split("<|im_end|>")[0]
        calls = ToolCallStream(list(TOOLS)).feed(call)[1]
        assert len(calls) == 1
        msgs += [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {
                            "name": calls[0].name,
                            "arguments": json.loads(calls[0].arguments),
                        },
                    }
                ],
            },
            {"role": "tool", "content": s.reply},
        ]
    return msgs, list(TOOLS)


def test_samples_render_as_the_template_does(tok):
    rng, seen = random.Random(7), set()
    for _ in range(60):
        thinking = rng.random() < 0.5
        s = agent_sample(rng, thinking)
        seen.add(s.task.family)
        msgs, tools = messages_of(s, 0)
        kwargs = {"enable_thinking": thinking} | ({"tools": tools} if tools else {})
        text = tok.hf.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=False, **kwargs
        )
        assert text == s.prompt_text(), s.task.family
    assert seen == {"tool_call", "tool_answer", "json"}


def test_replies_read_as_the_server_reads_them():
    rng = random.Random(3)
    for _ in range(40):
        s = agent_sample(rng, False)
        reply = s.completion_text().removesuffix("<|im_end|>")
        if s.task.family == "tool_call":
            stream = ToolCallStream(list(TOOLS))
            text, calls = stream.feed(reply)
            assert text + stream.finish() == "" and len(calls) == 1
        elif s.task.family == "json":
            assert list(json.loads(reply)) == ["answer"]


def test_off_by_default():
    plain = data.generate(0, 300)
    same = generate(0, 300, agent_rate=0.0)
    assert [(s.prompt_text(), s.completion_text()) for s in same] == [
        (s.prompt_text(), s.completion_text()) for s in plain
    ]
    mixed = generate(0, 300, agent_rate=0.2)
    assert 30 < sum(isinstance(s, AgentSample) for s in mixed) < 90
