"""The invariants of docs/exactness.md on tiny MoE checkpoints (CPU), bitwise, and the routing
contract ('Experts'): ties to the lowest expert id, a planted router that breaks ties otherwise
caught."""

import pytest
import torch
from engine_util import decoded_logits, finish_prints, make_engine, position_logits, sample_prompt
from moe_util import contract_selection, recorded

from tensorfold.engine.request import SamplingParams
from tensorfold.ops import moe as ref_moe
from tensorfold.tools.run import generate_once

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=77, ignore_eos=True)
TOP_K = 4


def _prompts() -> list[list[int]]:
    return [sample_prompt(300 + i, n, 300) for i, n in enumerate((5, 37, 130, 9))]


def _solo(path, prompts, params, dtype):
    out = []
    for ids in prompts:
        eng, prints = make_engine(path, dtype=dtype, parallel=1), {}
        req = eng.add_request(ids, params, watch=finish_prints(eng, prints))
        eng.run_until_done()
        out.append((req.output_ids, prints[req.request_id]))
    return out


def _together(path, prompts, params, dtype):
    """A new request every other pass while the earlier ones run: prompt and decode rows of
    several lanes share passes, and so share experts."""
    eng, prints, reqs, pending = make_engine(path, dtype=dtype, parallel=4), {}, [], list(prompts)
    while pending or eng.has_work():
        if pending:
            reqs.append(eng.add_request(pending.pop(0), params, watch=finish_prints(eng, prints)))
        eng.step()
        eng.step()
    return [(r.output_ids, prints[r.request_id]) for r in reqs]


def _shares_and_differs(ids: torch.Tensor) -> bool:
    """Some expert serves several rows of the call, and some rows chose different experts."""
    return (
        int(torch.bincount(ids.flatten()).max()) > 1 and len({tuple(r) for r in ids.tolist()}) > 1
    )


@pytest.mark.parametrize(
    "name,dtype", [("hf_moe_fused", torch.float32), ("mlx_moe_mixed", torch.bfloat16)]
)
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_concurrent_equals_solo(name, dtype, params, request):
    path, prompts = request.getfixturevalue(name), _prompts()
    solo = _solo(path, prompts, params, dtype)
    with recorded() as log:
        together = _together(path, prompts, params, dtype)
    assert any(_shares_and_differs(ids) for ids in log.ids)
    assert together == solo  # token ids and end-of-reply fingerprints


@pytest.mark.parametrize("chunk", [37, 16])
def test_chunk_invariant_seams(hf_moe_fused, chunk):
    ids = sample_prompt(8, 300, 300)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    ref_req, ref = generate_once(make_engine(hf_moe_fused, chunk=128), ids, params, seams=128)
    req, other = generate_once(make_engine(hf_moe_fused, chunk=chunk), ids, params, seams=128)
    assert [(label, pos) for label, pos, _ in ref] == [
        ("seam", 128),
        ("seam", 256),
        ("prompt end", 300),
        ("reply end", 315),
    ]
    assert other == ref
    assert req.output_ids == ref_req.output_ids


@pytest.mark.parametrize(
    "name,dtype", [("hf_moe_fused", torch.float32), ("mlx_moe_q4", torch.bfloat16)]
)
def test_decode_equals_prefill(name, dtype, request):
    path, ids = request.getfixturevalue(name), sample_prompt(9, 40, 300)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    req, decoded = decoded_logits(make_engine(path, dtype=dtype), ids, params)
    prefilled = position_logits(make_engine(path, dtype=dtype), ids + req.output_ids[:-1])[
        len(ids) :
    ]
    assert torch.equal(decoded, prefilled)


# -- the routing contract on exact ties ------------------------------------------------------


def _violations(log) -> int:
    return sum(
        ids.tolist() != contract_selection(logits, TOP_K)
        for logits, ids in zip(log.logits, log.ids)
    )


def _ties_to_the_highest_id(logits, top_k):
    """Planted: the same ranking with equal probabilities taken from the highest id down."""
    flipped = ref_moe.route(logits.flip(-1), top_k)
    ids = (logits.shape[-1] - 1 - flipped.ids).flip(-1)
    return ref_moe.Route(ids, flipped.weights.flip(-1))


def _ties_by_place_in_pass(logits, top_k):
    """Planted: ties broken by the row's place in the pass (odd rows take the highest id)."""
    low, high = ref_moe.route(logits, top_k), _ties_to_the_highest_id(logits, top_k)
    odd = (torch.arange(logits.shape[0]) % 2 == 1)[:, None]
    return ref_moe.Route(
        torch.where(odd, high.ids, low.ids), torch.where(odd, high.weights, low.weights)
    )


def test_router_ties_go_to_the_lowest_expert_id(hf_moe_ties):
    """Router rows equal in runs of three: most rows meet an exact tie at the 4th place, and every
    choice follows the contract written out independently (moe_util.contract_selection)."""
    ids = sample_prompt(10, 48, 300)
    with recorded() as log:
        position_logits(make_engine(hf_moe_ties), ids)
    probs = [torch.softmax(lg.float(), -1).sort(-1, descending=True).values for lg in log.logits]
    assert sum(int((p[:, TOP_K - 1] == p[:, TOP_K]).sum()) for p in probs) > 50  # ties did occur
    assert _violations(log) == 0


def test_planted_tie_break_is_caught(hf_moe_ties):
    """A router that breaks ties from the highest id is still company-blind, so only the contract
    check can catch it; it does, and the logits move."""
    ids = sample_prompt(10, 48, 300)
    real = position_logits(make_engine(hf_moe_ties), ids)
    with recorded(route=_ties_to_the_highest_id) as log:
        planted = position_logits(make_engine(hf_moe_ties), ids)
    assert _violations(log) > 0
    assert not torch.equal(planted, real)


def test_planted_company_dependent_tie_break_is_caught(hf_moe_ties):
    """A tie-break that follows the row's place in the pass breaks decode = prefill."""
    ids = sample_prompt(11, 40, 300)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    req, real = decoded_logits(make_engine(hf_moe_ties), ids, params)
    prefilled = position_logits(make_engine(hf_moe_ties), ids + req.output_ids[:-1])[len(ids) :]
    assert torch.equal(real, prefilled)  # the real router keeps it
    with recorded(route=_ties_by_place_in_pass):
        req, decoded = decoded_logits(make_engine(hf_moe_ties), ids, params)
        prefilled = position_logits(make_engine(hf_moe_ties), ids + req.output_ids[:-1])[len(ids) :]
    assert not torch.equal(decoded, prefilled)
