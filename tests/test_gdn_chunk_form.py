"""The chunk form of the gated delta rule (--gdn-form chunk) on the CPU: its arithmetic against
the per-token recurrence, and every engine invariant of docs/exactness.md, bitwise, under it:
any prompt chunking, decode = prefill, concurrent = solo, resumed = fresh, drafted = plain."""

import pytest
import torch
from engine_util import (
    decoded_logits,
    finish_prints,
    make_engine,
    position_logits,
    sample_prompt,
)

from tensorfold.batch import Segment
from tensorfold.cache.state_pool import StatePool
from tensorfold.engine import fingerprint
from tensorfold.engine.fingerprint import system_fingerprint
from tensorfold.engine.request import SamplingParams
from tensorfold.ops import gated_delta as ref
from tensorfold.ops.norm import l2_norm
from tensorfold.runner.plan import PassPlan
from tensorfold.tools.run import generate_once

GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=20, temperature=0.9, top_p=0.95, seed=5, ignore_eos=True)
SHAPE = ref.GDNShape(2, 4, 16, 8)
CONV = 2 * SHAPE.key_dim + SHAPE.value_dim


def _chunked(cuts, x, g, beta):
    pool = StatePool(1, 2, 4, CONV, 4, 16, 8, torch.float32, torch.device("cpu"), ref.CHUNK)
    outs, start = [], 0
    for c in cuts:
        seg = Segment(1, start, 0, c, None)
        r = slice(start, start + c)
        outs.append(ref.gated_delta_lanes(x[r], g[r], beta[r], pool.layer(0), SHAPE, (seg,)))
        start += c
    return torch.cat(outs), pool.slot_bytes(1, start)


def test_chunk_arithmetic_is_the_recurrence_and_cut_free():
    torch.manual_seed(0)
    n = 150
    x, g, beta = torch.randn(n, CONV), -torch.rand(n, 4) * 0.5, torch.rand(n, 4)
    whole, state = _chunked([n], x, g, beta)
    for cuts in ([37] * 4 + [2], [1] * n, [64, 64, 22], [63, 2, 85]):
        out, other = _chunked(cuts, x, g, beta)
        assert torch.equal(out, whole), cuts
        assert all(torch.equal(a, b) for a, b in zip(state, other)), cuts
    q, k, v = x.split([SHAPE.key_dim, SHAPE.key_dim, SHAPE.value_dim], dim=-1)
    qs = (l2_norm(q.view(n, 2, 16)) / 4).repeat_interleave(2, 1)
    ks = l2_norm(k.view(n, 2, 16)).repeat_interleave(2, 1)
    rec = torch.zeros(4, 16, 8)
    want = ref.gated_delta_rule(rec, qs, ks, v.view(n, 4, 8), g.exp(), beta)
    assert (want - whole).abs().max() < 1e-5  # the same function, rounded another way
    assert not torch.equal(want, whole)


def test_chunk_bits_do_not_depend_on_the_heads_beside_it():
    """A rank of a split holds fewer heads (four ranks of hf_tiny: one): each head's output and
    end state are the same bits in a call of 1, 2 or all heads."""
    torch.manual_seed(1)
    n, h, d = ref.CHUNK, 4, 16
    q, k = (l2_norm(torch.randn(n, h, d)) for _ in range(2))
    v, g, beta = torch.randn(n, h, d), -torch.rand(n, h) * 0.5, torch.rand(n, h)
    state = torch.randn(h, d, d) * 0.1
    o, end = ref.chunk(state, q / 4, k, v, g, beta)
    for per in (1, 2):
        for h0 in range(0, h, per):
            r = slice(h0, h0 + per)
            oo, ee = ref.chunk(state[r], q[:, r] / 4, k[:, r], v[:, r], g[:, r], beta[:, r])
            assert torch.equal(oo, o[:, r]) and torch.equal(ee, end[r]), (per, h0)


def _chunk_engine(path, **config):
    return make_engine(path, gdn_form="chunk", **config)


@pytest.mark.parametrize("chunk", [37, 16])
def test_chunk_form_seams(hf_tiny_b, chunk):
    ids = sample_prompt(8, 300, 300)
    ref_req, want = generate_once(_chunk_engine(hf_tiny_b, chunk=128), ids, GREEDY, seams=128)
    req, got = generate_once(_chunk_engine(hf_tiny_b, chunk=chunk), ids, GREEDY, seams=128)
    assert want == got and ref_req.output_ids == req.output_ids


def test_chunk_form_decode_equals_prefill(hf_tiny_b):
    ids = sample_prompt(9, 40, 300)
    req, decoded = decoded_logits(_chunk_engine(hf_tiny_b), ids, GREEDY)
    full = ids + req.output_ids[:-1]
    assert torch.equal(decoded, position_logits(_chunk_engine(hf_tiny_b), full)[len(ids) :])


