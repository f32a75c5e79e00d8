"""What the engine's passes cost the drafting gate: a verify pass priced with the proposal that
made it, plain passes timed before any lane drafts, no pass priced that recorded its graph or
waited on one, an overlapped step priced only when it waited for the pass before, and an
overlapped engine's plain price its overlapped steps' (each on a clock the test drives, so the
prices are the test's)."""

from dataclasses import replace

import pytest
from drafting_util import Script, engine_clock, plain_replies
from engine_util import finish_prints, make_engine

from tensorfold.drafters.gate import PLAIN_EVERY, WINDOW


def test_overlapped_steps_price_a_plain_pass_only_when_they_waited_for_one(hf_tiny_b):
    """An overlapped step lasts a pass's period only when it waits for the pass before; the
    first after a plain (sequential) step launches and returns, the host's time alone, which
    as the least of the window would make every verify look dear."""
    prompts, params, want, replies = plain_replies(hf_tiny_b, 200, (9, 40, 17), 64)
    eng = make_engine(hf_tiny_b, parallel=3, draft="ngram", overlap=True)
    eng.drafting.default = Script(replies, lambda p: True)
    steps, overlapped, record = [], eng._overlapped_step, eng.drafting.prices.record

    def step(proposed=False):
        steps.append([eng._chosen is not None, 0])
        return overlapped(proposed)

    def priced(lanes, rows, seconds):
        if steps and rows == 1:
            steps[-1][1] += 1
        return record(lanes, rows, seconds)

    eng._overlapped_step, eng.drafting.prices.record = step, priced
    got = [eng.add_request(ids, params) for ids in prompts]
    eng.run_until_done()
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    assert any(not waited for waited, _ in steps)  # steps after a plain one happened
    assert all(n == 0 for waited, n in steps if not waited)
    assert sum(n for waited, n in steps if waited) >= 10


@pytest.mark.parametrize("overlap,guesses", [(False, False), (True, False), (True, True)])
def test_a_verify_pass_is_priced_with_its_drafters_own_steps(
    hf_tiny_b, monkeypatch, overlap, guesses
):
    """What a verify pass costs against a plain one includes the proposal that made it (the MTP
    head's catch-up and chain are steps of their own): a drafter whose proposals take a second
    of the engine's clock prices every verify shape at a second or more, and plain passes at
    less, sequential or overlapped, guessed or read."""
    clock = engine_clock(monkeypatch)
    prompts, params, want, replies = plain_replies(hf_tiny_b, 950, (9, 21), 24)

    class Slow(Script):  # overlapped, a chance reads its token first (an ask) or guesses it
        def propose(self, tokens, output, k):
            clock[0] += 1.0
            return super().propose(tokens, output, k)

    eng = make_engine(hf_tiny_b, parallel=2, draft="ngram", overlap=overlap)
    eng.drafting.default = Slow(replies)
    eng.drafting.default.guesses = guesses
    got = [eng.add_request(ids, params) for ids in prompts]
    eng.run_until_done()
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    seconds = eng.drafting.prices.seconds
    verify = [min(v) for (_, rows), v in seconds.items() if rows > 1]
    plain = [min(v) for (_, rows), v in seconds.items() if rows == 1]
    assert verify and min(verify) >= 1.0, seconds
    assert all(p < 1.0 for p in plain), seconds


@pytest.mark.parametrize("overlap", [False, True])
def test_a_drafter_that_wins_a_little_at_a_high_cost_is_priced_and_stops(
    hf_tiny_b, monkeypatch, overlap
):
    """Unpriced, a gate stays open while each verify pass keeps some drafts; a drafter that
    keeps one draft a pass and takes a second to propose it would then draft every chance and
    the engine never time a plain pass. A lane's first chances are plain passes until the
    engine has timed some, and at ten plain passes a verify the gate closes."""
    clock = engine_clock(monkeypatch)
    prompts, params, want, replies = plain_replies(hf_tiny_b, 970, (13,), 80)

    class FirstRight(Script):  # reads the lane's last token first, as the MTP head does
        guesses = False

        def propose(self, tokens, output, k):
            clock[0] += 1.0
            drafts = super().propose(tokens, output, k)
            return drafts[:1] + [(t + 1) % 300 for t in drafts[1:]]

    eng = make_engine(hf_tiny_b, parallel=1, draft="ngram", overlap=overlap)
    eng.drafting.default = FirstRight(replies)
    execute = eng.runner.execute

    def timed(plan):
        clock[0] += 0.1
        return execute(plan)

    eng.runner.execute = timed
    got = eng.add_request(prompts[0], params)
    eng.run_until_done()
    assert got.output_ids == want[0].output_ids
    stats = eng.drafting.stats
    assert stats.accepted == stats.verifies > 0  # every verify pass kept its first draft
    assert eng.drafting.prices.ratio(1, 5) > 5.0
    assert stats.verifies <= 8, stats  # the closed gate's retries: after 4, 8, 16, 32 chances


