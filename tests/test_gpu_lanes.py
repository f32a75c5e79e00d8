"""Many lanes on the GPU (skipped without CUDA), 9B shape with random weights: concurrent = solo
at 64 and 256 lanes with lanes of different lengths and sampling rules mixed, decode passes
replayed from CUDA graphs of bucketed lane counts with padding lanes, graph = eager at a padded
count, and a stream's tokens unchanged while a long prompt is read beside it in capped passes
(mixed graphs). Grammar lanes read the bundled demo's tokenizer (its 2,048 tokens are the first
of the 9B's vocabulary; the rest are never allowed under a grammar)."""

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from engine_util import finish_prints, sample_prompt  # noqa: E402
from llguidance import LLMatcher  # noqa: E402

from tensorfold.engine.constraints import Grammar  # noqa: E402
from tensorfold.engine.engine import Engine, EngineConfig  # noqa: E402
from tensorfold.engine.request import SamplingParams  # noqa: E402
from tensorfold.runner.cuda_graph import lane_buckets, piece_room  # noqa: E402
from tensorfold.tokenizer import Tokenizer  # noqa: E402
from tensorfold.util import default_checkpoint  # noqa: E402

VOCAB = 248320
GRAMMAR = Grammar(LLMatcher.grammar_from_lark('start: "{" /[a-z ]{1,12}/ "}"'))


def _engine(model, parallel: int, **kw) -> Engine:
    # every prompt in the first pass, so all lanes decode together before the first one ends
    config = {"parallel": parallel, "context": 640, "chunk": 128, "max_queue": 512}
    config |= {"token_budget": 128 * parallel, **kw}
    return Engine(model, Tokenizer(default_checkpoint(None)), EngineConfig(**config))


def _params(i: int) -> SamplingParams:
    """Lane i's rules: greedy, seeded, penalised, biased or under a grammar (which ends it when
    its reply is complete), ending after 6 to 21 tokens."""
    rules = [
        dict(temperature=0.0),
        dict(temperature=0.8, seed=i),
        dict(temperature=0.7, seed=i, top_p=0.9, presence_penalty=0.5),
        dict(temperature=0.0, repetition_penalty=1.2, logit_bias={7: 30.0}),
        dict(temperature=0.8, seed=i, grammar=GRAMMAR, ignore_eos=False),
    ]
    return SamplingParams(**{"max_tokens": 6 + i % 16, "ignore_eos": True, **rules[i % 5]})


def _jobs(n: int) -> list[tuple[list[int], SamplingParams]]:
    return [(sample_prompt(900 + i, 5 + (i * 37) % 120, VOCAB), _params(i)) for i in range(n)]


def _run(eng: Engine, jobs) -> list[tuple[list[int], str]]:
    prints = {}
    reqs = [eng.add_request(ids, p, watch=finish_prints(eng, prints)) for ids, p in jobs]
    eng.run_until_done()
    return [(r.output_ids, prints[r.request_id]) for r in reqs]


