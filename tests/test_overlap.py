"""The overlapped engine (engine/overlap.py) against the sequential one, on the CPU: pass N+1
is planned and launched before pass N's tokens are read, and no request's tokens, text or
finish change for it, through arrivals, cancels, stops by token and by length, sampling,
penalties, grammars and the prompt cache."""

from __future__ import annotations

import pytest
import torch
from drafting_util import fixed_price
from engine_util import make_engine, sample_prompt
from llguidance import LLMatcher

from tensorfold.engine import overlap
from tensorfold.engine.constraints import Grammar
from tensorfold.engine.request import SamplingParams
from tensorfold.runner.plan import PENDING, Fed, LaneRows, PassPlan, padded
from tensorfold.tokenizer import Tokenizer
from tensorfold.util import default_checkpoint

DEMO = default_checkpoint(None)


def _asks(vocab: int) -> list[tuple[list[int], SamplingParams]]:
    """Prompts of several lengths with every kind of rule the sampler has."""
    kinds = [
        SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True, prompt_logprobs=2),
        SamplingParams(
            max_tokens=7, temperature=0.8, top_p=0.9, seed=5, ignore_eos=True, logprobs=0
        ),
        SamplingParams(
            max_tokens=12,
            temperature=0.0,
            repetition_penalty=1.3,
            frequency_penalty=0.5,
            presence_penalty=0.4,
            logit_bias={3: 4.0},
            ignore_eos=True,
        ),  # fmt: skip
        SamplingParams(max_tokens=6, temperature=1.1, top_k=20, seed=9, min_tokens=3),
        SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=3),
    ]
    lengths = (5, 40, 130, 9, 70)
    return [(sample_prompt(300 + i, n, vocab), p) for i, (n, p) in enumerate(zip(lengths, kinds))]


def _run(path, asks, overlap_on: bool, cancel: dict[int, int] | None = None, **config):
    """Requests arrive one every other step (more than the lanes: some queue); `cancel` maps
    a request's index to the step its cancel arrives at."""
    eng = make_engine(path, parallel=3, overlap=overlap_on, **config)
    assert eng.overlap is overlap_on
    reqs, waiting, step, events = [], list(asks), 0, []
    while waiting or eng.has_work():
        if waiting and step % 2 == 0:
            reqs.append(eng.add_request(*waiting.pop(0)))
        for i, at in (cancel or {}).items():
            if at == step:
                eng.cancel(reqs[i].request_id)
        events += eng.step()
        step += 1
    for r in reqs:  # what a client was streamed: each event's tokens, text and logprobs
        r.streamed = [
            (e.token_ids, e.text, e.logprobs, e.prompt_logprobs, e.finish_reason)
            for e in events
            if e.request_id == r.request_id
        ]
    return reqs


def _replies(reqs) -> list[tuple[list[int], str | None, str]]:
    return [(r.output_ids, r.finish_reason, r.text, r.streamed) for r in reqs]


def test_overlapped_replies_equal_sequential(hf_tiny_b):
    asks = _asks(300)
    plain = _run(hf_tiny_b, asks, False)
    # a stop by token value, which the overlapped host learns a pass late: the 4th token
    stop = plain[4].output_ids[3]
    asks[4] = (
        asks[4][0],
        SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=(stop,), logprobs=3),
    )
    plain = _run(hf_tiny_b, asks, False)
    assert plain[4].finish_reason == "stop" and len(plain[4].output_ids) <= 4
    assert plain[0].streamed[0][3] and plain[4].streamed[0][2]  # prompt logprobs, logprobs
    assert _replies(_run(hf_tiny_b, asks, True)) == _replies(plain)