@pytest.mark.parametrize("overlap", [False, True])
def test_a_pass_that_records_its_graph_is_not_priced(hf_tiny_b, monkeypatch, overlap):
    """The first pass of a graph's shape compiles and records it (or a drafter's first
    proposal of a shape does), taking many replays' time; as the least of a window it would
    stand for long, and as a shape's only price close the gates that would have measured
    more. Such passes, and an overlapped step's wait on one, are not priced."""
    clock = engine_clock(monkeypatch)
    prompts, params, want, replies = plain_replies(hf_tiny_b, 990, (9, 14), 40)
    eng = make_engine(hf_tiny_b, parallel=2, draft="ngram", overlap=overlap)
    eng.drafting.default = Script(replies, lambda p: p % 5 == 4)
    execute, seen = eng.runner.execute, set()

    def timed(plan):  # a shape's first pass "records its graph": a hundred seconds
        shape = (len(plan), tuple(lane.rows for lane in plan))
        clock[0] += 0.1 if shape in seen else 100.0
        eng.runner.cold_passes += shape not in seen
        seen.add(shape)
        return execute(plan)

    eng.runner.execute = timed
    got = [eng.add_request(ids, params) for ids in prompts]
    eng.run_until_done()
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    seconds = eng.drafting.prices.seconds
    assert any(rows > 1 for _, rows in seconds) and any(rows == 1 for _, rows in seconds)
    assert all(t < 50.0 for window in seconds.values() for t in window), seconds


def test_an_overlapped_engine_prices_a_plain_pass_by_its_overlapped_steps(hf_tiny_b, monkeypatch):
    """Not drafting costs an overlapped step, so that is a plain pass's price: a plain pass an
    overlapped engine runs alone (here while a watched lane makes every step sequential, each a
    second dearer on the test's clock, as host and card then wait on each other) prices nothing,
    or every verify pass would look cheap against it."""
    clock = engine_clock(monkeypatch)
    prompts, params, want, replies = plain_replies(hf_tiny_b, 990, (11, 23), 48)
    eng = make_engine(hf_tiny_b, parallel=2, draft="ngram", overlap=True)
    eng.drafting.default = Script(replies, lambda p: True)  # every draft wrong: gates close
    execute, sequential = eng.runner.execute, eng._step
    inside, plain_alone = [False], []

    def timed(plan):
        clock[0] += 1.1 if inside[0] else 0.1
        if inside[0] and plan.rows == len(plan):
            plain_alone.append(plan)
        return execute(plan)

    def alone(proposed=False):
        inside[0] = True
        try:
            return sequential(proposed)
        finally:
            inside[0] = False

    eng.runner.execute, eng._step = timed, alone
    watch = finish_prints(eng, {})
    watched = eng.add_request(prompts[0], replace(params, max_tokens=12), watch=watch)
    other = eng.add_request(prompts[1], params)
    eng.run_until_done()
    assert watched.output_ids == want[0].output_ids[:12]
    assert other.output_ids == want[1].output_ids
    assert plain_alone  # plain passes ran in sequential steps
    plain = [t for (_, rows), v in eng.drafting.prices.seconds.items() if rows == 1 for t in v]
    assert plain and max(plain) < 1.0, eng.drafting.prices.seconds


@pytest.mark.parametrize("overlap", [True, False])
def test_plain_passes_are_timed_each_at_first_then_one_in_a_few(hf_tiny_b, overlap):
    """A plain step's timing is host work a host-bound step pays in full: the first WINDOW
    plain passes are timed (a price soon), then one in PLAIN_EVERY, in an overlapped engine and
    in a sequential one alike; the window of the least then spans more steps, and the replies
    are plain's."""
    prompts, params, want, replies = plain_replies(hf_tiny_b, 200, (9, 40, 17), 64)
    eng = make_engine(hf_tiny_b, parallel=3, draft="ngram", overlap=overlap)
    eng.drafting.default = Script(replies, lambda p: True)  # every draft wrong: gates close
    prices, record, asked, timed = eng.drafting.prices, eng.drafting.prices.record, [], []
    wants = prices.wants_plain

    def counted():
        asked.append(wants())
        return asked[-1]

    def priced(lanes, rows, seconds):
        timed.append(rows)
        return record(lanes, rows, seconds)

    prices.wants_plain, prices.record = counted, priced
    got = [eng.add_request(ids, params) for ids in prompts]
    eng.run_until_done()
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    assert len(asked) > 3 * WINDOW and asked[:WINDOW] == [True] * WINDOW
    later = asked[WINDOW:]
    assert later == [(WINDOW + 1 + i) % PLAIN_EVERY == 0 for i in range(len(later))]
    plain = timed.count(1)  # a plain step asked and warm is timed, one not asked never
    assert WINDOW // 2 < plain <= sum(asked), (plain, sum(asked))
