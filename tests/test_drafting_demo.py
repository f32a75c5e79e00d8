"""Drafting on the bundled demo model and its tokenizer: n-gram drafts on replies that repeat
their prompts land and the bytes are plain's, and a verify run's text, decoded once at its
end, streams the plain engine's text and tokens."""

import pytest
from drafting_util import Script, fixed_price, staggered_run
from engine_util import finish_prints, make_engine

from tensorfold.engine.request import SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(
    max_tokens=24, temperature=0.9, top_p=0.95, top_k=50, seed=77, ignore_eos=True
)
CACHE = 1 << 24


DEMO_ASKS = (
    "Repeat this line exactly: the quick brown fox jumps over the lazy dog",
    "What is 17 × 23?",
    "Copy this line: a small red boat sails past the old stone bridge",
    "Reverse the order of the words: one two three four five",
)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_ngram_on_the_demo_model(params):
    """ngram on replies that repeat their prompts: drafts land and the bytes are plain."""
    from tensorfold.demo import demo_checkpoint

    path = demo_checkpoint("bf16")
    tok = make_engine(path, parallel=1).tokenizer
    prompts = [tok.chat([{"role": "user", "content": q}]) for q in DEMO_ASKS]
    params = SamplingParams(**{**params.__dict__, "max_tokens": 64, "ignore_eos": False})
    want, _ = staggered_run(path, prompts, params, 1)
    for parallel in (1, 4):
        eng = make_engine(path, parallel=parallel, prompt_cache_bytes=CACHE, draft="ngram")
        prints, reqs = {}, []
        for ids in prompts:
            reqs.append(eng.add_request(ids, params, watch=finish_prints(eng, prints)))
            eng.step()
        eng.run_until_done()
        assert [(r.output_ids, prints[r.request_id]) for r in reqs] == want
        assert eng.drafting.stats.accepted > 0


def _streamed(eng, prompts, params) -> list[list[tuple[list[int], str]]]:
    """Each request's events as a client is streamed them: (token ids, text)."""
    reqs = [eng.add_request(ids, params) for ids in prompts]
    events = []
    while eng.has_work():
        events += eng.step()
    return [[(e.token_ids, e.text) for e in events if e.request_id == r.request_id] for r in reqs]


@pytest.mark.parametrize("ask", ["text", "logprobs", "stop"])
def test_a_verify_run_decodes_its_text_once(ask, monkeypatch):
    """A verify pass's committed tokens are decoded together at the run's last token (a
    detokenizer call a token cost the walk most of its host time): the streamed text and
    tokens are the plain engine's, the text in fewer events. With logprobs or a stop string,
    each token's event carries its own text, as plain's does. The demo's tokenizer; drafts
    of the plain replies, every fourth wrong."""
    from tensorfold.demo import demo_checkpoint

    fixed_price(monkeypatch, 1.0)  # a gate open at every chance: many verify runs
    path = demo_checkpoint("bf16")
    tok = make_engine(path, parallel=1).tokenizer
    prompts = [tok.chat([{"role": "user", "content": q}]) for q in DEMO_ASKS]
    extra = {"logprobs": {"logprobs": 1}, "stop": {"stop": ["lazy d", "stone"]}}.get(ask, {})
    params = SamplingParams(max_tokens=48, temperature=0.0, **extra)
    plain = _streamed(make_engine(path, parallel=1), prompts, params)
    replies = {
        tuple(ids): [t for token_ids, _ in p for t in token_ids] for ids, p in zip(prompts, plain)
    }
    eng = make_engine(path, parallel=1, draft="ngram")
    eng.drafting.default = Script(replies, lambda p: p % 4 == 3)
    decodes = []
    eng.output.new_text = lambda req, final, f=eng.output.new_text: (
        decodes.append(1) or f(req, final)
    )
    got = _streamed(eng, prompts, params)
    assert eng.drafting.stats.accepted > 20
    for g, p in zip(got, plain):
        assert [t for ids, _ in g for t in ids] == [t for ids, _ in p for t in ids]
        assert "".join(text for _, text in g) == "".join(text for _, text in p)
    tokens = sum(len(ids) for g in got for ids, _ in g)
    stats = eng.drafting.stats
    if ask == "text":  # once a verify run, once a token of a plain pass
        in_runs = sum(n * count for n, count in stats.lengths.items())
        assert len(decodes) == stats.verifies + tokens - in_runs < tokens // 2, stats
    else:
        assert got == plain and len(decodes) == tokens
