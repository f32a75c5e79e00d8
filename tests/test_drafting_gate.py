"""The drafting gate: its decision is a pure function of the lane's history of kept drafts and the
measured price of a verify pass (scripted histories give scripted decisions), and a drafter that
is always wrong stops costing passes within a few of them, in an engine that prices its passes."""

import pytest
from drafting_util import Script, fixed_price, plain_replies
from engine_util import make_engine, sample_prompt

from tensorfold.drafters.gate import (
    EXPLORE,
    FIRST_SKIP,
    Gate,
    LaneHistory,
    PassPrices,
    lane_bucket,
    most_skipped,
)
from tensorfold.engine.request import SamplingParams


def _closed_for(gate: Gate) -> int:
    """Chances the gate skips before it opens again."""
    n = 0
    while not gate.open():
        n += 1
    return n


def test_expected_tokens_follow_the_chance_a_draft_is_kept():
    gate = Gate()
    assert gate.chance == 1.0 and gate.expected(4) == 5.0  # hopeful before any pass
    for _ in range(24):
        gate.record(2, 4, price=1.2)  # two of four kept, each time: a = 2/3
    assert gate.chance == pytest.approx(2 / 3, abs=0.02)
    assert gate.expected(4) == pytest.approx(1 + sum((2 / 3) ** i for i in range(1, 5)), abs=0.05)


def test_a_cheap_verify_keeps_drafting_on_few_wins_and_a_dear_one_does_not():
    """The same history, one kept of four each pass (a ≈ 1/2, 1.9 tokens a pass): open at a
    price of 1.3 plain passes, closed at 2.5 (the card busy with many lanes)."""
    cheap, dear = Gate(), Gate()
    for _ in range(12):
        cheap.record(1, 4, price=1.3)
        dear.record(1, 4, price=2.5)
    assert cheap.open() and cheap.skip == 0
    assert not dear.open() and dear.backoff > 0


def test_without_a_price_the_gate_keeps_the_kept_rate_rule():
    gate = Gate()
    for accepted in [0, 0, 0, 0]:
        gate.record(accepted, 4, price=None)
    gate.record(1, 4, price=None)  # a win, but the rate stays under WORTH
    assert not gate.open()
    gate.record(3, 4, price=None)
    assert gate.open()


def test_an_always_wrong_lane_closes_within_a_few_passes_and_retries_rarely():
    gate, passes, verifies = Gate(), 0, 0
    while passes < 400:
        passes += 1
        if gate.open():
            verifies += 1
            gate.record(0, 4, price=1.33)
    first = Gate()
    misses = 0
    while first.skip == 0 and misses < 50:
        assert first.open()
        first.record(0, 4, price=1.33)
        misses += 1
    assert misses <= 3  # the hopeful start is spent in two or three verify passes
    assert _closed_for(first) == FIRST_SKIP
    assert verifies <= misses + 15  # then about one try in 32 chances
    assert gate.backoff == most_skipped(1.33) == 33


def test_a_closed_gate_reopens_when_drafts_come_right():
    gate = Gate()
    for _ in range(10):
        if gate.open():
            gate.record(0, 4, price=1.33)
    while not gate.open():
        pass
    for _ in range(6):
        gate.record(4, 4, price=1.33)
    assert gate.open() and gate.open() and gate.expected(4) > 4


def test_prices_by_lane_bucket_and_rows():
    prices = PassPrices()
    assert prices.ratio(1, 5) is None
    prices.record(1, 5, 0.004)
    assert prices.ratio(1, 5) is None  # no plain pass measured yet
    prices.record(1, 1, 0.003)
    assert prices.ratio(1, 5) == pytest.approx(4 / 3)
    prices.record(3, 1, 0.010)  # 3 lanes price with 4
    assert lane_bucket(3) == lane_bucket(4) == 4 and prices.ratio(4, 1) == 1.0
    prices.record(1, 5, 0.9)  # a first pass that records a graph: one slow pass changes nothing
    assert prices.ratio(1, 5) == pytest.approx(4 / 3)
    for _ in range(8):
        prices.record(1, 1, 0.006)  # the least of the last 8: follows the card
    assert prices.ratio(1, 5) == pytest.approx(4 / 6)