def test_lanes_asking_for_logprobs_in_one_pass_each_get_their_own(hf_tiny_b):
    """Four lanes decode together, three of them asking for top 2, 0 and 3 (their values and
    ids travel packed in one copy back): each lane's streamed logprobs equal the sequential
    engine's and its own top ids, whatever the lanes before it asked for."""
    ks = (2, None, 0, 3)
    asks = [
        (
            sample_prompt(40 + i, 6 + i, 300),
            SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=k),
        )
        for i, k in enumerate(ks)
    ]
    plain = _run(hf_tiny_b, asks, False)  # staggered arrivals: the same bytes a lane
    eng = make_engine(hf_tiny_b, parallel=4, overlap=True)
    reqs = [eng.add_request(*a) for a in asks]  # all in the first pass: they decode together
    events = []
    while eng.has_work():
        events += eng.step()
    for r, p, k in zip(reqs, plain, ks):
        got = [e.logprobs for e in events if e.request_id == r.request_id]
        assert got == [s[2] for s in p.streamed], f"top {k}"
        if k:
            assert all(len(top) == k for lp in got for _, top in lp)


def test_cancels_drop_only_the_cancelled(hf_tiny_b):
    """A cancel mid-decode ends its request with a prefix of the reply it would have had (the
    overlapped engine may not have read its last chosen token); every other reply is whole."""
    asks = _asks(300)
    whole = _run(hf_tiny_b, asks, False)
    for overlap_on in (False, True):
        got = _run(hf_tiny_b, asks, overlap_on, cancel={0: 7, 2: 12})
        for i, (r, w) in enumerate(zip(got, whole)):
            if i in (0, 2):
                assert r.finish_reason == "cancelled"
                assert r.output_ids == w.output_ids[: len(r.output_ids)]
            else:
                assert (r.output_ids, r.finish_reason) == (w.output_ids, w.finish_reason)


def test_resumed_from_an_overlapped_reply_equals_fresh(hf_tiny_b):
    """The overlapped lane fed its last token before the host knew it was the last: its
    prompt-cache cut holds the whole reply, and the next turn resumed from it equals a fresh
    read of the same ids."""
    first = sample_prompt(1, 50, 300)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    eng = make_engine(hf_tiny_b, parallel=2, overlap=True, prompt_cache_bytes=64 << 20)
    reply = eng.add_request(first, params)
    eng.run_until_done()
    turn = first + reply.output_ids + sample_prompt(2, 20, 300)
    resumed = eng.add_request(turn, params)
    eng.run_until_done()
    assert resumed.cached_tokens == len(first) + len(reply.output_ids)
    fresh_eng = make_engine(hf_tiny_b, parallel=1, overlap=False)
    fresh = fresh_eng.add_request(turn, params)
    fresh_eng.run_until_done()
    assert resumed.output_ids == fresh.output_ids


def test_next_pass_is_launched_before_the_last_tokens_are_read(hf_tiny_b, monkeypatch):
    """The host's order: pass N+1 runs (its decoding rows fed PENDING, written from the device's
    choice) before pass N's tokens are read back."""
    eng = make_engine(hf_tiny_b, parallel=2, overlap=True)
    log = []
    execute, read = eng.runner.execute, overlap.Chosen.read

    def spy_execute(plan):
        pending = sum(t == PENDING for lane in plan for t in lane.token_ids)
        assert pending == (len(plan.fed.rows) if plan.fed is not None else 0)
        log.append(("pass", pending))
        return execute(plan)

    def spy_read(chosen):
        log.append(("read", len(chosen.ready)))
        return read(chosen)

    monkeypatch.setattr(eng.runner, "execute", spy_execute)
    monkeypatch.setattr(overlap.Chosen, "read", spy_read)
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    reqs = [eng.add_request(sample_prompt(i, 9, 300), params) for i in range(2)]
    eng.run_until_done()
    assert all(len(r.output_ids) == 5 for r in reqs)
    # one prompt pass, then every decode pass feeds both lanes' unread tokens before the read;
    # the last pass feeds the last tokens (a finishing lane's catch-up row) and is read after
    assert log[:5] == [("pass", 0), ("pass", 2), ("read", 2), ("pass", 2), ("read", 2)]
    assert log[-2:] == [("pass", 2), ("read", 2)]
    assert [kind for kind, _ in log].count("read") == 5 and len(log) == 11