def _run(eng, prompts, params):
    prints, reqs, pending = {}, [], list(prompts)
    while pending or eng.has_work():
        if pending:
            reqs.append(eng.add_request(pending.pop(0), params, watch=finish_prints(eng, prints)))
        eng.step()
    return [(r.output_ids, prints[r.request_id]) for r in reqs]


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_chunk_form_concurrent_equals_solo_and_drafted_equals_plain(hf_tiny_b, params):
    prompts = [sample_prompt(300 + i, n, 300) for i, n in enumerate((5, 70, 130, 64))]
    solo = [_run(_chunk_engine(hf_tiny_b, parallel=1), [p], params)[0] for p in prompts]
    assert _run(_chunk_engine(hf_tiny_b, parallel=4), prompts, params) == solo
    drafted = _chunk_engine(hf_tiny_b, parallel=4, draft="ngram", prompt_cache_bytes=1 << 24)
    assert _run(drafted, prompts, params) == solo


def test_chunk_form_resumed_equals_fresh(hf_tiny_b):
    shared = sample_prompt(11, 200, 300)
    ids = shared + sample_prompt(12, 30, 300)
    fresh = _run(_chunk_engine(hf_tiny_b, parallel=1), [ids], GREEDY)
    eng = _chunk_engine(hf_tiny_b, parallel=1, prompt_cache_bytes=1 << 24)
    _run(eng, [shared], GREEDY)  # leaves a cut at the shared prefix's end
    assert _run(eng, [ids], GREEDY) == fresh
    assert eng.stats().cache_hits > 0, "the second request resumed from the prompt cache"


def test_forms_differ_in_bits_not_in_tokens_much(hf_tiny_b):
    ids = sample_prompt(14, 90, 300)
    a = position_logits(make_engine(hf_tiny_b), ids)
    b = position_logits(_chunk_engine(hf_tiny_b), ids)
    assert (a - b).abs().max() < 1e-3 * a.abs().max()


def test_grid_and_rows_forms_are_the_chunk_reference_on_the_cpu(hf_tiny_b, monkeypatch):
    """`grid` and `rows` differ from `chunk` only in the GPU's kernels: the CPU computes all three
    with one reference, so their bits and fingerprints agree there, while a GPU names each."""
    ids = sample_prompt(15, 90, 300)
    chunk = position_logits(_chunk_engine(hf_tiny_b), ids)
    for form in ("grid", "rows"):
        assert torch.equal(position_logits(make_engine(hf_tiny_b, gdn_form=form), ids), chunk)
    fp = {f: system_fingerprint(hf_tiny_b, torch.float32, "cpu", "d", f) for f in ref.FORMS}
    assert fp["grid"] == fp["rows"] == fp["chunk"] != fp["recurrence"]
    monkeypatch.setattr(fingerprint, "device_class", lambda device: "cuda:a card:sm90")
    gpu = {f: system_fingerprint(hf_tiny_b, torch.bfloat16, "cuda", "d", f) for f in ref.FORMS}
    assert len(set(gpu.values())) == len(ref.FORMS) == 4
    with pytest.raises(ValueError, match="gdn form 'wy'"):
        make_engine(hf_tiny_b, gdn_form="wy")


def test_grid_form_refuses_a_shape_its_kernel_cannot_run():
    """Named at engine start on a GPU, not at the first pass: head dims its tiles cannot hold."""
    assert ref.grid_kernel_refuses(ref.GDNShape(16, 32, 128, 128)) is None
    assert "dk=12" in ref.grid_kernel_refuses(ref.GDNShape(2, 4, 12, 16))
    assert "Hk=3 Hv=4" in ref.grid_kernel_refuses(ref.GDNShape(3, 4, 16, 16))


def test_grid_form_on_a_gpu_only_at_the_head_dims_its_kernel_passed_at(hf_tiny_b, monkeypatch):
    """An engine on a GPU names the tiny model's head dims instead of starting (the kernel has
    passed on a card at 128 only); the 9B's are accepted; the CPU, which runs the reference,
    keeps the form at any shape."""
    from tensorfold.models.loader import load_model

    assert ref.grid_card_refuses(ref.GDNShape(16, 32, 128, 128)) is None
    assert "dk=64 dv=64" in ref.grid_card_refuses(ref.GDNShape(16, 32, 64, 64))
    assert "dk=12" in ref.grid_card_refuses(ref.GDNShape(2, 4, 12, 16))  # the kernel's own limit
    model = load_model(hf_tiny_b)
    model.set_gdn_form("grid")  # on the CPU
    monkeypatch.setattr(model, "device", torch.device("cuda"))
    with pytest.raises(ValueError, match="head dims of 128"):
        model.set_gdn_form("grid")
    model.set_gdn_form("chunk")  # the other forms are unaffected


def test_the_chunk_forms_refuse_to_leave_a_state_in_another_slot(hf_tiny_b):
    """A pass whose lane reads one slot and writes another (a verify pass in the per-token form)
    is refused by name in the chunk forms, whose kernels keep each lane's state in its slot."""
    eng = _chunk_engine(hf_tiny_b)
    req = eng.add_request(sample_prompt(3, 9, 300), GREEDY)
    eng.step()  # the prompt's pass
    req.lane.writes = eng.caches.states.allocate()
    with pytest.raises(ValueError, match="chunk form keeps each lane's state in its own slot"):
        eng.runner.execute(PassPlan((req.rows(1, range(1)),)))
