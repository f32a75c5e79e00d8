"""CUDA graphs' lane-count buckets: which bucket a pass replays, and that its padding lanes change
no bit of the real lanes (checked here on eager passes, which run the same per-lane arithmetic;
tests/test_gpu_lanes.py replays the padded graphs on the card)."""

import pytest
import torch
from engine_util import finish_prints, make_engine, sample_prompt

from tensorfold.engine.request import SamplingParams
from tensorfold.runner.cuda_graph import bucket, lane_buckets
from tensorfold.runner.plan import PassPlan, padded


def test_buckets_cover_every_lane_count_up_to_parallel():
    assert lane_buckets(1) == (1,)
    assert lane_buckets(4) == (1, 2, 4)
    assert lane_buckets(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert lane_buckets(20) == (1, 2, 4, 8, 16, 20)
    b = lane_buckets(256)
    assert len(b) == 35 and b[-1] == 256
    for n in range(1, 257):
        chosen = bucket(n, b)
        assert chosen in b and chosen >= n and chosen - n < 8
    assert bucket(300, b) == 300  # past the largest (drafting's forks): its own count
    assert bucket(3, ()) == 3


def test_padding_needs_room():
    with pytest.raises(ValueError, match="cannot pad a pass of 2 lanes to 1"):
        padded(PassPlan((object(), object())), 1, object())


def _run(engine, prompts, params):
    prints = {}
    reqs = [
        engine.add_request(p, q, watch=finish_prints(engine, prints))
        for p, q in zip(prompts, params)
    ]
    engine.run_until_done()
    return [(r.output_ids, prints[r.request_id]) for r in reqs]


def _pad_every_pass(engine, lanes: int) -> None:
    """Every pass of `engine` runs with padding lanes up to `lanes` lanes; their logits are
    dropped, as a padded graph's are."""
    runner = engine.runner
    execute = runner.execute

    def padded_execute(plan):
        out = execute(padded(plan, lanes, runner.pad_lane(1)))
        return {i: v for i, v in out.items() if i < len(plan)}

    runner.execute = padded_execute


def test_padding_lanes_change_no_bits(hf_tiny_b):
    """Three lanes of different lengths, greedy and seeded with penalties, ending at different
    steps: with five padding lanes in every pass (prompt and decode) the tokens and end-of-reply
    fingerprints (states, KV rows, last logits) are byte-equal to the unpadded run's."""
    prompts = [sample_prompt(40 + i, 9 + 23 * i, 300) for i in range(3)]
    params = [
        SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=7, temperature=0.9, seed=5, ignore_eos=True),
        SamplingParams(
            max_tokens=10, temperature=0.7, seed=9, presence_penalty=0.5, ignore_eos=True
        ),
    ]
    plain = _run(make_engine(hf_tiny_b, parallel=4, chunk=16), prompts, params)
    eng = make_engine(hf_tiny_b, parallel=4, chunk=16)
    eng.runner.pad_lanes((8,))  # the fourth slot and a free page become the scratch
    _pad_every_pass(eng, 8)
    assert _run(eng, prompts, params) == plain
    slot = eng.runner.pad[0]
    written = eng.caches.states.recurrent[0][slot]
    assert torch.count_nonzero(written) > 0, "the padding lanes never ran"