def test_padding_lanes_move_the_fed_rows_after_them():
    kv = torch.arange(8)
    lane = lambda n: LaneRows("a", 0, 0, (PENDING,) * n, kv, ())  # noqa: E731
    fed = Fed((0, 1, 3), torch.tensor([7, 8, 9]), (2, 0, 1))
    plan = padded(PassPlan((lane(1), lane(1), lane(2)), fed), 5, lane(1), at=2)
    assert plan.fed.rows == (0, 1, 5) and plan.fed.picks == (2, 0, 1)
    ids = torch.zeros(6, dtype=torch.long)
    plan.fed.apply(ids)
    assert ids.tolist() == [9, 7, 0, 0, 0, 8]


def test_fed_rows_in_one_run_write_what_the_index_form_writes():
    """Fed rows and picks that are both runs of consecutive indices (a decode step's usual feed)
    are written by one copy; every such feed, and the others, write what a row-by-row write
    gives, into an int32 buffer as into a long one."""
    tokens = torch.tensor([11, 12, 13, 14, 15])
    feeds = [((0,), (0,)), ((2, 3, 4), (1, 2, 3)), ((1, 2), (4, 3)), ((0, 2), (0, 1)), ((5,), (4,))]
    for rows, picks in feeds:
        for dtype in (torch.long, torch.int32):
            ids = torch.zeros(6, dtype=dtype)
            Fed(rows, tokens, picks).apply(ids)
            want = torch.zeros(6, dtype=dtype)
            for r, p in zip(rows, picks):
                want[r] = tokens[p]
            assert ids.tolist() == want.tolist(), (rows, picks, dtype)


def test_grammar_and_stop_string_replies_under_overlap():
    """The demo model under a grammar (each mask follows the tokens read back so far) and a stop
    string: the overlapped replies equal the sequential ones."""
    tok = Tokenizer(DEMO)
    grammar = Grammar(LLMatcher.grammar_from_lark('start: "{" /[a-z ]{1,12}/ "}"'))
    asks = [
        (
            tok.encode("Reverse the word"),
            SamplingParams(max_tokens=16, temperature=0.0, grammar=grammar),
        ),
        (
            tok.encode("What is"),
            SamplingParams(max_tokens=16, temperature=0.7, seed=3, stop=("e",)),
        ),
        (tok.encode("Hello"), SamplingParams(max_tokens=12, temperature=0.0)),
    ]
    got = _replies(_run(DEMO, asks, True, context=256))
    assert got == _replies(_run(DEMO, asks, False, context=256))
    assert got[0][2].startswith("{") and got[1][1] in ("stop", "length")


