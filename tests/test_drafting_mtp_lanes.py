"""The MTP head over many proposing lanes at once (drafters/mtp_lanes.py): each lane gets the
drafts it gets alone through the same passes (the layers' kernels give a row the same bits beside
other lanes), and drafted = plain bitwise."""

import pytest
from drafting_util import drafted_run
from test_drafting_mtp import GREEDY, with_head


@pytest.fixture(scope="module")
def hf_mtp(hf_tiny_b, tmp_path_factory):
    return with_head(hf_tiny_b, tmp_path_factory.mktemp("mtp_lanes") / "hf_mtp", seed=3)


def _batched(hf_mtp, monkeypatch, params, parallel):
    """A drafted run in which every lane proposes at every chance (gates held open), always
    through the many-lane passes: (the replies, every proposal by (prompt, tokens so far, k),
    the lanes of each call)."""
    from tensorfold.drafters import mtp, mtp_lanes
    from tensorfold.drafters.gate import Gate

    monkeypatch.setattr(mtp.MTPDrafter, "batches", lambda self, lanes: True)
    monkeypatch.setattr(Gate, "open", lambda self: True)
    monkeypatch.setattr(Gate, "resting", lambda self: False)  # held open: never resting
    real, seen, calls = mtp_lanes.propose_lanes, {}, []  # the module's own, never a spy

    def spy(drafter, asks):
        out = real(drafter, asks)
        calls.append(len(asks))
        for (lane, tokens, k), drafts in zip(asks, out):
            seen[(tuple(lane.req.prompt_ids), len(tokens), k)] = drafts
        return out

    monkeypatch.setattr(mtp, "propose_lanes", spy)
    got, eng = drafted_run(hf_mtp, params, parallel, "mtp", first_seed=70)
    return got, seen, calls, eng


def test_lanes_proposing_together_draft_what_each_drafts_alone(hf_mtp, monkeypatch):
    """(Drafts are the head's argmax whatever the sampling, so greedy replies suffice.)"""
    params = GREEDY
    want, _ = drafted_run(hf_mtp, params, 1, None, first_seed=70)
    got, together, calls, eng = _batched(hf_mtp, monkeypatch, params, 4)
    assert got == want and eng.drafting.stats.proposed > 0
    assert sum(n > 1 for n in calls) >= 10  # lanes proposed in one call
    _, alone, _, _ = _batched(hf_mtp, monkeypatch, params, 1)
    assert together.keys() == alone.keys() and together == alone
