"""Penalties, logit_bias and min_tokens: the rule against a plain element-by-element reference,
the engine's tokens against that rule replayed on the raw logits, concurrent = solo."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_util import make_engine, sample_prompt

from tensorfold.engine.logits_rules import shape_logits
from tensorfold.engine.request import SamplingParams, Watch
from tensorfold.errors import InvalidRequest
from tensorfold.ops.sampling import sample_row, uniform

F = np.float32
RULES = [
    dict(presence_penalty=0.7),
    dict(frequency_penalty=1.3),
    dict(presence_penalty=-0.4, frequency_penalty=0.25),
    dict(repetition_penalty=1.8),
    dict(repetition_penalty=0.6),
    dict(logit_bias={3: 5.0, 7: -100.0, 11: 2.5, 40: 30.0}),
    dict(min_tokens=4, stop_token_ids=(5, 9)),
    dict(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2, logit_bias={1: 1.0}),
]


def reference(p: SamplingParams, prompt, output, row, eos=()) -> list[float]:
    """The rule written out one logit at a time, each step rounded to fp32 as the engine does."""
    out = []
    for t, v in enumerate(row.tolist()):
        x = F(v)
        x = F(x + F(dict(p.logit_bias).get(t, 0.0)))
        ends = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos))
        if len(output) < p.min_tokens and t in ends:
            x = F(-np.inf)
        if p.repetition_penalty != 1.0 and (t in prompt or t in output):
            rp = F(p.repetition_penalty)
            x = F(x / rp) if x > 0 else F(x * rp)
        n = output.count(t)
        if output and (p.frequency_penalty or p.presence_penalty):
            x = F(x - F(F(p.frequency_penalty) * F(n)))
            x = F(x - F(F(p.presence_penalty) * F(n > 0)))
        out.append(float(x))
    return out


@pytest.mark.parametrize("rule", RULES, ids=lambda r: "-".join(r))
def test_rule_equals_the_reference(rule):
    g = torch.Generator().manual_seed(len(str(rule)))
    params = SamplingParams(max_tokens=8, **rule)
    prompt, output = [1, 2, 3, 3, 40], [7, 7, 9, 2, 5]
    for n_out in (0, 2, 5):
        row = torch.randn(64, generator=g, dtype=torch.float32) * 4
        got = shape_logits(params, prompt, output[:n_out], row, eos_ids=(63,))
        assert got.tolist() == reference(params, prompt, output[:n_out], row, eos=(63,))


def test_rule_leaves_the_raw_row_alone_and_reads_bf16_exactly():
    row = torch.randn(32, dtype=torch.bfloat16)
    before = row.clone()
    got = shape_logits(SamplingParams(presence_penalty=1.0), [1], [2, 2], row)
    assert torch.equal(row, before) and got.dtype == torch.float32
    assert got[2] == row[2].float() - 1.0 and got[3] == row[3].float()


@pytest.fixture(scope="module")
def engine(hf_tiny):
    return make_engine(hf_tiny)


def run_alone(engine, ids, params, choice=0):
    watch = Watch(keep_logits=True)
    req = engine.add_request(ids, params, choice=choice, watch=watch)
    engine.run_until_done()
    return req, watch.logits


def rule_params(rule, temperature):
    base = dict(max_tokens=12, temperature=temperature, seed=11, ignore_eos=True)
    if "min_tokens" in rule:
        base["ignore_eos"] = False
    return SamplingParams(**base, **rule)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("rule", RULES, ids=lambda r: "-".join(r))
def test_engine_tokens_follow_the_rule(engine, rule, temperature):
    """Every token is what the reference rule picks from that position's raw logits."""
    ids = sample_prompt(3, 10, engine.model.config.vocab_size)
    params = rule_params(rule, temperature)
    req, logits = run_alone(engine, ids, params)
    start = len(ids) - 1
    for k, token in enumerate(req.output_ids):
        row = torch.tensor(
            reference(params, ids, req.output_ids[:k], logits[start + k], engine.eos_ids)
        )
        u = uniform(req.seed, len(ids) + k, 0)
        want = sample_row(row, temperature, 0, 1.0, 0.0, u)
        assert token == want, (k, token, want)


