"""engine/scheduler.py without a model: admission (lanes, slots, pages), the whole capacity
reserved at admission, prompt-cache cuts, and the rows of each pass."""

import torch

from tensorfold.cache import KVPool, StatePool
from tensorfold.cache.prefix_cache import PrefixCache
from tensorfold.engine.passes import logit_rows
from tensorfold.engine.request import Lane, Request, SamplingParams, Status, Watch
from tensorfold.engine.scheduler import Scheduler, SchedulerConfig

PAGE = 4
CPU = torch.device("cpu")


def scheduler(parallel=2, slots=None, pages=64, cache_bytes=0, **config) -> Scheduler:
    kv = KVPool(1, pages, PAGE, 1, 2, torch.float32, CPU)
    states = StatePool(1, slots or parallel, 3, 2, 1, 2, 2, torch.float32, CPU)
    cfg = SchedulerConfig(parallel=parallel, **({"context": 256, "chunk": 8} | config))
    return Scheduler(cfg, kv, states, PrefixCache(kv, cache_bytes))


def request(n: int, max_tokens: int = 4, name: str = "r", cuts: tuple[int, ...] = ()) -> Request:
    watch = Watch(cuts=cuts) if cuts else None
    params = SamplingParams(max_tokens=max_tokens, seed=0)
    return Request(name, list(range(1, n + 1)), params, watch=watch, lane=Lane(cuts=cuts))


def queue(s: Scheduler, *reqs: Request) -> list[Request]:
    s.waiting.extend(reqs)
    return list(reqs)


def run_pass(s: Scheduler) -> list[tuple[str, int]]:
    """One pass as the engine runs it: rows computed, a token appended where one is due."""
    work = s.schedule()
    for w in work:
        w.request.lane.computed += w.rows
        if w.request.lane.computed == w.request.num_tokens:
            w.request.output_ids.append(0)
    return [(w.request.request_id, w.rows) for w in work]


def test_lanes_are_limited_by_parallel():
    s = scheduler(parallel=2, slots=4)
    reqs = queue(s, *(request(5, name=f"r{i}") for i in range(4)))
    s.admit()
    assert s.running == reqs[:2] and list(s.waiting) == reqs[2:]
    assert [r.status for r in reqs] == [Status.RUNNING] * 2 + [Status.WAITING] * 2


def test_lanes_are_limited_by_free_state_slots():
    s = scheduler(parallel=4, slots=2)
    queue(s, *(request(5, name=f"r{i}") for i in range(3)))
    s.admit()
    assert len(s.running) == 2 and s.states.free_slots == 0


