"""Drafted = plain, bitwise: token ids and the end-of-reply fingerprint (GDN and conv states, KV
rows, logits) of a drafting lane equal a plain lane's, whatever the drafts, for greedy and seeded
requests, alone or with company, with the prompt cache on."""

from dataclasses import replace

import pytest
import torch
from drafting_util import Script, staggered_run
from engine_util import finish_prints, make_engine, sample_prompt

from tensorfold.drafters import choice
from tensorfold.drafters import gate as drafter
from tensorfold.drafters.lookup import NgramDrafter, NotStockDrafter, make_drafter
from tensorfold.engine import drafting
from tensorfold.engine.request import SamplingParams, TokenView, Watch
from tensorfold.errors import InvalidRequest

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(
    max_tokens=24, temperature=0.9, top_p=0.95, top_k=50, seed=77, ignore_eos=True
)
CACHE = 1 << 24


PATTERNS = {
    "all_right": lambda p: False,
    "all_wrong": lambda p: True,
    "every_third_wrong": lambda p: p % 3 == 2,
    "late_wrong": lambda p: p % 7 == 6,
}


def _prompts() -> list[list[int]]:
    return [sample_prompt(200 + i, n, 300) for i, n in enumerate((9, 40, 17, 70))]


@pytest.fixture(scope="module")
def plain(hf_tiny_b):
    return {
        name: staggered_run(hf_tiny_b, _prompts(), params, 1)[0]
        for name, params in (("greedy", GREEDY), ("sampled", SAMPLED))
    }


def _replies(plain_runs) -> dict:
    return {tuple(p): out for p, (out, _) in zip(_prompts(), plain_runs)}


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("parallel", [1, 4])
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_drafted_equals_plain(hf_tiny_b, plain, pattern, parallel, mode):
    params = GREEDY if mode == "greedy" else SAMPLED
    drafter = Script(_replies(plain[mode]), PATTERNS[pattern])
    got, eng = staggered_run(hf_tiny_b, _prompts(), params, parallel, drafter)
    assert got == plain[mode]
    stats = eng.drafting.stats
    assert stats.proposed > 0
    if pattern == "all_wrong":
        assert stats.accepted == 0
    elif pattern == "all_right":
        assert stats.accepted == stats.proposed
    else:
        assert 0 < stats.accepted < stats.proposed


@pytest.mark.parametrize("pattern", ["all_right", "every_third_wrong", "all_wrong"])
@pytest.mark.parametrize("overlap", [False, True])
def test_drafts_left_on_the_device_equal_plain(hf_tiny_b, plain, pattern, overlap):
    """A drafter that leaves its drafts on the device (the MTP head's graphs): the verify pass
    feeds them from there and the walk reads them after it; ids and fingerprints are plain's,
    greedy and seeded, at 1 and 4 lanes, sequential and overlapped."""
    for mode, params in (("greedy", GREEDY), ("sampled", SAMPLED)):
        for parallel in (1, 4):
            script = Script(_replies(plain[mode]), PATTERNS[pattern], on_device=True)
            got, eng = staggered_run(
                hf_tiny_b, _prompts(), params, parallel, script, overlap=overlap
            )
            assert got == plain[mode], (mode, parallel)
            assert eng.drafting.stats.verifies > 0


def test_a_wrong_acceptance_rule_is_caught(hf_tiny_b, plain, monkeypatch):
    """Planted: a draft one token off still counts as accepted. The outputs must then differ."""
    monkeypatch.setattr(drafting, "accepts", lambda drafted, chosen: abs(drafted - chosen) <= 1)
    drafter = Script(_replies(plain["greedy"]), PATTERNS["every_third_wrong"])
    got, _ = staggered_run(hf_tiny_b, _prompts(), GREEDY, 1, drafter)
    assert got != plain["greedy"]


def test_sampled_draws_by_position_not_by_pass(hf_tiny_b, plain):
    """The seeded draw at each position is the plain one: a changed seed changes the reply."""
    other = SamplingParams(**{**SAMPLED.__dict__, "seed": 78})
    drafter = Script(_replies(plain["sampled"]))
    got, _ = staggered_run(hf_tiny_b, _prompts(), other, 1, drafter)
    assert [ids for ids, _ in got] != [ids for ids, _ in plain["sampled"]]