def test_penalties_change_the_tokens(engine):
    """A test that could not fail would prove nothing: the rules do move this model's tokens."""
    ids = sample_prompt(3, 10, engine.model.config.vocab_size)
    plain, _ = run_alone(engine, ids, rule_params({}, 0.0))
    for rule in RULES[:6]:
        shaped, _ = run_alone(engine, ids, rule_params(rule, 0.0))
        assert shaped.output_ids != plain.output_ids, rule


def test_min_tokens_holds_off_the_stop_token(engine):
    ids = sample_prompt(3, 10, engine.model.config.vocab_size)
    plain, _ = run_alone(engine, ids, rule_params({}, 0.0))
    stop = plain.output_ids[1]
    cut, _ = run_alone(
        engine, ids, SamplingParams(max_tokens=12, temperature=0, stop_token_ids=(stop,))
    )
    assert cut.output_ids == plain.output_ids[:2] and cut.finish_reason == "stop"
    held, _ = run_alone(
        engine,
        ids,
        SamplingParams(max_tokens=12, temperature=0, stop_token_ids=(stop,), min_tokens=5),
    )
    assert len(held.output_ids) >= 5 and stop not in held.output_ids[:5]


def test_concurrent_mix_equals_solo(engine):
    vocab = engine.model.config.vocab_size
    jobs = [
        (sample_prompt(10 + i, 6 + 3 * i, vocab), rule_params(rule, 0.8 if i % 2 else 0.0))
        for i, rule in enumerate(RULES + [{}])
    ]
    alone = [run_alone(engine, ids, p)[0].output_ids for ids, p in jobs]
    reqs = [engine.add_request(ids, p) for ids, p in jobs]
    engine.run_until_done()
    assert [r.output_ids for r in reqs] == alone


@pytest.mark.parametrize(
    "bad, param",
    [
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-3.0), "frequency_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(logit_bias={1: 101.0}), "logit_bias"),
        (dict(min_tokens=9, max_tokens=4), "min_tokens"),
    ],
)
def test_bad_values_are_named(bad, param):
    with pytest.raises(InvalidRequest) as exc:
        SamplingParams(**bad)
    assert exc.value.param == param


def test_ids_outside_the_vocabulary_are_named(engine):
    vocab = engine.model.config.vocab_size
    for params, param in (
        (SamplingParams(logit_bias={vocab: 1.0}), "logit_bias"),
        (SamplingParams(stop_token_ids=(vocab,)), "stop_token_ids"),
    ):
        with pytest.raises(InvalidRequest) as exc:
            engine.add_request([1, 2], params)
        assert exc.value.param == param


def test_rows_shaped_together_equal_each_alone():
    """The sampler shapes every lane's row in one call (`shape_rows`): each row equals its rule
    applied alone, whatever rules the other rows carry, and the raw rows stay untouched."""
    from tensorfold.engine.logits_rules import shape_rows

    g = torch.Generator().manual_seed(11)
    rules = [SamplingParams(max_tokens=8, **r) for r in RULES] + [SamplingParams(max_tokens=8)]
    prompt, output = [1, 2, 3, 3, 40], [7, 7, 9, 2, 5]
    asks = [(p, prompt[: 2 + i % 4], output[: i % 6]) for i, p in enumerate(rules * 2)]
    rows = (torch.randn(len(asks), 64, generator=g) * 4).to(torch.bfloat16)
    before = rows.clone()
    together = shape_rows(asks, rows, eos_ids=(63,))
    assert torch.equal(rows, before) and together.dtype == torch.float32
    for i, (p, pr, out) in enumerate(asks):
        alone = shape_logits(p, pr, out, rows[i], eos_ids=(63,))
        assert torch.equal(together[i], alone), f"row {i} ({p}) changed by its company"
        assert alone.tolist() == reference(p, pr, out, rows[i].float(), eos=(63,))