def test_a_lane_reserves_pages_for_its_whole_capacity():
    s = scheduler()
    (req,) = queue(s, request(10, max_tokens=7))
    s.admit()
    assert len(req.lane.pages) == s.kv.pages_for(17) == 5
    assert s.kv.free_pages == 64 - 5 and req.lane.slot >= 0
    rows = req.lane.kv_rows.tolist()
    assert len(rows) == req.capacity == 17
    assert rows == [req.lane.pages[p // PAGE] * PAGE + p % PAGE for p in range(17)]


def test_a_request_waits_while_pages_are_short_and_order_is_kept():
    s = scheduler(parallel=4, pages=6)
    big, mid, small = queue(s, request(16, 4, "big"), request(6, 2, "mid"), request(2, 2, "small"))
    s.admit()
    # 5 of 6 pages taken: mid (2 pages) waits, and small (1 page) does not overtake it
    assert s.running == [big] and list(s.waiting) == [mid, small]
    s.finish(big)
    assert s.kv.free_pages == 6 and s.states.free_slots == 4 and big.lane.pages == []
    s.admit()
    assert s.running == [mid, small]


def test_admission_evicts_prompt_cache_entries_for_pages():
    s = scheduler(pages=6, cache_bytes=1 << 20)
    held = s.kv.allocate(3)
    s.cache.insert(list(range(12)), held, s.states.snapshot(0))
    s.kv.release(held)  # only the cache holds them now
    (req,) = queue(s, request(16, 4))
    s.admit()
    assert s.running == [req] and len(s.cache) == 0 and s.cache.stats.evictions == 1


def test_finish_drops_a_waiting_request():
    s = scheduler(parallel=1)
    first, second = queue(s, request(5, name="a"), request(5, name="b"))
    s.admit()
    s.finish(second)
    assert second.status == Status.FINISHED and not s.waiting and s.running == [first]


def test_cache_cuts_every_cache_every_rows_the_last_page_and_the_end():
    s = scheduler(cache_bytes=1 << 20, cache_every=16)
    (req,) = queue(s, request(50))
    s.admit()
    assert req.lane.cache_cuts == {16, 32, 48, 50}
    assert s._cache_cuts(request(49)) == {16, 32, 48, 49}
    assert s._cache_cuts(request(47)) == {16, 32, 44, 47}  # the last page boundary: 44
    resumed = request(50)
    resumed.lane.computed = 32
    assert s._cache_cuts(resumed) == {48, 50}  # only those still ahead


def test_no_cache_no_cache_cuts():
    s = scheduler(cache_bytes=0)
    (req,) = queue(s, request(50, cuts=(20,)))
    s.admit()
    assert req.lane.cache_cuts == frozenset() and req.lane.cuts == (20,)


def test_prompt_chunks_end_at_every_cut():
    s = scheduler(parallel=1, chunk=8, cache_bytes=1 << 20, cache_every=16)
    (req,) = queue(s, request(30, cuts=(5,)))
    s.admit()
    assert req.lane.cuts == (5, 16, 28, 30)
    ends = []
    while req.in_prompt:
        run_pass(s)
        ends.append(req.lane.computed)
    assert ends == [5, 13, 16, 24, 28, 30]


def test_chunk_and_token_budget_are_respected_and_decode_rows_come_first():
    s = scheduler(parallel=3, chunk=8, token_budget=10)
    decoding, long_a, long_b = queue(
        s, request(3, 8, "dec"), request(40, name="a"), request(40, name="b")
    )
    s.admit()
    assert run_pass(s) == [("dec", 3), ("a", 7)]  # the budget of 10 runs out
    assert run_pass(s) == [("dec", 1), ("a", 8), ("b", 1)]  # decode rows first, oldest next
    for _ in range(12):
        rows = run_pass(s)
        assert rows[0] == ("dec", 1)
        assert sum(n for _, n in rows) <= 10 and all(n <= 8 for _, n in rows)
    assert not long_a.in_prompt and not long_b.in_prompt
    assert run_pass(s) == [("dec", 1), ("a", 1), ("b", 1)]  # three lanes decoding


def test_a_resumed_lane_shares_whole_pages_and_copies_the_partial_one():
    s = scheduler(cache_bytes=1 << 20)
    prompt = list(range(1, 21))
    cached = s.kv.allocate(3)
    s.kv.k[0][cached[2] * PAGE : (cached[2] + 1) * PAGE] = 7.0  # the partial page's rows
    s.cache.insert(prompt[:10], cached, s.states.snapshot(0))  # cut 10: pages 0, 1 and half of 2
    s.kv.release(cached)
    req = Request("r", prompt, SamplingParams(max_tokens=4, seed=0))
    queue(s, req)
    s.admit()
    assert req.lane.computed == req.cached_tokens == 10
    assert req.lane.pages[:2] == cached[:2] and cached[2] not in req.lane.pages
    assert len(req.lane.pages) == s.kv.pages_for(req.capacity)
    assert torch.equal(
        s.kv.k[0][req.lane.pages[2] * PAGE : (req.lane.pages[2] + 1) * PAGE],
        torch.full((PAGE, 1, 2), 7.0),
    )
    s.cache.clear()
    s.finish(req)
    assert s.kv.free_pages == s.kv.num_pages


def test_logit_rows_the_one_rule():
    """Rows whose logits a pass needs: the one that yields the next token, the end of a watched
    cut, or every row when the watch keeps them all; cache cuts need none."""
    s = scheduler(parallel=3, cache_bytes=1 << 20, cache_every=16)
    plain, seams = request(20, name="plain"), request(20, name="seams", cuts=(6,))
    params = SamplingParams(max_tokens=4, seed=0)
    kept = Request("kept", list(range(1, 21)), params, watch=Watch(keep_logits=True))
    queue(s, plain, seams, kept)
    s.admit()
    assert 16 in plain.lane.cache_cuts and 6 in seams.lane.cuts
    assert logit_rows(plain, 6) == range(0) and logit_rows(plain, 16) == range(0)
    assert logit_rows(seams, 6) == range(5, 6) and logit_rows(seams, 5) == range(0)
    assert logit_rows(plain, 20) == range(19, 20) and logit_rows(kept, 7) == range(7)
    plain.lane.computed = 19
    assert logit_rows(plain, 1) == range(1)


def test_prompt_rows_beside_decoding_lanes_are_capped():
    """While a lane decodes, a pass takes at most mixed_chunk prompt rows in all; alone, a prompt
    takes whole chunks again."""
    s = scheduler(parallel=3, chunk=16, mixed_chunk=5, context=256)
    short, long_a, long_b = queue(
        s, request(3, max_tokens=50, name="s"), request(40, name="a"), request(40, name="b")
    )
    s.admit()
    assert run_pass(s) == [("s", 3), ("a", 16)]  # nobody decodes yet: whole chunks
    assert run_pass(s) == [("s", 1), ("a", 5)]  # "s" decodes: 5 prompt rows in all
    s.finish(short)
    assert run_pass(s) == [("a", 16), ("b", 3)]  # the budget (chunk + parallel) again
    assert long_b.lane.computed == 3


def test_scheduler_config_refuses_non_positive_sizes():
    import pytest

    for field in ("parallel", "chunk", "context", "mixed_chunk", "token_budget"):
        with pytest.raises(ValueError, match=f"{field} must be at least 1"):
            SchedulerConfig(**{field: 0})


def test_mixed_chunk_flag_refuses_negative_and_reads_zero_as_no_cap():
    import pytest

    from tensorfold.engine.flags import mixed_chunk_for

    with pytest.raises(ValueError, match="--mixed-chunk -1"):
        mixed_chunk_for(-1)
    assert mixed_chunk_for(0) is None and mixed_chunk_for(None) is None
    assert mixed_chunk_for(256) == 256