@pytest.mark.parametrize("max_tokens", [3, 7, 8, 13])
def test_max_tokens_inside_an_accepted_run(hf_tiny_b, plain, max_tokens):
    params = SamplingParams(**{**GREEDY.__dict__, "max_tokens": max_tokens})
    want, _ = staggered_run(hf_tiny_b, _prompts()[:1], params, 1)
    got, _ = staggered_run(hf_tiny_b, _prompts()[:1], params, 1, Script(_replies(plain["greedy"])))
    assert got == want and len(got[0][0]) == max_tokens


def test_stop_token_inside_an_accepted_run(hf_tiny_b, plain):
    stop = plain["greedy"][1][0][6]  # the 7th token of the second prompt's plain reply
    params = SamplingParams(**{**GREEDY.__dict__, "stop_token_ids": (stop,)})
    want, _ = staggered_run(hf_tiny_b, _prompts(), params, 1)
    got, _ = staggered_run(hf_tiny_b, _prompts(), params, 4, Script(_replies(plain["greedy"])))
    assert got == want and len(want[1][0]) <= 7


def test_stop_string_inside_an_accepted_run(hf_tiny_b, plain):
    eng = make_engine(hf_tiny_b, parallel=1)
    text = eng.tokenizer.decode(plain["greedy"][1][0])
    stop = text[len(text) // 3 : len(text) // 3 + 3]
    params = SamplingParams(**{**GREEDY.__dict__, "stop": (stop,)})
    want, _ = staggered_run(hf_tiny_b, _prompts(), params, 1)
    got, eng = staggered_run(hf_tiny_b, _prompts(), params, 4, Script(_replies(plain["greedy"])))
    assert got == want and eng.drafting.stats.accepted > 0


def _print_at_end(eng, prints):
    """Fingerprints the lane without logits (a cancel has none), for either finish."""
    return Watch(on_finish=lambda req, _: prints.__setitem__("fp", eng.fingerprint(req, None)))


def test_cancel_while_behind(hf_tiny_b, plain):
    """Cancelled right after a verify pass that missed (the lane's state put back, its committed
    rows not yet recomputed): the reply and the lane are a plain lane's at that length."""
    ids = _prompts()[1]
    eng = make_engine(hf_tiny_b, parallel=1, draft="ngram", prompt_cache_bytes=CACHE)
    eng.drafting.default = Script(_replies(plain["greedy"]), PATTERNS["every_third_wrong"])
    prints = {}
    req = eng.add_request(ids, GREEDY, watch=_print_at_end(eng, prints))
    while not (req.output_ids and req.lane.computed < req.num_tokens - 1):
        eng.step()
    eng.cancel(req.request_id)
    eng.step()
    assert req.finish_reason == "cancelled"
    n = len(req.output_ids)
    ref = make_engine(hf_tiny_b, parallel=1, prompt_cache_bytes=CACHE)
    ref_prints = {}
    params = SamplingParams(**{**GREEDY.__dict__, "max_tokens": n})
    plain_req = ref.add_request(ids, params, watch=_print_at_end(ref, ref_prints))
    ref.run_until_done()
    assert req.output_ids == plain_req.output_ids == plain["greedy"][1][0][:n]
    assert prints["fp"] == ref_prints["fp"]


def test_cache_hit_in_the_middle(hf_tiny_b, plain):
    """A second turn resumes from the first turn's cut; drafted and plain agree on both turns,
    on the cached token count and the fingerprints."""
    first = _prompts()[2]

    def two_turns(drafter):
        eng = make_engine(
            hf_tiny_b, parallel=2, prompt_cache_bytes=CACHE, draft="ngram" if drafter else None
        )
        eng.drafting.default = drafter or eng.drafting.default
        prints, out = {}, []
        for _ in range(2):
            ids = first if not out else first + out[0][0] + sample_prompt(9, 5, 300)
            r = eng.add_request(ids, GREEDY, watch=finish_prints(eng, prints))
            eng.run_until_done()
            out.append((r.output_ids, r.cached_tokens, prints[r.request_id]))
        return out

    want = two_turns(None)
    assert want[1][1] > 0  # the second turn did resume from the cache
    second = first + want[0][0] + sample_prompt(9, 5, 300)
    replies = {tuple(first): want[0][0], tuple(second): want[1][0]}
    assert two_turns(Script(replies, PATTERNS["late_wrong"])) == want


def test_prediction_drafts_and_counts(hf_tiny_b, plain):
    ids, reply = _prompts()[0], plain["greedy"][0][0]
    prediction = reply[:10] + [(t + 5) % 300 for t in reply[10:14]] + reply[14:]
    eng = make_engine(hf_tiny_b, parallel=1, prompt_cache_bytes=CACHE)
    prints = {}
    req = eng.add_request(ids, GREEDY, watch=finish_prints(eng, prints), prediction=prediction)
    eng.run_until_done()
    assert (req.output_ids, prints[req.request_id]) == plain["greedy"][0]
    d = req.lane.draft
    assert d.prediction_accepted > 10 and d.prediction_rejected > 0
    assert d.prediction_accepted + d.prediction_rejected == d.proposed


def test_draft_false_serves_plain(hf_tiny_b, plain):
    eng = make_engine(hf_tiny_b, parallel=1, draft="ngram")
    eng.drafting.default = Script(_replies(plain["greedy"]))
    req = eng.add_request(_prompts()[0], GREEDY, draft=False, prediction=[1, 2, 3])
    eng.run_until_done()
    assert req.lane.draft is None and eng.drafting.stats.proposed == 0
    assert req.output_ids == plain["greedy"][0][0]


def test_gate_backs_off_and_reopens():
    gate = drafter.Gate()
    opened = []
    for accepted in [0, 0, 0, 0]:
        while not gate.open():
            opened.append(False)
        opened.append(True)
        gate.record(accepted)
    assert opened == [True, False, True, False, False, True] + [False] * 4 + [True]
    gate.record(2)
    assert gate.open() and gate.open()


def test_acceptance_length_is_tokens_committed_per_verify():
    stats = drafting.DraftStats()
    stats.record(4, 3, 4)
    stats.record(4, 0, 1)
    assert stats.acceptance_length == 2.5 and drafting.DraftStats().acceptance_length == 0


def test_gate_stays_shut_on_rare_small_wins():
    """A drafter that keeps one token now and then, under WORTH on average, is held back."""
    gate = drafter.Gate()
    for accepted in [0, 0, 0, 0]:
        gate.record(accepted)
    gate.record(1)  # a win, but the average stays under WORTH
    assert gate.rate < drafter.WORTH and not gate.open()
    gate.record(3)
    assert gate.rate >= drafter.WORTH and gate.open() and gate.open()


def test_ngram_proposes_what_followed():
    d = NgramDrafter().for_request()
    assert d.propose([1, 2, 3, 4, 5, 9, 1, 2, 3], [], 3) == [4, 5, 9]
    assert d.propose([1, 2, 3, 4, 5, 9, 1, 2, 3, 4], [], 2) == [5, 9]
    assert d.propose([7, 8], [], 3) == []


def test_a_token_view_reads_as_the_joined_list():
    """A request's prompt and reply as one sequence without a copy: every index and slice (the
    seam between the two, negative bounds, steps, empty and past the end) as the joined list's,
    and an index past either end refused as a list refuses it."""
    gen = torch.Generator().manual_seed(5)
    for head_n, tail_n in ((0, 0), (0, 4), (5, 0), (3, 6), (7, 2)):
        head, tail = list(range(100, 100 + head_n)), list(range(head_n))
        view, joined = TokenView(head, tail), head + tail
        assert len(view) == len(joined) and list(view) == joined
        bounds = list(range(-12, 13)) + [None]
        for _ in range(300):
            a, b = (bounds[int(torch.randint(len(bounds), (1,), generator=gen))] for _ in "ab")
            step = (None, 1, 2, -1)[int(torch.randint(4, (1,), generator=gen))]
            assert view[a:b:step] == joined[a:b:step], (head_n, tail_n, a, b, step)
        for i in range(-len(joined) - 2, len(joined) + 2):
            if -len(joined) <= i < len(joined):
                assert view[i] == joined[i]
            else:
                with pytest.raises(IndexError):
                    view[i]
        tail.append(7)  # the reply grows: the view follows it
        assert view[-1] == 7 and len(view) == len(joined) + 1


def test_ngram_over_a_growing_view_proposes_what_a_search_finds():
    """The lane's lookup indexes only the tokens new since its last call; fed the request's
    view as its reply grows (by one token or several between calls, as after a verify pass)
    it proposes at every step what a search of the whole list finds: after the latest earlier
    place of the longest n-gram (4 down to 2) that ends the list."""

    def search(seq: list[int], k: int) -> list[int]:
        for n in (4, 3, 2):
            ends = [e for e in range(n, len(seq)) if seq[e - n : e] == seq[-n:]]
            if len(seq) >= n and ends:
                return seq[ends[-1] : ends[-1] + k]
        return []

    gen = torch.Generator().manual_seed(11)
    prompt = torch.randint(0, 5, (40,), generator=gen).tolist()
    reply: list[int] = []
    lane = NgramDrafter().for_request()
    for _ in range(60):
        view = TokenView(prompt, reply)
        assert lane.propose(view, reply, 4) == search(prompt + reply, 4)
        grow = int(torch.randint(1, 6, (1,), generator=gen))
        reply += torch.randint(0, 5, (grow,), generator=gen).tolist()


def test_a_guess_drafts_what_followed_the_guessed_token():
    """`guess` (drafts after the lane's unread token): the lookup's match of the read tokens,
    its next token taken as the unread one's guess and the drafts those after it, all from the
    sequence itself; nothing where the last read token never occurred before (where no lookup
    after any next token could match either)."""
    gen = torch.Generator().manual_seed(3)
    empty = found = 0
    for trial in range(60):
        length = int(torch.randint(2, 16, (1,), generator=gen))
        seq = torch.randint(0, 6, (length,), generator=gen).tolist()
        d = NgramDrafter().for_request()
        for n in range(1, len(seq) + 1):  # one lane's chances, its tokens growing
            known = seq[:n]
            g = d.guess(known, [], 3)
            if known[-1] not in known[:-1]:
                empty += 1
                assert g == [] and all(NgramDrafter().propose(known + [x], [], 3) == []
                                       for x in range(6)), known  # fmt: skip
            elif g:  # the guessed token at e, after an earlier place of the last two
                found += 1
                ends = [e for e in range(2, n - 1) if known[e - 2 : e] == known[-2:]]
                assert any(known[e + 1 : e + 1 + len(g)] == g for e in ends), (known, g)
    assert empty > 20 and found > 20, (empty, found)


def test_refusals_by_name(tmp_path):
    with pytest.raises(NotStockDrafter):
        make_drafter(str(tmp_path))
    with pytest.raises(NotStockDrafter):
        make_drafter("no-such-drafter")
    with pytest.raises(InvalidRequest):
        choice.DraftConfig("ngram", 0)


def test_spare_state_memory_reported(hf_tiny_b, plain):
    _, eng = staggered_run(hf_tiny_b, _prompts()[:1], GREEDY, 1, Script(_replies(plain["greedy"])))
    lanes = eng.config.parallel * eng.caches.states.slot_nbytes
    assert eng.drafting.spare_bytes == lanes == eng.memory().state_pool_bytes  # a spare per lane
    assert eng.caches.states.nbytes == 2 * lanes  # the spares are slots of the lanes' pool


def test_a_state_left_unrestored_is_caught(hf_tiny_b, plain, monkeypatch):
    """Planted: after a missed draft the lane keeps the state of the rejected rows."""

    def settle(self, req, restores):
        d = req.lane.draft
        if d is not None and d.start >= 0 and req.lane.computed != req.num_tokens - 1:
            req.lane.computed = req.num_tokens - 1  # the state copy is not put back
        if d is not None:
            d.start, d.proposal = -1, []

    monkeypatch.setattr(drafting.Drafting, "settle", settle)
    drafter = Script(_replies(plain["greedy"]), PATTERNS["every_third_wrong"])
    got, _ = staggered_run(hf_tiny_b, _prompts(), GREEDY, 1, drafter)
    assert [ids for ids, _ in got] != [ids for ids, _ in plain["greedy"]]


def test_a_put_back_that_misses_a_lane_of_the_pass_is_caught(hf_tiny_b, plain, monkeypatch):
    """Planted: of the lanes that missed a draft in one pass, only the first gets its saved
    state put back (the one copy after the pass for all of them drops the rest)."""
    settle = drafting.Drafting.settle

    def first_only(self, req, restores):
        kept = list(restores)
        settle(self, req, restores)
        if kept:
            restores[:] = kept

    monkeypatch.setattr(drafting.Drafting, "settle", first_only)
    drafter = Script(_replies(plain["greedy"]), PATTERNS["every_third_wrong"])
    got, _ = staggered_run(hf_tiny_b, _prompts(), GREEDY, 4, drafter)
    assert [ids for ids, _ in got] != [ids for ids, _ in plain["greedy"]]


def _widest_lane_rows(eng) -> int:
    """Runs the engine to the end; the most rows any one request fed a pass past its prompt."""
    widest, execute = [0], eng.runner.execute

    def spy(work):
        reqs = {r.request_id: r for r in eng.scheduler.running}  # a fork's key names none
        lanes = [x.rows for x in work if x.key in reqs and not reqs[x.key].in_prompt]
        widest[0] = max([widest[0], *lanes])
        return execute(work)

    eng.runner.execute = spy
    eng.run_until_done()
    return widest[0]


def test_a_fork_keeps_a_missing_lane_one_verify_behind(hf_tiny_b, plain):
    """With forks (when more than one committed row waits), the copy put back after a miss
    holds the rows committed before the pass, so a lane that keeps missing feeds at most k+1
    committed rows and k drafts a pass; without, it recomputes every row since its last full
    acceptance."""
    k, drafter = 4, Script(_replies(plain["greedy"]), PATTERNS["every_third_wrong"])
    widest = {}
    for fork in (True, False):
        eng = make_engine(hf_tiny_b, parallel=1, draft="ngram", draft_tokens=k)
        eng.drafting.default = drafter
        if not fork:  # the pool's spare slots unused: a separate spare pool, no fork
            eng.drafting.fork, eng.drafting.spares = False, None
        req = eng.add_request(_prompts()[1], GREEDY)
        widest[fork] = _widest_lane_rows(eng)
        assert req.output_ids == plain["greedy"][1][0]
    assert widest[True] <= 2 * k + 1 < widest[False]


def test_a_fork_one_row_short_is_caught(hf_tiny_b, plain, monkeypatch):
    """Planted: the fork is fed one committed row fewer than the put-back assumes."""
    before = drafting.Drafting.before_pass

    def short(self, work):
        forks = before(self, work)
        return tuple(replace(f, token_ids=f.token_ids[:-1]) for f in forks if f.rows > 1)

    monkeypatch.setattr(drafting.Drafting, "before_pass", short)
    drafter = Script(_replies(plain["greedy"]), PATTERNS["every_third_wrong"])
    got, _ = staggered_run(hf_tiny_b, _prompts(), GREEDY, 1, drafter)
    assert [ids for ids, _ in got] != [ids for ids, _ in plain["greedy"]]


def test_greedy_picks_read_every_plain_greedy_lane_at_once():
    """A verify pass's greedy lanes get each row's argmax (read back in one copy); a sampled
    lane or one with a rule of its own gets none (it chooses row by row)."""
    from tensorfold.engine.request import Request
    from tensorfold.engine.sampler import Sampler

    reads = []

    def greedy(rows):
        reads.append(rows.shape[0])
        return rows.argmax(-1)

    sampler = Sampler(greedy, {0}, None)
    g = torch.Generator().manual_seed(1)
    kinds = [
        SamplingParams(max_tokens=8, temperature=0.0),
        SamplingParams(max_tokens=8, temperature=0.7, seed=1),
        SamplingParams(max_tokens=8, temperature=0.0, repetition_penalty=1.3),
        SamplingParams(max_tokens=8, temperature=0.0),
    ]
    lanes = [
        (Request(f"r{i}", [1, 2], p), torch.randn(i + 2, 50, generator=g))
        for i, p in enumerate(kinds)
    ]
    picks, none = sampler.greedy_picks(lanes)
    assert none == []
    assert picks[0] == lanes[0][1].argmax(-1).tolist() and len(picks[0]) == 2
    assert picks[1] == [] and picks[2] == []
    assert picks[3] == lanes[3][1].argmax(-1).tolist() and len(picks[3]) == 5
    assert reads == [7]  # one argmax for both lanes' rows
    # drafts left on the device come back with the picks, after them, in the same read
    drafts = torch.tensor([5, 6, 7], dtype=torch.int32)
    again, ids = sampler.greedy_picks(lanes, along=drafts)
    assert again == picks and ids == [5, 6, 7] and reads == [7, 7]
    assert sampler.greedy_picks(lanes[1:3], along=drafts) == ([[], []], [5, 6, 7])
    # a graph's lanes, each a block of one logits tensor: one argmax over a view of them all
    logits = torch.randn(12, 50, generator=g)
    blocks = [(Request(f"g{i}", [1], kinds[0]), logits[4 * i : 4 * i + 4]) for i in range(3)]
    reads.clear()
    picks, _ = sampler.greedy_picks(blocks)
    assert sum(picks, []) == logits.argmax(-1).tolist() and reads == [12]
    # two tensors of their own that happen to lie end to end (as two allocations of the GPU's
    # caching allocator may): copied, not viewed past the first one's storage
    buf = bytearray(2 * 4 * 50 * 4)
    apart = [torch.frombuffer(buf, dtype=torch.float32, count=200, offset=o) for o in (0, 800)]
    apart = [t.view(4, 50) for t in apart]
    assert apart[0].data_ptr() + 800 == apart[1].data_ptr()
    apart[0].copy_(logits[:4])
    apart[1].copy_(logits[4:8])
    picks, _ = sampler.greedy_picks(
        [(Request(f"a{i}", [1], kinds[0]), t) for i, t in enumerate(apart)]
    )
    assert sum(picks, []) == logits[:8].argmax(-1).tolist()


@pytest.mark.parametrize("form", ["recurrence", "chunk"])
def test_a_verify_pass_leaves_the_state_in_the_spare_and_copies_none(hf_tiny_b, form):
    """Aligned (every lane's verify reads its slot and writes its spare), the per-token form's
    passes copy no state, before or after a miss, and the replies and their end fingerprints are
    plain's; the chunk forms
    (whose kernels write in place) copy each verifying lane's state to its spare instead."""
    runs = {}
    for draft in (None, "ngram"):
        eng = make_engine(
            hf_tiny_b, parallel=4, draft=draft, gdn_form=form, prompt_cache_bytes=CACHE
        )
        if draft:
            want = {tuple(p): ids for p, (ids, _) in zip(_prompts(), runs[None])}
            eng.drafting.default = Script(want, PATTERNS["every_third_wrong"])
            eng.drafting.align = True
        copies, copy = [], eng.caches.states.copy_slots
        eng.caches.states.copy_slots = lambda *a, **k: copies.append(a) or copy(*a, **k)  # noqa: B023
        prints = {}
        reqs = [eng.add_request(p, GREEDY, watch=finish_prints(eng, prints)) for p in _prompts()]
        eng.run_until_done()
        runs[draft] = [(r.output_ids, prints[r.request_id]) for r in reqs]
    assert runs["ngram"] == runs[None]  # token ids and end fingerprints (states, KV, logits)
    assert 0 < eng.drafting.stats.accepted < eng.drafting.stats.proposed
    assert eng.drafting.flip == (form == "recurrence") and bool(copies) == (form == "chunk")
