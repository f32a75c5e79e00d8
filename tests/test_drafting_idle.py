"""What a lane with nothing to draft costs the host. While every lane's gate stays closed the
engine counts their chances once a step (`Lull`), not lane by lane; a lookup indexes its prompt
as the prompt's chunks are read, not all at its first chance. Neither changes a decision: the
proposals, the verify passes, the overlapped steps and the gates' records are the ones that
lane-by-lane counting and a lookup's own indexing give."""

import pytest
from drafting_util import Script, fixed_price, plain_replies
from engine_util import make_engine, sample_prompt

from tensorfold.drafters.gate import Lull
from tensorfold.drafters.lookup import NgramDrafter, NgramIndex
from tensorfold.engine.request import SamplingParams


class Patchy(Script):
    """Right drafts in some stretches of the reply, wrong ones in others, nothing in the rest:
    the gates open, close, back off and find nothing, lane by lane."""

    guesses = False  # every chance reads its token first: the engine's asks are exercised too

    def __init__(self, replies) -> None:
        super().__init__(replies, wrong=lambda p: (p // 9) % 3 == 1)

    def propose(self, tokens, output, k):
        return [] if (len(output) // 9) % 3 == 2 else super().propose(tokens, output, k)


def _trace(path, prompts, params, replies, overlap: bool) -> tuple:
    """Three requests on two lanes (the third joins when one ends): every verify pass's
    proposals by step, each step's overlap mode, the tokens and the drafting records."""
    eng = make_engine(path, parallel=2, draft="ngram", overlap=overlap)
    eng.drafting.default = Patchy(replies)
    proposals, modes, step_no = [], [], [0]
    before, mode = eng.drafting.before_pass, eng._overlap_mode

    def spy_before(work):
        drafted = [(w.request.request_id, tuple(w.request.lane.draft.proposal)) for w in work
                   if w.request.drafting]  # fmt: skip
        if drafted:
            proposals.append((step_no[0], drafted))
        return before(work)

    eng.drafting.before_pass = spy_before
    eng._overlap_mode = lambda: modes.append(mode()) or modes[-1]
    reqs = [eng.add_request(ids, params) for ids in prompts]
    while eng.has_work():
        eng.step()
        step_no[0] += 1
    s, h = eng.drafting.stats, eng.drafting.history
    records = (s.proposed, s.accepted, s.verifies, s.lengths, h.kept, h.tried, h.closed_starts)
    return [r.output_ids for r in reqs], proposals, modes, records


@pytest.mark.parametrize("overlap", [True, False])
def test_a_lull_keeps_every_gate_decision(hf_tiny_b, monkeypatch, overlap):
    """The same requests with the lull and with every chance counted lane by lane: the same
    proposals at the same steps, the same overlap modes, the same records, the plain tokens;
    the lull held for most steps. Planted: a lull that hands the gates one chance too few at
    its end is caught (the gates open a chance late)."""
    prompts, params, want, replies = plain_replies(hf_tiny_b, 610, (9, 30, 14), 90)
    fixed_price(monkeypatch)
    held, holds = [0], Lull.holds

    def counted(self, running):
        found = holds(self, running)
        held[0] += found
        return found

    monkeypatch.setattr(Lull, "holds", counted)
    lulled = _trace(hf_tiny_b, prompts, params, replies, overlap)
    assert lulled[0] == [r.output_ids for r in want]
    assert lulled[1] and held[0] > len(lulled[2]) // 4, (held, len(lulled[2]))
    with monkeypatch.context() as m:
        m.setattr(Lull, "begin", lambda self, running: None)
        counted_apart = _trace(hf_tiny_b, prompts, params, replies, overlap)
    assert counted_apart == lulled
    end = Lull.end

    def short(self):
        self.owed = max(0, self.owed - 1)
        end(self)

    monkeypatch.setattr(Lull, "end", short)
    assert _trace(hf_tiny_b, prompts, params, replies, overlap)[1:] != lulled[1:]


def test_a_lookup_indexes_its_prompt_as_the_prompt_is_read(hf_tiny_b, monkeypatch):
    """A 150-token prompt read in chunks of 32: the lane's lookup table grows with each chunk, its
    first chance indexes only the tokens since, and the table is the one a lookup over the whole
    sequence builds. Planted: without the prompt's reads the first chance indexes all of it."""
    prompt = sample_prompt(7, 150, 300)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    calls, update = [], NgramIndex.update

    def spy(self, tokens, upto=None):
        seen = self.seen
        update(self, tokens, upto)
        calls.append((seen, self.seen))

    monkeypatch.setattr(NgramIndex, "update", spy)

    def run():
        calls.clear()
        eng = make_engine(hf_tiny_b, parallel=1, draft="ngram", chunk=32)
        req = eng.add_request(prompt, params)
        eng.run_until_done()
        return req

    req = run()
    assert [seen for _, seen in calls[:5]] == [32, 64, 96, 128, 150]
    first_chance = calls[5]
    assert first_chance[1] - first_chance[0] < 32, calls
    whole = NgramIndex(req.lane.draft.drafters[-1].index.sizes)
    update(whole, list(req.all_ids), calls[-1][1])
    assert req.lane.draft.drafters[-1].index.ends == whole.ends
    monkeypatch.setattr(NgramDrafter, "read_prompt", lambda self, prompt, upto: None)
    run()
    assert calls[0][0] == 0 and calls[0][1] > len(prompt), calls[:2]
