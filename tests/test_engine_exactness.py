"""The invariants of docs/exactness.md on the CPU backend, bitwise."""

import pytest
import torch
from engine_util import (
    GREEDY,
    decoded_logits,
    finish_prints,
    make_engine,
    position_logits,
    sample_prompt,
)

from tensorfold.engine.request import SamplingParams
from tensorfold.tools.run import generate_once

SAMPLED = SamplingParams(
    max_tokens=16, temperature=0.9, top_p=0.95, top_k=50, seed=1234, ignore_eos=True
)


def _prompts(vocab: int) -> list[list[int]]:
    return [sample_prompt(100 + i, n, vocab) for i, n in enumerate((5, 37, 130, 64, 9, 200))]


def _solo(path, prompts, params, dtype=torch.float32):
    out = []
    for ids in prompts:
        eng = make_engine(path, dtype=dtype, parallel=1)
        prints = {}
        req = eng.add_request(ids, params, watch=finish_prints(eng, prints))
        eng.run_until_done()
        out.append((req.output_ids, prints[req.request_id]))
    return out


def _together(path, prompts, params, parallel, dtype=torch.float32):
    """Requests arrive staggered: a new one every other pass, while earlier ones run."""
    eng = make_engine(path, dtype=dtype, parallel=parallel)
    reqs, pending = [], list(prompts)
    prints = {}
    while pending or eng.has_work():
        if pending:
            r = eng.add_request(pending.pop(0), params, watch=finish_prints(eng, prints))
            reqs.append(r)
        eng.step()
        eng.step()
    return [(r.output_ids, prints[r.request_id]) for r in reqs]


@pytest.mark.parametrize("parallel", [1, 2, 4])
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_concurrent_equals_solo(hf_tiny_b, parallel, params):
    prompts = _prompts(300)
    solo = _solo(hf_tiny_b, prompts, params)
    together = _together(hf_tiny_b, prompts, params, parallel)
    for (ids_a, fp_a), (ids_b, fp_b) in zip(solo, together):
        assert ids_a == ids_b
        # The end-of-reply fingerprint also covers the lane's states and KV rows.
        assert fp_a == fp_b


def test_concurrent_equals_solo_bf16(hf_tiny):
    prompts = _prompts(300)[:4]
    assert _solo(hf_tiny, prompts, GREEDY, torch.bfloat16) == _together(
        hf_tiny, prompts, GREEDY, 4, torch.bfloat16
    )


def test_sampling_depends_on_seed_not_company(hf_tiny_b):
    ids = sample_prompt(7, 20, 300)
    a = _solo(hf_tiny_b, [ids], SAMPLED)[0][0]
    b = _solo(hf_tiny_b, [ids], SamplingParams(**{**SAMPLED.__dict__, "seed": 99}))[0][0]
    assert a != b  # a different seed draws different tokens; the same seed is tested above


@pytest.mark.parametrize("chunk", [37, 16])
def test_chunk_invariant_seams(hf_tiny_b, chunk):
    ids = sample_prompt(8, 700, 300)
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    ref_req, ref = generate_once(make_engine(hf_tiny_b, chunk=128), ids, params, seams=256)
    req, other = generate_once(make_engine(hf_tiny_b, chunk=chunk), ids, params, seams=256)
    labels = [(label, pos) for label, pos, _ in ref]
    assert labels == [("seam", 256), ("seam", 512), ("prompt end", 700), ("reply end", 731)]
    assert ref == other
    assert ref_req.output_ids == req.output_ids


def test_decode_equals_prefill(hf_tiny_b):
    ids = sample_prompt(9, 40, 300)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    req, decoded = decoded_logits(make_engine(hf_tiny_b), ids, params)
    full = ids + req.output_ids[:-1]
    prefilled = position_logits(make_engine(hf_tiny_b), full)[len(ids) :]
    assert torch.equal(decoded, prefilled)


def test_cancel_mid_prompt_and_mid_decode(hf_tiny_b):
    prompts = _prompts(300)[:3]
    solo = _solo(hf_tiny_b, prompts, GREEDY)
    eng = make_engine(hf_tiny_b, parallel=4, chunk=16)
    decoding = eng.add_request(
        sample_prompt(12, 4, 300), SamplingParams(max_tokens=200, temperature=0.0)
    )
    long_prompt = eng.add_request(sample_prompt(11, 300, 300), GREEDY)
    keep = [eng.add_request(p, GREEDY) for p in prompts]
    eng.step()
    eng.step()
    eng.step()
    assert long_prompt.in_prompt and not decoding.in_prompt
    eng.cancel(long_prompt.request_id)
    eng.cancel(decoding.request_id)
    eng.run_until_done()
    assert long_prompt.finish_reason == decoding.finish_reason == "cancelled"
    assert [r.output_ids for r in keep] == [s[0] for s in solo]
    assert eng.caches.kv.free_pages == eng.caches.kv.num_pages
    assert eng.caches.states.free_slots == eng.caches.states.num_slots