def test_engine_prices_its_passes_and_an_always_wrong_drafter_stops(hf_tiny_b):
    """Drafts always wrong: the engine prices plain and verify passes, the gate closes, and most
    of the reply's passes are plain (the tokens are checked equal to plain by test_drafting)."""
    prompt = sample_prompt(5, 12, 300)
    params = SamplingParams(max_tokens=120, temperature=0.0, ignore_eos=True)
    plain = make_engine(hf_tiny_b, parallel=1)
    want = plain.add_request(prompt, params)
    plain.run_until_done()
    script = Script({tuple(prompt): want.output_ids}, lambda p: True)
    eng = make_engine(hf_tiny_b, parallel=1, draft="ngram", draft_tokens=4)
    eng.drafting.default = script
    req = eng.add_request(prompt, params)
    eng.run_until_done()
    assert req.output_ids == want.output_ids
    stats = eng.drafting.stats
    assert stats.accepted == 0 and 0 < stats.verifies <= 22  # ~11, then 1 in 1, 2, 4 ... 32
    assert (1, 1) in eng.drafting.prices.seconds and (1, 5) in eng.drafting.prices.seconds


def test_a_price_below_a_plain_pass_is_read_as_noise():
    """A verify priced under a plain pass (the clock's noise) does not reopen a gate whose
    drafts all miss."""
    gate = Gate()
    for _ in range(20):
        gate.record(0, 4, price=1.0)
    gate.record(0, 4, price=0.8)
    assert gate.skip > 0


def _mixed_lanes(hf_tiny_b, monkeypatch, price: float, share: bool = True):
    """Four lanes under aligned (graph-shaped) passes: lane 0's drafts always right, the other
    three's always wrong, verify passes priced at `price` plain ones. Returns (the engine,
    the rows a lane of each pass without a prompt fed, plain replies, drafted replies)."""
    from tensorfold.engine.drafting import Drafting

    prompts = [sample_prompt(20 + i, 12, 300) for i in range(4)]
    params = [
        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (160, 40, 40, 40)
    ]
    plain = make_engine(hf_tiny_b, parallel=4)
    want = [plain.add_request(p, s) for p, s in zip(prompts, params)]
    plain.run_until_done()
    replies = {tuple(prompts[0]): want[0].output_ids}
    replies.update(
        {tuple(p): [(t + 1) % 300 for t in w.output_ids] for p, w in zip(prompts[1:], want[1:])}
    )
    fixed_price(monkeypatch, price)
    if not share:
        monkeypatch.setattr(Drafting, "share_pass", lambda self, running: None)
    eng = make_engine(hf_tiny_b, parallel=4, draft="ngram", draft_tokens=4)
    eng.drafting.default, eng.drafting.align = Script(replies), True
    shapes, execute = [], eng.runner.execute

    def watched(plan):
        if len(plan) == 4 and all(lane.logits.stop == lane.rows for lane in plan):
            shapes.append(tuple(lane.rows for lane in plan))
        return execute(plan)

    eng.runner.execute = watched
    reqs = [eng.add_request(p, s) for p, s in zip(prompts, params)]
    eng.run_until_done()
    return eng, shapes, [w.output_ids for w in want], [r.output_ids for r in reqs]


def test_lanes_whose_gates_closed_ride_a_paying_verify_pass(hf_tiny_b, monkeypatch):
    """At a price the right lane's drafts pay for all four lanes' rows, the closed lanes ride
    along with repeated tokens, so the passes keep one shape (a graph's) and the tokens are
    plain's; without riding, most passes mix 5-row and 1-row lanes (eager on a GPU)."""
    eng, shapes, want, got = _mixed_lanes(hf_tiny_b, monkeypatch, price=1.2)
    assert got == want
    mixed = [s for s in shapes if len(set(s)) > 1]
    assert len(shapes) >= 24 and not mixed, shapes  # to the end: its KV rows reach past it
    assert eng.drafting.stats.accepted >= 100  # lane 0 kept drafting
    _, unshared, _, same = _mixed_lanes(hf_tiny_b, monkeypatch, price=1.2, share=False)
    assert same == want and sum(len(set(s)) > 1 for s in unshared) >= len(unshared) // 2