def test_overlap_with_a_tensor_split_is_refused_by_name_before_loading(hf_tiny_b):
    """`serve --overlap --tensor-parallel 2`: a named refusal before any weight is read."""
    import subprocess
    import sys

    code = "import sys; from tensorfold.cli import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", code, "serve", str(hf_tiny_b), "--port", "0", "--overlap"]
    done = subprocess.run(
        cmd + ["--tensor-parallel", "2"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "--overlap needs a whole model" in done.stderr
    assert "loading" not in done.stderr


@pytest.mark.parametrize("pattern", ["all_wrong", "every_third_wrong", "all_right"])
def test_drafting_engine_overlaps_while_its_gates_rest(hf_tiny_b, pattern, monkeypatch):
    """A drafting engine overlaps the passes in which every drafting lane's gate rests (no
    drafts, no target states read) and takes plain steps around its verify passes: its tokens
    are the plain engine's, whatever the drafts."""
    from drafting_util import Script

    prompts = [sample_prompt(200 + i, n, 300) for i, n in enumerate((9, 40, 17))]
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    plain = make_engine(hf_tiny_b, parallel=3, overlap=False)
    want = [plain.add_request(ids, params) for ids in prompts]
    plain.run_until_done()
    wrong = {"all_wrong": lambda p: True, "every_third_wrong": lambda p: p % 3 == 2}
    replies = {tuple(ids): r.output_ids for ids, r in zip(prompts, want)}
    fixed_price(monkeypatch)
    eng = make_engine(hf_tiny_b, parallel=3, draft="ngram", overlap=True)
    eng.drafting.default = Script(replies, wrong.get(pattern, lambda p: False))
    overlapped, step = [], eng._overlapped_step
    monkeypatch.setattr(  # counted when it waited for no read: not after an ask's
        eng,
        "_overlapped_step",
        lambda proposed=False: (overlapped.append(1) if not proposed else None) or step(proposed),
    )
    got, steps = [eng.add_request(ids, params) for ids in prompts], 0
    while eng.has_work():
        eng.step()
        steps += 1
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    assert eng.drafting.stats.verifies > 0
    if pattern == "all_wrong":  # closed gates: only a retry's pass waits for the host
        assert len(overlapped) >= steps * 3 // 4, (len(overlapped), steps)


def test_the_rows_a_missed_verify_left_behind_are_read_overlapped(hf_tiny_b, monkeypatch):
    """After a verify pass whose first draft missed, the lane's state is the one before the pass
    and its committed rows are read again; that pass is an overlapped one (its token chosen on
    the device, read in the next step), so a miss costs no sequential step beside the verify
    pass itself. Seeded and greedy replies equal the plain engine's, every draft wrong."""
    from drafting_util import Script

    prompts = [sample_prompt(240 + i, n, 300) for i, n in enumerate((11, 35))]
    params = [
        SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=50, temperature=0.9, seed=4, ignore_eos=True),
    ]
    plain = make_engine(hf_tiny_b, parallel=2, overlap=False)
    want = [plain.add_request(ids, p) for ids, p in zip(prompts, params)]
    plain.run_until_done()
    replies = {tuple(ids): r.output_ids for ids, r in zip(prompts, want)}
    fixed_price(monkeypatch)  # a miss closes the gate: the rows behind are read without drafts
    eng = make_engine(hf_tiny_b, parallel=2, draft="ngram", overlap=True)
    eng.drafting.default = Script(replies, lambda p: True)
    sequential, step = [], eng._step
    eng._step = lambda proposed=False: sequential.append(proposed) or step(proposed)
    behind, execute = [], eng.runner.execute

    def spy(plan):  # lanes fed two or more reply rows and no drafts
        behind.extend(
            lane.start >= len(prompts[0]) and lane.rows > 1 and len(lane.logits) == 1
            for lane in plan
            if lane.key == got[0].request_id  # its prompt's length known
        )
        return execute(plan)

    eng.runner.execute = spy
    got = [eng.add_request(ids, p) for ids, p in zip(prompts, params)]
    eng.run_until_done()
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    assert eng.drafting.stats.verifies > 4 and sum(behind) >= 2, (eng.drafting.stats, behind)
    assert all(sequential), "a step waited for its own pass without drafts in it"


def test_a_drafting_engine_overlaps_the_passes_that_read_prompts(hf_tiny_b, monkeypatch):
    """A lane reading its prompt proposes nothing, so its open gate does not keep the engine's
    prompt passes sequential: they overlap, and the replies are plain's (drafts all right)."""
    from drafting_util import Script

    fixed_price(monkeypatch)
    prompts = [sample_prompt(600 + i, n, 300) for i, n in enumerate((300, 170, 260))]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain = make_engine(hf_tiny_b, parallel=3, overlap=False, chunk=64)
    want = [plain.add_request(ids, params) for ids in prompts]
    plain.run_until_done()
    replies = {tuple(ids): r.output_ids for ids, r in zip(prompts, want)}
    eng = make_engine(hf_tiny_b, parallel=3, draft="ngram", overlap=True, chunk=64)
    eng.drafting.default = Script(replies)
    reading, step = [], eng._overlapped_step
    eng._overlapped_step = lambda proposed=False: (
        reading.append(any(r.in_prompt for r in eng.scheduler.running)) or step(proposed)
    )
    got = [eng.add_request(ids, params) for ids in prompts]
    eng.run_until_done()
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    assert eng.drafting.stats.accepted > 0 and sum(reading) >= 3, reading


def test_an_ask_that_finds_nothing_keeps_the_passes_overlapped(hf_tiny_b, monkeypatch):
    """A lane whose gate asks has its last tokens read first; when its drafter finds nothing,
    the pass is launched as an overlapped one (its tokens chosen on the device and read in the
    next step), not as a plain step that waits for its own pass. The replies are plain's."""
    from tensorfold.drafters.lookup import NgramDrafter

    prompts = [sample_prompt(500 + i, n, 300) for i, n in enumerate((12, 31, 7))]
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    plain = make_engine(hf_tiny_b, parallel=3, overlap=False)
    want = [plain.add_request(ids, params) for ids in prompts]
    plain.run_until_done()
    monkeypatch.setattr(NgramDrafter, "propose", lambda self, tokens, output, k: [])
    monkeypatch.setattr(NgramDrafter, "guesses", False)  # every chance reads its token first
    eng = make_engine(hf_tiny_b, parallel=3, draft="ngram", overlap=True)
    plain_steps, asked = [], []
    step, overlapped = eng._step, eng._overlapped_step
    eng._step = lambda proposed=False: plain_steps.append(1) or step(proposed)
    eng._overlapped_step = lambda proposed=False: asked.append(proposed) or overlapped(proposed)
    got = [eng.add_request(ids, params) for ids in prompts]
    eng.run_until_done()
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    assert not plain_steps and 0 < sum(asked) < len(asked) // 4, (sum(asked), len(asked))


def _count_guessed_passes(eng) -> list[bool]:
    """Per pass of `eng`: whether a lane's first row is unread (fed from the device) and drafts
    follow it."""
    passes, execute = [], eng.runner.execute

    def spy(plan):
        passes.append(any(len(lane.token_ids) > 1 and lane.token_ids[0] == PENDING
                          for lane in plan))  # fmt: skip
        return execute(plan)

    eng.runner.execute = spy
    return passes


def test_a_guessing_lookup_takes_its_chances_overlapped(monkeypatch):
    """An n-gram lookup drafts while the lane's last token is still on the device (its guess of
    that token is the lookup's first): no chance waits for a read, the verify passes are
    launched before the token is read (fed from the device), and the replies are the plain
    engine's (the demo model: a reply that copies its prompt, and one that does not)."""
    from tensorfold.drafters.lookup import NgramDrafter

    tok = Tokenizer(DEMO)
    asks = ("Copy this line: a small red boat sails past the old stone bridge", "What is 17 × 23?")
    prompts = [tok.chat([{"role": "user", "content": q}]) for q in asks]
    params = SamplingParams(max_tokens=40, temperature=0.0)
    plain = make_engine(DEMO, parallel=2, overlap=False)
    want = [plain.add_request(ids, params) for ids in prompts]
    plain.run_until_done()

    def run():
        eng = make_engine(DEMO, parallel=2, draft="ngram", overlap=True)
        asked, overlapped = [], eng._overlapped_step
        eng._overlapped_step = lambda proposed=False: asked.append(proposed) or overlapped(proposed)
        fed_drafts = _count_guessed_passes(eng)
        got = [eng.add_request(ids, params) for ids in prompts]
        eng.run_until_done()
        assert [r.output_ids for r in got] == [r.output_ids for r in want]
        return eng.drafting.stats, sum(asked), sum(fed_drafts)

    stats, waits, guessed = run()
    assert waits == 0 and guessed > 0 and stats.accepted > 0, (waits, guessed, stats)
    monkeypatch.setattr(NgramDrafter, "guesses", False)
    stats_reading, waits_reading, guessed_reading = run()
    assert waits_reading > 0 and guessed_reading == 0 and stats_reading.accepted > 0


@pytest.mark.parametrize("cache", [0, 64 << 20])
def test_a_lane_ending_on_its_unread_token_drops_the_verify_pass(hf_tiny_b, monkeypatch, cache):
    """A verify pass drafted while the lane's last token was unread, and that token ends the
    reply (a stop token): the lane drops its rows of the pass. Its reply equals the plain
    engine's, and with the prompt cache on, the next turn resumed from its cut equals a fresh
    read of the same ids (the cut holds the state before the pass, not its drafts)."""
    from drafting_util import Script

    prompts = [sample_prompt(700 + i, n, 300) for i, n in enumerate((11, 29))]
    free = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    plain = make_engine(hf_tiny_b, parallel=2, overlap=False)
    replies = {tuple(ids): plain.add_request(ids, free) for ids in prompts}
    plain.run_until_done()
    replies = {ids: r.output_ids for ids, r in replies.items()}

    class Guesser(Script):  # a read finds nothing; a guess drafts the reply
        def propose(self, tokens, output, k):
            return []

        def guess(self, tokens, output, k):
            return Script.propose(self, tokens, output, k + 1)[1:]

    def run(params):
        eng = make_engine(
            hf_tiny_b, parallel=2, draft="ngram", overlap=True, prompt_cache_bytes=cache
        )
        eng.drafting.default = Guesser(replies)
        unread, before = [], eng.drafting.before_pass

        def spy(work):  # the reply positions of unread tokens that drafts follow
            for w in work:
                req = w.request
                if req.lane.pending >= 0 and req.drafting:
                    unread.append((tuple(req.prompt_ids), req.num_tokens - 1 - len(req.prompt_ids)))
            return before(work)

        eng.drafting.before_pass = spy
        got = [eng.add_request(ids, params) for ids in prompts]
        eng.run_until_done()
        return eng, got, unread

    fixed_price(monkeypatch)
    first = replies[tuple(prompts[0])]
    _, _, unread = run(free)
    at = next(  # the stop's first place: past the first few tokens, drafts after it
        j for ids, j in unread if ids == tuple(prompts[0]) and j > 4 and first[j] not in first[:j]
    )
    params = SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=(first[at],))
    plain = make_engine(hf_tiny_b, parallel=2, overlap=False)
    want = [plain.add_request(ids, params) for ids in prompts]
    plain.run_until_done()
    eng, got, _ = run(params)
    assert [(r.output_ids, r.finish_reason) for r in got] == [
        (r.output_ids, r.finish_reason) for r in want
    ]
    assert got[0].output_ids == first[: at + 1] and got[0].finish_reason == "stop"
    if not cache:
        return
    turn = prompts[0] + got[0].output_ids + sample_prompt(9, 12, 300)
    fresh_eng = make_engine(hf_tiny_b, parallel=1, overlap=False)
    fresh = fresh_eng.add_request(turn, free)
    fresh_eng.run_until_done()
    replies[tuple(turn)] = fresh.output_ids  # the drafter's script for the next turn
    resumed = eng.add_request(turn, free)
    eng.run_until_done()
    assert resumed.cached_tokens == len(prompts[0]) + at  # all but the stop, which was unread
    assert resumed.output_ids == fresh.output_ids


def test_a_predicted_reply_drafts_overlapped(hf_tiny_b):
    """A client's prediction (Predicted Outputs) guesses the unread token too: its verify passes
    are launched before the token is read, and the reply is the plain engine's."""
    ids = sample_prompt(810, 23, 300)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain = make_engine(hf_tiny_b, parallel=1, overlap=False)
    want = plain.add_request(ids, params)
    plain.run_until_done()
    reply = want.output_ids
    prediction = reply[:12] + [(t + 5) % 300 for t in reply[12:15]] + reply[15:]
    eng = make_engine(hf_tiny_b, parallel=1, overlap=True)
    fed_drafts = _count_guessed_passes(eng)
    got = eng.add_request(ids, params, prediction=prediction)
    eng.run_until_done()
    assert got.output_ids == reply
    d = got.lane.draft
    assert d.prediction_accepted > 10 and d.prediction_rejected > 0 and any(fed_drafts)
