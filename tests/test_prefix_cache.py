"""cache/prefix_cache.py alone, over a tiny KV pool: lookup of the longest cached cut, insert,
least-recently-used eviction under a byte budget, and the pages' reference counts."""

import torch

from tensorfold.cache import KVPool, StatePool
from tensorfold.cache.prefix_cache import PrefixCache

PAGE = 4


def pools(pages: int = 64) -> tuple[KVPool, StatePool]:
    kv = KVPool(1, pages, PAGE, 1, 2, torch.float32, torch.device("cpu"))
    states = StatePool(1, 2, 3, 2, 1, 2, 2, torch.float32, torch.device("cpu"))
    return kv, states


def entry_bytes(kv: KVPool, states: StatePool, cut: int) -> int:
    return kv.pages_for(cut) * kv.page_bytes + states.snapshot(0).nbytes


def cache_with(budget: int = 1 << 20, pages: int = 64):
    kv, states = pools(pages)
    return PrefixCache(kv, budget), kv, states


def lane(kv: KVPool, tokens: int) -> list[int]:
    return kv.allocate(kv.pages_for(tokens))


PROMPT = list(range(100, 140))


def test_lookup_finds_the_longest_cached_cut_that_prefixes_the_prompt():
    cache, kv, states = cache_with()
    pages = lane(kv, 40)
    for cut in (8, 10, 16):
        assert cache.insert(PROMPT[:cut], pages, states.snapshot(0))
    assert cache.insert([7] * 20, pages, states.snapshot(0))  # another prompt
    assert cache.lookup(PROMPT).cut == 16
    assert cache.lookup(PROMPT[:16]).cut == 10  # at least one token is left to compute
    assert cache.lookup(PROMPT[:11]).cut == 10
    assert cache.lookup(PROMPT[:10] + [0] * 9).cut == 10
    assert cache.lookup(PROMPT[:9] + [0] * 9).cut == 8  # 10 shares the page hash, not its tail
    assert cache.lookup(PROMPT[:6] + [0] * 9) is None
    assert cache.lookup([7] * 25).cut == 20


def test_insert_shares_pages_and_refuses_duplicates_and_the_oversized():
    kv, states = pools()
    snap = states.snapshot(0)
    cache = PrefixCache(kv, entry_bytes(kv, states, 12))
    pages = lane(kv, 40)
    free = kv.free_pages
    assert cache.insert(PROMPT[:12], pages, snap)
    assert not cache.insert(PROMPT[:12], pages, snap)
    assert not cache.insert(PROMPT[:13], pages, snap)  # over the whole budget
    assert len(cache) == 1 and cache.nbytes == entry_bytes(kv, states, 12)
    assert cache.stats.inserts == 1 and cache.stats.evictions == 0
    kv.release(pages)  # the lane ends
    assert kv.free_pages == free + len(pages) - 3  # the cache holds 3 pages
    cache.clear()
    assert kv.free_pages == kv.num_pages and cache.nbytes == 0 and len(cache) == 0


def test_eviction_is_least_recently_used_within_the_byte_budget():
    kv, states = pools()
    snap = states.snapshot(0)
    size = entry_bytes(kv, states, 8)
    cache = PrefixCache(kv, 2 * size)
    pages = lane(kv, 8)
    a, b, c = [[t] * 8 for t in (1, 2, 3)]
    cache.insert(a, pages, snap)
    cache.insert(b, pages, snap)
    assert cache.lookup(a + [0]).cut == 8  # a is now the most recently used
    cache.insert(c, pages, snap)
    assert cache.nbytes <= 2 * size and cache.stats.evictions == 1
    assert cache.lookup(b + [0]) is None
    assert cache.lookup(a + [0]) is not None and cache.lookup(c + [0]) is not None


def test_make_room_for_pages_evicts_oldest_first_and_frees_their_pages():
    cache, kv, states = cache_with(pages=8)
    snap = states.snapshot(0)
    for t in (1, 2, 3):
        pages = lane(kv, 8)
        cache.insert([t] * 8, pages, snap)
        kv.release(pages)  # each lane ends; the cache keeps its pages
    assert kv.free_pages == 2
    cache.make_room(pages=4)
    assert kv.free_pages == 4 and len(cache) == 2
    assert cache.lookup([1] * 9) is None and cache.lookup([3] * 9) is not None