@pytest.mark.parametrize("parallel", [64, 256])
def test_many_lanes_concurrent_equals_solo_9b(nine_b, parallel):
    """Lanes end one after another, so the passes run at every lane count from `parallel` down,
    each from its bucket's graph with padding lanes; a sample of lanes equals each alone."""
    jobs = _jobs(parallel)
    eng = _engine(nine_b, parallel)
    together = _run(eng, jobs)
    buckets = lane_buckets(parallel)
    recorded = {key[0] for key in eng.runner.replays if len(key) == 2}  # decode graphs
    assert recorded <= set(buckets) and parallel in recorded and len(recorded) > 3
    for i in sorted({0, 1, 2, 3, 4, parallel // 2 + 1, parallel - 1}):  # 4: a grammar
        assert _run(_engine(nine_b, 1), [jobs[i]]) == [together[i]], f"lane {i}"


def test_overlapped_equals_sequential_9b(nine_b):
    """Pass N+1 launched before pass N's tokens are read (the GPU's default): every lane's
    streamed tokens and logprobs (every third lane asks for its top 3) equal the sequential
    engine's, through every bucket as the lanes end one after another."""
    jobs = [
        (ids, dataclasses.replace(p, logprobs=3) if i % 3 == 0 else p)
        for i, (ids, p) in enumerate(_jobs(64))
    ]
    outs = []
    for overlap in (None, False):
        eng = _engine(nine_b, 64, overlap=overlap)
        assert eng.overlap is (overlap is None)
        reqs = [eng.add_request(ids, p) for ids, p in jobs]
        events = []
        while eng.has_work():
            events += eng.step()
        streamed = {r.request_id: [] for r in reqs}
        for e in events:
            streamed[e.request_id].append((e.token_ids, e.logprobs, e.finish_reason))
        outs.append([(r.output_ids, streamed[r.request_id]) for r in reqs])
    assert outs[0] == outs[1]
    ran = [(len(ids), p.max_tokens, p.grammar is None) for (ids, _), (_, p) in zip(outs[0], jobs)]
    assert all(n == most if plain else n <= most for n, most, plain in ran)  # a grammar may end


def test_padded_graph_equals_eager_9b(nine_b):
    """13 lanes replay the 16-lane graph (3 padding lanes) and give the eager passes' bytes."""
    jobs = _jobs(13)
    graphed = _engine(nine_b, 16)
    assert _run(graphed, jobs) == _run(_engine(nine_b, 16, cuda_graphs=False), jobs)
    assert (16, 1) in graphed.runner.replays and (13, 1) not in graphed.runner.replays


def test_stream_unchanged_by_a_long_prompt_beside_it_9b(nine_b):
    """A stream decodes while a 6,000-token prompt is read beside it 256 rows a pass (mixed
    graphs: the stream's row and a 255-row prompt piece): its tokens and the prompt's equal
    each alone."""
    stream = (
        sample_prompt(31, 40, VOCAB),
        SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True),
    )
    prompt = (sample_prompt(32, 6000, VOCAB), SamplingParams(max_tokens=4, temperature=0.8, seed=2))
    alone = [
        _run(_engine(nine_b, 1, context=6100, chunk=2048), [job])[0] for job in (stream, prompt)
    ]
    eng = _engine(nine_b, 2, context=6100, chunk=2048, mixed_chunk=256, token_budget=4096)
    prints = {}
    first = eng.add_request(*stream, watch=finish_prints(eng, prints))
    while len(first.output_ids) < 5:
        eng.step()
    second = eng.add_request(*prompt, watch=finish_prints(eng, prints))
    eng.step()
    assert second.lane.computed == piece_room(256, 1)  # 255 rows: the pass's 256 fill two tiles
    eng.run_until_done()
    assert [(r.output_ids, prints[r.request_id]) for r in (first, second)] == alone
    key = (1, 1, piece_room(256, 1))
    assert eng.runner.replays.get(key, 0) > 10  # the prompt's pieces beside the stream


@pytest.mark.parametrize("form", ["recurrence", "grid"])
def test_padded_mixed_graph_equals_eager_9b(nine_b, form):
    """5 decoding lanes (the 8-lane bucket: 3 padding lanes) and a 700-token prompt read beside
    them from mixed graphs (pieces of 120 rows, so that a pass is 128 rows; the last piece of
    100 rows in the same graph, its padding rows writing a scratch row) give the eager passes'
    bytes, every lane's fingerprint included, in the per-token form and the grid form (whose
    kernel reads the piece's real rows from its bounds, set on the device)."""
    # lane 4's grammar would end it mid-prompt and move the last piece to the 4-lane bucket
    jobs = [(ids, dataclasses.replace(p, max_tokens=30)) for ids, p in _jobs(6) if not p.grammar]
    prompt = (sample_prompt(33, 700, VOCAB), SamplingParams(max_tokens=8, temperature=0.0))

    def run(**kw):
        eng = _engine(nine_b, 8, context=1024, mixed_chunk=128, gdn_form=form, **kw)
        prints = {}
        reqs = [eng.add_request(ids, p, watch=finish_prints(eng, prints)) for ids, p in jobs]
        while any(r.in_prompt or not r.output_ids for r in reqs):
            eng.step()
        reqs.append(eng.add_request(*prompt, watch=finish_prints(eng, prints)))
        eng.run_until_done()
        return [(r.output_ids, prints[r.request_id]) for r in reqs], eng

    graphed, eng = run()
    assert graphed == run(cuda_graphs=False)[0]
    # pieces of 120 rows beside the 8-lane bucket (a 128-row pass): 5, and the last 100 rows
    assert eng.runner.replays.get((8, 1, piece_room(128, 8)), 0) >= 6


def test_prompts_alone_from_graphs_equal_eager_9b(nine_b):
    """Prompts read alone from the lone pieces' graphs (16, 32, 64 and 128 rows, the rows past
    a piece's real ones padding; a 300-token prompt's first 128-row chunk too, and its last 44
    rows from the 64-row graph) give the eager engine's bytes: token ids and fingerprints,
    under every sampling rule of the lanes tests."""
    lengths = [6, 16, 17, 40, 64, 100, 128, 300]
    jobs = [(sample_prompt(500 + n, n, VOCAB), _params(i)) for i, n in enumerate(lengths)]

    def run(**kw):
        eng = _engine(nine_b, 2, lone_graphs=True, **kw)
        return [_run(eng, [job]) for job in jobs], eng  # one at a time: each prompt alone

    graphed, eng = run()
    assert graphed == run(cuda_graphs=False)[0]
    alone = {key for key in eng.runner.replays if len(key) == 3 and key[0] == 0}
    assert alone == {(0, 1, 16), (0, 1, 32), (0, 1, 64), (0, 1, 128)}
