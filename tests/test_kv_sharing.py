"""Lanes whose whole contexts do not fit the device share the KV pages that do: the pool holds
at least one whole context, a request waits until the pages its prompt and reply can reach are
free (a running lane never waits), every reply equals the same request alone, /memory says how
many whole contexts the pool holds, and a device without room for one is refused by name."""

import pytest
import torch
from engine_util import sample_prompt

from tensorfold.cache import budget
from tensorfold.cache.sizing import SHARED, PoolPlan
from tensorfold.engine.engine import Engine, EngineConfig
from tensorfold.engine.request import SamplingParams
from tensorfold.errors import CacheTooLarge
from tensorfold.models.loader import load_model
from tensorfold.tools.run import generate_once

CONTEXT, LANES = 512, 6


@pytest.fixture(scope="module")
def model(hf_tiny):
    return load_model(hf_tiny, dtype=torch.float32)


def _room_for(monkeypatch, model, pages: int) -> None:
    """Free memory for the lanes' states and `pages` KV pages."""
    plan = PoolPlan.for_model(model, LANES, CONTEXT, 16)
    free = int((plan.state_bytes + pages * plan.page_bytes + 1) / SHARED)
    monkeypatch.setattr(budget, "free_bytes", lambda device: free)


def _engine(model) -> Engine:
    return Engine(model, None, EngineConfig(parallel=LANES, context=CONTEXT, chunk=64))


def _run(eng: Engine, asks: list[tuple[list[int], SamplingParams]]) -> tuple[list, int]:
    """Every request's token ids, and the most lanes that ran in one pass."""
    reqs = [eng.add_request(ids, params) for ids, params in asks]
    most = 0
    while eng.has_work():
        eng.step()
        most = max(most, len(eng.scheduler.running))
    return [r.output_ids for r in reqs], most


def _asks(vocab: int) -> list[tuple[list[int], SamplingParams]]:
    long = SamplingParams(max_tokens=80, temperature=0.0, ignore_eos=True)  # 480 positions
    short = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    return [(sample_prompt(1, 400, vocab), long)] + [
        (sample_prompt(2 + i, 9 + 5 * i, vocab), short) for i in range(LANES)
    ]


def test_lanes_share_the_pages_that_fit_and_reply_as_alone(model, monkeypatch):
    vocab = model.config.vocab_size
    asks = _asks(vocab)
    solo = [generate_once(_engine(model), ids, params)[0].output_ids for ids, params in asks]
    _room_for(monkeypatch, model, 40)  # one whole context (32 pages) and 8 pages
    eng = _engine(model)
    assert eng.memory().kv_contexts == 1 and eng.caches.kv.num_pages == 40
    shared, most = _run(eng, asks)
    assert shared == solo
    assert 1 < most < LANES  # the short ones ran beside the long one, not all at once
    assert eng.caches.kv.free_pages == 40  # every page back


def test_whole_contexts_that_fit_are_each_lanes_own(model, monkeypatch):
    _room_for(monkeypatch, model, 10_000)
    eng = _engine(model)
    assert eng.memory().kv_contexts >= LANES
    _, most = _run(eng, _asks(model.config.vocab_size))
    assert most == LANES


def test_no_room_for_one_context_is_refused_by_name(model, monkeypatch):
    _room_for(monkeypatch, model, 20)  # fewer pages than one context
    with pytest.raises(CacheTooLarge, match=r"--parallel 6 x --context 512"):
        _engine(model)


def test_shared_pages_beside_the_prompt_cache(model, monkeypatch):
    """The prompt cache's pages come out of the shared pool too: it keeps what room allows and
    gives it back when a lane needs the pages, and resumed requests still reply as alone."""
    asks = _asks(model.config.vocab_size)
    solo = [generate_once(_engine(model), ids, params)[0].output_ids for ids, params in asks]
    _room_for(monkeypatch, model, 56)  # one context and 24 pages, the cache's among them
    config = EngineConfig(parallel=LANES, context=CONTEXT, chunk=64, prompt_cache_bytes=1 << 20)
    eng = Engine(model, None, config)
    assert eng.memory().kv_contexts == 1
    short, long = asks[1:], asks[:1]
    assert _run(eng, short)[0] == _run(eng, short)[0] == solo[1:]
    assert eng.stats().cache_hits > 0  # the second time, from what the cache kept
    assert _run(eng, long)[0] == solo[:1]
    assert eng.stats().cache_evictions > 0  # given back for the long lane's pages


def test_a_drafters_pages_are_fitted_beside_the_lanes(hf_tiny_b, tmp_path, monkeypatch):
    """A drafter's own KV pool spans the target's pages: its weights are read first and the
    shared pages are fitted to the room left for both pools, and drafted replies still equal
    plain ones."""
    from test_drafting_mtp import with_head

    model = load_model(with_head(hf_tiny_b, tmp_path / "mtp"), dtype=torch.float32)
    asks = _asks(model.config.vocab_size)
    plain = [generate_once(_engine(model), ids, params)[0].output_ids for ids, params in asks]
    spares = PoolPlan.for_model(model, LANES, CONTEXT, 16, spares=True)
    free = int((spares.state_bytes + 100 * spares.page_bytes) / SHARED)
    monkeypatch.setattr(budget, "free_bytes", lambda device: free)
    config = EngineConfig(parallel=LANES, context=CONTEXT, chunk=64, draft="mtp")
    eng = Engine(model, None, config)
    kv, own = eng.caches.kv, eng.drafting.default.kv
    assert own.num_pages == kv.num_pages < 100  # fewer than the target's pages alone
    assert own.page_bytes > 0
    assert kv.num_pages == int(SHARED * free - spares.state_bytes) // (
        kv.page_bytes + own.page_bytes
    )
    assert kv.nbytes + own.nbytes + eng.caches.states.nbytes <= SHARED * free
    drafted, _ = _run(eng, asks)
    assert drafted == plain
    assert eng.stats().draft_proposed > 0