def test_a_verify_pass_that_cannot_pay_for_its_riders_is_not_made(hf_tiny_b, monkeypatch):
    """At 2.5 plain passes a verify, lane 0 alone would draft (5 tokens a pass), but not with
    three lanes riding (8 tokens for 10 passes' worth): once the wrong lanes close, the passes
    are plain ones of one row a lane."""
    eng, shapes, want, got = _mixed_lanes(hf_tiny_b, monkeypatch, price=2.5)
    assert got == want
    alone = [i for i, s in enumerate(shapes) if s[0] == 5 and max(s[1:]) < 5]
    assert all(i >= len(shapes) - 4 for i in alone), shapes  # only where the riders near their end
    assert sum(s == (1, 1, 1, 1) for s in shapes) >= len(shapes) // 2, shapes


def test_riders_pay_by_the_sum_of_expected_tokens():
    from tensorfold.drafters.gate import verify_pays

    assert verify_pays([5.0], 3, 1.2) and not verify_pays([5.0], 3, 2.5)
    assert verify_pays([5.0, 5.0, 5.0], 1, 2.5)  # three right lanes carry one rider
    assert verify_pays([1.0], 3, None)  # unmeasured: the pass measures the price


def _staggered(hf_tiny_b, monkeypatch, old_room: bool = False):
    """Eight lanes admitted a pass apart under aligned passes with the lookahead a graph engine
    sets (the scheduler's, K rows), every draft right, so that the lanes end a pass or two
    apart. Returns (per pass without prompt rows the rows a lane fed, plain replies, drafted
    replies)."""
    from tensorfold.engine.drafting import Drafting

    prompts = [sample_prompt(40 + i, 12, 300) for i in range(8)]
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    plain = make_engine(hf_tiny_b, parallel=8)
    want = [plain.add_request(p, params) for p in prompts]
    plain.run_until_done()
    replies = {tuple(p): w.output_ids for p, w in zip(prompts, want)}
    if old_room:  # planted: no draft past a lane's last token, the rule before the lookahead
        monkeypatch.setattr(
            Drafting,
            "room",
            lambda self, r: min(4 - self.recompute(r), r.max_tokens - len(r.output_ids) - 1),
        )
    eng = make_engine(hf_tiny_b, parallel=8, draft="ngram", draft_tokens=4)
    eng.drafting.default, eng.drafting.align = Script(replies), True
    eng.scheduler.lookahead = 4
    shapes, execute = [], eng.runner.execute

    def watched(plan):
        if all(len(lane.logits) == lane.rows for lane in plan):
            shapes.append(tuple(lane.rows for lane in plan))
        return execute(plan)

    eng.runner.execute = watched
    reqs = []
    for p in prompts:
        reqs.append(eng.add_request(p, params))
        eng.step()
    eng.run_until_done()
    return shapes, [w.output_ids for w in want], [r.output_ids for r in reqs]


def test_lanes_near_their_end_keep_the_pass_a_graphs_shape(hf_tiny_b, monkeypatch):
    """Lanes admitted a pass apart reach their ends a pass apart, so some lane is often within
    K tokens of its end. Its KV rows reach K past its capacity, so it still feeds 1 + K rows (the
    walk stops at its end): once no lane reads its prompt, every pass keeps one shape. Planted,
    the rule without the lookahead mixes them."""
    shapes, want, got = _staggered(hf_tiny_b, monkeypatch)
    assert got == want
    assert len(shapes) >= 8 and all(len(set(s)) == 1 for s in shapes), shapes
    shapes, want, got = _staggered(hf_tiny_b, monkeypatch, old_room=True)
    assert got == want
    assert sum(len(set(s)) > 1 for s in shapes) >= 3, shapes


def test_a_new_lane_starts_from_what_finished_lanes_learnt():
    """After lanes whose drafts all missed, a new lane's gate starts closed where even the
    cheapest measured price is not paid (open while unpriced, or after lanes whose drafts were
    kept)."""
    history = LaneHistory()
    fresh = history.gate(4, 1.3)
    assert fresh.open() and fresh.chance == 1.0  # nothing learnt: the hopeful start
    for _ in range(3):
        gate = Gate()
        for _ in range(4):
            gate.record(0, 4, price=1.3)
        history.learn(gate)
    starts = [history.gate(4, 1.3) for _ in range(EXPLORE)]
    assert all(g.chance < 0.5 and _closed_for(g) == most_skipped(1.3) for g in starts[:-1])
    assert starts[-1].open() and starts[-1].chance == 1.0  # one in EXPLORE tries afresh
    assert history.gate(4, None).open()
    for _ in range(6):
        gate = Gate()
        gate.record(4, 4, price=1.3)
        history.learn(gate)
    assert history.gate(4, 1.3).open() and history.gate(4, 1.3).chance > 0.9