def test_request_past_context_is_refused_and_engine_keeps_serving(hf_tiny_b):
    from tensorfold.errors import ContextOverflow

    eng = make_engine(hf_tiny_b, context=64)
    with pytest.raises(ContextOverflow, match="max_tokens"):
        eng.add_request(sample_prompt(1, 60, 300), SamplingParams(max_tokens=8))
    req = eng.add_request(sample_prompt(1, 20, 300), GREEDY)
    eng.run_until_done()
    assert len(req.output_ids) == GREEDY.max_tokens


def test_planted_fault_is_caught(hf_tiny_b, monkeypatch):
    """Let the matmul see the pass's row count (a plain torch.mm): the invariants must break."""
    import tensorfold.ops.linear as lin

    def batch_dependent(x, w, out=None, tile=None):
        return torch.mm(x, w.t())

    monkeypatch.setattr(lin, "matmul_rows", batch_dependent)
    ids = sample_prompt(9, 40, 300)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    req, decoded = decoded_logits(make_engine(hf_tiny_b), ids, params)
    prefilled = position_logits(make_engine(hf_tiny_b), ids + req.output_ids[:-1])[len(ids) :]
    assert not torch.equal(decoded, prefilled)


def test_incremental_text_equals_decoding_the_whole_reply(hf_tiny):
    from tensorfold.engine.text import Detokenizer
    from tensorfold.tokenizer import Tokenizer

    tok = Tokenizer(hf_tiny)
    ids = tok.encode("naïve café — 17 × 23 = 391 ✓ 日本") + [502] + tok.encode(" done")
    d = Detokenizer()
    for n in range(1, len(ids) + 1):
        d.add(tok, ids[:n], final=n == len(ids))
    assert d.text == tok.decode(ids)


def test_the_non_exact_variant_is_refused_on_the_cpu(hf_tiny):
    from benchmark_modules import inexact

    with pytest.raises(ValueError, match="the non-exact variant swaps in GPU kernels"):
        inexact.make_inexact(make_engine(hf_tiny).model)


def test_the_non_exact_variants_decode_rows_run_the_exact_recurrence(hf_tiny_b):
    """Its GDN layers keep the exact layer's core for one-row-a-lane passes (the form the CPU can
    run): swapped in after the prompt, the tokens and fingerprints equal the exact engine's."""
    from benchmark_modules import inexact

    ids, params = (
        sample_prompt(72, 30, 300),
        SamplingParams(max_tokens=12, temperature=0.8, seed=3, ignore_eos=True),
    )
    [want] = _solo(hf_tiny_b, [ids], params)
    eng = make_engine(hf_tiny_b, dtype=torch.float32, parallel=1)
    prints = {}
    req = eng.add_request(ids, params, watch=finish_prints(eng, prints))
    while not req.output_ids:
        eng.step()
    swapped = [m for m in (layer.mixer for layer in eng.model.layers) if hasattr(m, "core")]
    for mixer in swapped:
        mixer.__class__ = inexact.ChunkedGDN
    eng.run_until_done()
    assert swapped and (req.output_ids, prints[req.request_id]) == want


def test_prompt_admitted_beside_a_stream_in_capped_passes(hf_tiny_b):
    """A long prompt arriving while a stream decodes is read 6 rows a pass beside it
    (mixed_chunk), 64 a pass once alone: both requests' tokens and fingerprints equal solo."""
    stream_ids, long_ids = sample_prompt(70, 5, 300), sample_prompt(71, 400, 300)
    params = SamplingParams(max_tokens=40, temperature=0.8, seed=4, ignore_eos=True)
    solo = _solo(hf_tiny_b, [stream_ids, long_ids], params)
    eng = make_engine(hf_tiny_b, parallel=2, chunk=64, mixed_chunk=6)
    prints = {}
    stream = eng.add_request(stream_ids, params, watch=finish_prints(eng, prints))
    while len(stream.output_ids) < 3:
        eng.step()
    long_req = eng.add_request(long_ids, params, watch=finish_prints(eng, prints))
    eng.step()
    eng.step()
    assert long_req.lane.computed == 12  # two capped passes beside the stream
    eng.run_until_done()
    got = [(r.output_ids, prints[r.request_id]) for r in (stream, long_req)]
    assert got == solo
