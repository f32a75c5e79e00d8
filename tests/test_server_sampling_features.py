"""Penalties, logit_bias, min_tokens, prompt logprobs (echo + logprobs, vLLM's prompt_logprobs)
and logprobs: 0 through the openai client; a concurrent mix of all of them equals solo."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from engine_util import position_logits
from server_harness import make_engine, solo

from tensorfold.engine.request import SamplingParams

PROMPT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def reference(hf_tiny):
    return make_engine(hf_tiny)


@pytest.fixture(scope="module")
def client(live):
    return live.openai()


def cmpl(client, live, **kw):
    kw.setdefault("max_tokens", 8)
    kw.setdefault("temperature", 0)
    extra = {"return_token_ids": True, "ignore_eos": True} | kw.pop("extra_body", {})
    return client.completions.create(model=live.name, prompt=PROMPT, extra_body=extra, **kw)


def test_echo_with_logprobs_scores_the_prompt(live, client, reference):
    ids = live.tokenizer.encode(PROMPT)
    logp = torch.log_softmax(position_logits(reference, ids).float(), -1)
    out = cmpl(client, live, echo=True, logprobs=2)
    lp = out.choices[0].logprobs
    n = len(ids)
    assert out.choices[0].text.startswith(PROMPT)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = [float(logp[p - 1, ids[p]]) for p in range(1, n)]
    assert lp.token_logprobs[1:n] == pytest.approx(want, abs=1e-6)
    # the two likeliest and the prompt's own token (OpenAI's logprobs + 1)
    assert all(len(t) <= 3 for t in lp.top_logprobs[1:n])
    assert all(lp.tokens[p] in lp.top_logprobs[p] for p in range(1, n))
    assert [lp.top_logprobs[p][lp.tokens[p]] for p in range(1, n)] == lp.token_logprobs[1:n]
    assert len(lp.tokens) == n + 8 and lp.text_offset[0] == 0
    assert "".join(lp.tokens[:n]) == PROMPT
    streamed = list(cmpl(client, live, echo=True, logprobs=2, stream=True))
    text = "".join(c.choices[0].text for c in streamed)
    tokens = [t for c in streamed if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert text == out.choices[0].text and tokens == lp.tokens


def test_vllm_prompt_logprobs(live, client, reference):
    ids = live.tokenizer.encode(PROMPT)
    logp = torch.log_softmax(position_logits(reference, ids).float(), -1)
    out = cmpl(client, live, extra_body={"prompt_logprobs": 1})
    got = out.choices[0].model_extra["prompt_logprobs"]
    assert got[0] is None and len(got) == len(ids)
    for p in range(1, len(ids)):
        entry = got[p][str(ids[p])]
        assert entry["logprob"] == pytest.approx(float(logp[p - 1, ids[p]]), abs=1e-6)
        assert entry["rank"] == int((logp[p - 1] > logp[p - 1, ids[p]]).sum()) + 1
    chat = client.chat.completions.create(
        model=live.name,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        extra_body={"prompt_logprobs": 0},
    )
    assert chat.model_extra["prompt_logprobs"][0] is None


def test_logprobs_zero_gives_the_chosen_token(live, client):
    """OpenAI's legacy contract: up to logprobs + 1 entries, the sampled token always among them
    (`logprobs: 0` gave `{}` before)."""
    out = cmpl(client, live, logprobs=0)
    lp = out.choices[0].logprobs
    assert len(lp.token_logprobs) == 8 and all(math.isfinite(x) for x in lp.token_logprobs)
    assert lp.top_logprobs == [{t: v} for t, v in zip(lp.tokens, lp.token_logprobs)]


RULES = [
    {"presence_penalty": 1.5},
    {"frequency_penalty": 1.0, "presence_penalty": -0.5},
    {"repetition_penalty": 1.7},
    {"logit_bias": {"40": 30}},
    {"min_tokens": 6, "stop_token_ids": [0]},
]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: "-".join(r))
def test_rules_over_http_equal_the_engine(live, client, reference, rule):
    ids = live.tokenizer.encode(PROMPT)
    engine_rule = {k: v for k, v in rule.items()}
    if "logit_bias" in rule:
        engine_rule["logit_bias"] = {int(k): float(v) for k, v in rule["logit_bias"].items()}
    if "stop_token_ids" in rule:
        engine_rule["stop_token_ids"] = tuple(rule["stop_token_ids"])
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, **engine_rule)
    want = solo(reference, ids, params)
    fields = {
        k: rule[k] for k in ("presence_penalty", "frequency_penalty", "logit_bias") if k in rule
    }
    extra = {k: v for k, v in rule.items() if k not in fields}
    got = cmpl(client, live, extra_body=extra, **fields).choices[0].model_extra["token_ids"]
    assert got == want
    plain = cmpl(client, live).choices[0].model_extra["token_ids"]
    if "min_tokens" not in rule:
        assert got != plain  # the rule moved this model's tokens: the test can fail


def test_concurrent_mix_equals_solo(live, client):
    """Penalties, bias, min_tokens, prompt logprobs, echo, sampled and greedy, all at once."""
    asks = [dict(extra_body=r) for r in RULES[2:]] + [
        dict(presence_penalty=1.5),
        dict(frequency_penalty=1.0, temperature=0.9, seed=4),
        dict(logit_bias={"40": 30}, temperature=0.8, seed=2),
        dict(echo=True, logprobs=3),
        dict(extra_body={"prompt_logprobs": 2}, temperature=1.0, seed=9, n=2),
        dict(),
    ]

    def one(kw):
        out = cmpl(client, live, **kw)
        return [(c.text, c.model_extra["token_ids"]) for c in out.choices]

    alone = [one(kw) for kw in asks]
    with ThreadPoolExecutor(len(asks)) as pool:
        together = list(pool.map(one, asks * 2))
    assert together == alone * 2