def test_a_second_request_of_an_always_wrong_drafter_verifies_less(hf_tiny_b):
    """The engine's lanes share what their gates learnt: the second request after an always-wrong
    one starts closed, and its tokens are plain's."""
    prompt = sample_prompt(6, 12, 300)
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    plain = make_engine(hf_tiny_b, parallel=1)
    want = plain.add_request(prompt, params)
    plain.run_until_done()
    eng = make_engine(hf_tiny_b, parallel=1, draft="ngram", draft_tokens=4)
    eng.drafting.default = Script({tuple(prompt): want.output_ids}, lambda p: True)
    counts = []
    for _ in range(2):
        before = eng.drafting.stats.verifies
        req = eng.add_request(prompt, params)
        eng.run_until_done()
        assert req.output_ids == want.output_ids
        counts.append(eng.drafting.stats.verifies - before)
    assert counts[1] < counts[0], counts


def test_a_long_closed_gate_rests_until_its_last_chances():
    """A gate closed for more than WAKE chances rests (its drafter reads no target states) until
    WAKE chances before its retry, then reads them again; a short closure never rests."""
    from tensorfold.drafters.gate import WAKE

    gate = Gate(skip=most_skipped(2.0), backoff=most_skipped(2.0))
    resting = []
    while True:
        resting.append(gate.resting())
        if gate.open():
            break
    assert resting == [True] * (most_skipped(2.0) - WAKE) + [False] * (WAKE + 1)
    assert not Gate(skip=WAKE).resting() and not Gate().resting()


def test_a_lane_whose_proposals_the_pass_refuses_waits_before_asking_again(hf_tiny_b, monkeypatch):
    """At 2.5 plain passes a verify, lane 0's right drafts cannot pay for three riders: each
    refusal closes its gate for 4, 8, 16 ... chances (its record unchanged), so it asks a few
    times, not every pass (an open gate that asks every pass keeps an engine from overlapping).
    Planted: with refusals that do not defer, it asks nearly every pass."""
    from tensorfold.engine.drafting import Drafting

    refusals, defer = [], Drafting.defer

    def counted(planted):
        def refuse(self, refused, lanes):
            refusals.append(len(refused))
            return None if planted else defer(self, refused, lanes)

        return refuse

    monkeypatch.setattr(Drafting, "defer", counted(False))
    _, shapes, want, got = _mixed_lanes(hf_tiny_b, monkeypatch, price=2.5)
    assert got == want and 0 < len(refusals) <= 8, refusals
    monkeypatch.setattr(Drafting, "defer", counted(True))
    refusals.clear()
    _, _, _, same = _mixed_lanes(hf_tiny_b, monkeypatch, price=2.5)
    assert same == want and len(refusals) >= 20, refusals


def test_a_lookup_that_finds_nothing_skips_a_few_chances():
    """Nothing to propose (no n-gram, a prediction used up): 1, 2, 4, 8, 8 ... chances skipped,
    and asked at every chance again once it proposes."""
    from tensorfold.drafters.gate import MOST_IDLE

    gate, skipped = Gate(), []
    for _ in range(6):
        gate.found(False)
        skipped.append(_closed_for(gate))
    assert skipped == [1, 2, 4, MOST_IDLE, MOST_IDLE, MOST_IDLE]
    gate.found(True)
    gate.found(False)
    assert _closed_for(gate) == 1 and gate.rate == 1.0  # its record untouched