def test_an_entry_evicted_while_a_lane_reads_it_keeps_the_pages_until_the_lane_ends():
    cache, kv, states = cache_with()
    pages = lane(kv, 8)
    cache.insert(PROMPT[:8], pages, states.snapshot(0))
    kv.release(pages)
    entry = cache.lookup(PROMPT)
    held = kv.share(entry.pages)  # a lane resumes from it
    cache.clear()
    assert kv.free_pages == kv.num_pages - 2
    kv.release(held)
    assert kv.free_pages == kv.num_pages


def test_record_counts_hits_and_misses_and_a_disabled_cache_does_nothing():
    cache, kv, states = cache_with()
    pages = lane(kv, 8)
    cache.insert(PROMPT[:8], pages, states.snapshot(0))
    cache.record(cache.lookup(PROMPT))
    cache.record(cache.lookup([0] * 9))
    assert (cache.stats.hits, cache.stats.misses, cache.stats.hit_tokens) == (1, 1, 8)
    off = PrefixCache(kv, 0)
    assert not off.enabled and not off.insert(PROMPT[:8], pages, states.snapshot(0))
    off.record(None)
    assert off.lookup(PROMPT) is None and off.stats.misses == 0


def test_state_slots_copy_bit_for_bit_within_and_across_pools():
    """copy_slots (a verify pass's saved state and its put-back): every conv (bf16) and
    recurrent (fp32) tensor of each named slot, nothing else touched."""
    pool = StatePool(3, 4, 4, 24, 2, 8, 8, torch.bfloat16, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    for t in pool.tensors:
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    before = [t.clone() for t in pool.tensors]
    spares = pool.like(2)
    pool.copy_slots([3, 1], [0, 1], into=spares)
    for a, b in zip(spares.tensors, before):
        assert torch.equal(a[0], b[3]) and torch.equal(a[1], b[1])
    spares.copy_slot(0, 2, into=pool)
    for a, b in zip(pool.tensors, before):
        assert torch.equal(a[2], b[3])
        assert torch.equal(a[[0, 1, 3]], b[[0, 1, 3]])


def test_a_slot_of_every_layer_is_one_strided_view_and_each_layer_contiguous(monkeypatch):
    """Each kind of state is one tensor [layer, slot, ...]: the kernels get a layer's slots as a
    contiguous tensor, and copy_slots copies a kind's slot across every layer at once (two
    kinds with state at the recurrence form: 2 copies a slot, whatever the layer count)."""
    pool = StatePool(5, 4, 4, 24, 2, 8, 8, torch.bfloat16, torch.device("cpu"))
    assert all(t.is_contiguous() for t in pool.tensors) and len(pool.recurrent) == 5
    assert pool.recurrent[3].data_ptr() == pool.stacks[1][3].data_ptr()
    sizes = []
    real = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda a, b: sizes.append(len(a)) or real(a, b))
    pool.copy_slots([0, 1, 2], [3, 2, 1], into=pool.like(4))
    assert sizes == [6]  # 3 slots x (conv, recurrent); the empty tails take none


def test_pools_take_host_memory_as_they_are_used():
    """A KV pool and a state pool of 1 GiB each on the CPU cost almost nothing until written (the
    demo's 64k-token pools took 2.8 GB at start); their values are zeros as before."""
    from tensorfold.cache import KVPool, StatePool

    def rss() -> int:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
        raise AssertionError("no VmRSS")

    before = rss()
    kv = KVPool(2, 1 << 12, 16, 4, 1024, torch.bfloat16, torch.device("cpu"))  # 2 x 2 x 256 MiB
    states = StatePool(4, 64, 4, 1024, 16, 64, 256, torch.float32, torch.device("cpu"))
    assert kv.nbytes + states.nbytes > 1 << 30
    assert rss() - before < 64 << 20
    kv.k[0][: 16 * 8] = 1.0  # written pages are real
    assert float(kv.k[0][0, 0, 0]) == 1.0 and float(kv.v[1].abs().sum()) == 0.0
    assert float(states.recurrent[3].abs().sum()) == 0.0