def test_priced_lookups_that_find_nothing_skip_enough_chances_to_cost_one_percent():
    """Lookups priced at 5% of a plain step (each lane's, times the lanes, over the step): a lane
    whose lookups find nothing looks once in 5 chances at least (5% / 5 = LOOKUP_COST), still
    1, 2, 4 ... MOST_IDLE when dearer; a cheap lookup (a slow step) keeps the ramp, and a lane
    that proposes asks at every chance again."""
    from tensorfold.drafters.gate import LOOKUP_COST, MOST_IDLE, PassPrices

    gate, skipped = Gate(), []
    for _ in range(5):
        gate.found(False, 5 * LOOKUP_COST)
        skipped.append(_closed_for(gate))
    assert skipped == [4, 8, MOST_IDLE, MOST_IDLE, MOST_IDLE]
    gate.found(False, 40 * LOOKUP_COST)
    assert _closed_for(gate) == 39
    gate.found(True, 40 * LOOKUP_COST)
    assert gate.skip == 0 and gate.open()
    gate = Gate()
    gate.found(False, LOOKUP_COST / 2)
    assert _closed_for(gate) == 1

    prices = PassPrices()
    assert prices.lookup_share(4) is None  # nothing timed yet: the ramp alone
    prices.record(4, 1, 2e-3)
    prices.record(4, 1, 1e-3)  # the least of the window
    prices.lookups.extend([30e-6, 20e-6, 90e-6])
    assert prices.lookup_share(3) == pytest.approx(3 * 20e-6 / 1e-3)  # 3 lanes: bucket 4
    assert prices.lookup_share(16) is None  # no plain pass at 16 lanes


def test_lanes_with_nothing_to_draft_let_the_engine_overlap(hf_tiny_b, monkeypatch):
    """A drafter that must read each lane's last token and finds nothing for most positions:
    its lanes skip chances, so most passes overlap, and the replies are plain's. Planted: a
    gate that asks at every chance leaves no pass overlapped."""
    prompts, params, want, replies = plain_replies(hf_tiny_b, 400, (9, 30, 14), 80)
    fixed_price(monkeypatch)

    class Sparse(Script):  # right drafts at one position in 20, nothing elsewhere
        guesses = False  # it reads the token first (a guessing one never waits for it)

        def propose(self, tokens, output, k):
            return super().propose(tokens, output, k) if len(output) % 20 == 5 else []

    def run():
        eng = make_engine(hf_tiny_b, parallel=3, draft="ngram", overlap=True)
        eng.drafting.default = Sparse(replies)
        overlapped, step = [], eng._overlapped_step
        eng._overlapped_step = lambda proposed=False: (
            (  # counted when it waited for no read
                overlapped.append(1) if not proposed else None
            )
            or step(proposed)
        )
        got, steps = [eng.add_request(ids, params) for ids in prompts], 0
        while eng.has_work():
            eng.step()
            steps += 1
        assert [r.output_ids for r in got] == [r.output_ids for r in want]
        return len(overlapped), steps

    overlapped, steps = run()
    assert overlapped >= steps // 2, (overlapped, steps)
    monkeypatch.setattr(Gate, "found", lambda self, proposed, share=None: None)
    overlapped, steps = run()
    # only the steps after a verify pass overlap: no token of theirs is on the device to read
    assert overlapped <= steps // 5, (overlapped, steps)


def test_an_exploring_start_that_misses_waits_as_long_as_the_history_says():
    """One lane in EXPLORE starts hopeful against a history of misses; when its drafts do not pay
    either, it waits the longest a closed gate waits at once, as the lanes before it did, not the
    ramp of 4, 8, 16 ... chances (each retry a verify pass that loses). Planted: a hopeful start
    that is not marked exploring takes the ramp."""
    history = LaneHistory()
    for _ in range(3):
        gate = Gate()
        for _ in range(4):
            gate.record(0, 4, price=2.0)
        history.learn(gate)
    explorer = [history.gate(4, 2.0) for _ in range(EXPLORE)][-1]
    assert explorer.open() and explorer.explore
    cheap = [history.gate(4, 1.3) for _ in range(EXPLORE)][-1]
    cheap.record(0, 4, price=1.3)  # one miss: the hopeful start still pays at this price
    assert cheap.open() and cheap.explore
    cheap.record(0, 4, price=1.3)
    assert _closed_for(cheap) == most_skipped(1.3)
    explorer.record(0, 4, price=2.0)
    assert _closed_for(explorer) == most_skipped(2.0) > 2 * FIRST_SKIP
    assert not explorer.explore  # its later misses ramp from there as any gate's
    planted = Gate()
    planted.record(0, 4, price=2.0)
    assert _closed_for(planted) == FIRST_SKIP
    kept = [history.gate(4, 2.0) for _ in range(EXPLORE)][-1]
    kept.record(4, 4, price=2.0)  # its drafts paid: open, an ordinary gate from then on
    assert kept.open() and not kept.explore
