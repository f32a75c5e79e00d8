"""GPU checks (skipped without CUDA): the kernel registry with its planted controls, and every
invariant of docs/exactness.md bitwise at the 9B shape with random weights."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
pytest.importorskip(
    "fla",
    reason="the registry's planted control and the non-exact variant run fla's chunked kernel",
)

from engine_util import (
    decoded_logits,
    finish_prints,
    make_engine,
    position_logits,  # noqa: E402
    sample_prompt,
)

from tensorfold.engine.request import SamplingParams  # noqa: E402
from tensorfold.tools.run import generate_once  # noqa: E402

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
VOCAB = 248320


from tensorfold.checks.registry import names as registry_names  # noqa: E402


@pytest.mark.parametrize("kernel", registry_names())
def test_kernel_registry_and_controls(kernel):
    """Each kernel apart (the whole registry runs for minutes): its checks and its controls."""
    from tensorfold.checks.registry import run_all

    lines, ok = run_all(small=False, only=kernel, exact=True)
    print("\n".join(lines))
    assert ok, "\n".join(lines)


ENGINE = {"parallel": 16, "context": 2048, "chunk": 128}  # the 9B engines' settings


@pytest.fixture(autouse=True, scope="module")
def _gdn_form(pytestconfig):
    """Every 9B engine in --gdn-form (each form keeps every invariant)."""
    ENGINE["gdn_form"] = pytestconfig.getoption("--gdn-form")


def _engine(model, **kw):
    from tensorfold.engine.engine import Engine, EngineConfig

    return Engine(model, None, EngineConfig(**{**ENGINE, **kw}))


@pytest.mark.parametrize("parallel", [1, 4, 16])
def test_concurrent_equals_solo_9b(nine_b, parallel):
    prompts = [sample_prompt(200 + i, 20 + 37 * i, VOCAB) for i in range(parallel)]
    solo = []
    for p in prompts[:4]:
        eng = _engine(nine_b, parallel=1)
        solo.append(generate_once(eng, p, GREEDY)[0].output_ids)
    eng = _engine(nine_b, parallel=parallel)
    reqs = [eng.add_request(p, GREEDY) for p in prompts]
    eng.run_until_done()
    assert [r.output_ids for r in reqs[:4]] == solo


@pytest.mark.parametrize("chunk", [37, 16])
def test_chunk_invariant_seams_9b(nine_b, chunk):
    ids = sample_prompt(300, 600, VOCAB)
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    _, ref = generate_once(_engine(nine_b, chunk=128), ids, params, seams=256)
    _, other = generate_once(_engine(nine_b, chunk=chunk), ids, params, seams=256)
    assert [p[:2] for p in ref] == [
        ("seam", 256),
        ("seam", 512),
        ("prompt end", 600),
        ("reply end", 631),
    ]
    assert ref == other


def test_decode_equals_prefill_9b(nine_b):
    ids = sample_prompt(400, 40, VOCAB)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    req, decoded = decoded_logits(_engine(nine_b), ids, params)
    prefilled = position_logits(_engine(nine_b), ids + req.output_ids[:-1])[len(ids) :]
    assert torch.equal(decoded, prefilled)


def test_held_weights_equal_packed_9b(nine_b):
    """--unpacked-weights: prompt chunks past 128 rows and 16 lanes a pass, packed then held."""
    prompts = [sample_prompt(500 + i, 30 + 97 * i, VOCAB) for i in range(16)]

    def replies():
        eng = _engine(nine_b, chunk=512)
        prints = {}
        reqs = [eng.add_request(p, GREEDY, watch=finish_prints(eng, prints)) for p in prompts]
        eng.run_until_done()
        return [(r.output_ids, prints[r.request_id]) for r in reqs]

    packed = replies()
    nine_b.hold_unpacked()
    try:
        assert replies() == packed
    finally:
        nine_b.release_unpacked()  # the later tests run the packed products


def _finished(eng, ids, params=GREEDY):
    """The request run to its end, and its end-of-reply fingerprint (states, KV rows, logits)."""
    prints = {}
    req = eng.add_request(ids, params, watch=finish_prints(eng, prints))
    eng.run_until_done()
    return req, prints[req.request_id]


def test_resumed_equals_fresh_9b(nine_b):
    ids = sample_prompt(500, 1500, VOCAB)
    eng = _engine(nine_b, prompt_cache_bytes=4 << 30, cache_every=512)
    first, fp_first = _finished(eng, ids)
    second, fp_second = _finished(eng, ids)
    assert first.cached_tokens == 0 and second.cached_tokens == 1488
    fresh, fp_fresh = _finished(_engine(nine_b), ids)  # a second engine: nothing cached
    assert first.output_ids == second.output_ids == fresh.output_ids
    assert fp_first == fp_second == fp_fresh


def test_teacher_forced_against_cpu_float64(hf_tiny_b):
    """GPU bf16 against the CPU float64 reading: top-1 equal, or the same two contenders with a
    float64 margin within twice our rounding measured on the rest of the row."""
    from tensorfold.receipts.fidelity import UNEXPLAINED, Top2, arbitrate

    ids = sample_prompt(6, 64, 300)
    gpu = (
        position_logits(make_engine(hf_tiny_b, dtype=torch.bfloat16, device="cuda"), ids)
        .float()
        .cpu()
    )
    exact = position_logits(make_engine(hf_tiny_b, dtype=torch.float64), ids)
    verdicts = [arbitrate(Top2.of(row_g), row_g, row_x)[0] for row_g, row_x in zip(gpu, exact)]
    assert UNEXPLAINED not in verdicts


def test_cuda_graph_decode_equals_eager_9b(nine_b):
    """Decode passes replayed as CUDA graphs give the eager passes' bytes (tokens and lane state)."""
    prompts = [sample_prompt(600 + i, 30 + 17 * i, VOCAB) for i in range(4)]
    runs = []
    for graphs in (False, True):
        eng = _engine(nine_b, parallel=4, cuda_graphs=graphs)
        prints = {}
        reqs = [eng.add_request(p, GREEDY, watch=finish_prints(eng, prints)) for p in prompts]
        eng.run_until_done()
        runs.append([(r.output_ids, prints[r.request_id]) for r in reqs])
    assert runs[0] == runs[1]


def test_non_exact_variant_stays_close_to_exact(hf_tiny_b):
    """The benchmark-only variant (cuBLAS products, chunked prompt recurrence) computes the same
    model: against the CPU float64 reading its logits are off by no more than twice what the
    exact path's own bf16 rounding gives (on this tiny model both are about 2%)."""
    ids = sample_prompt(7, 200, 300)
    ref = position_logits(make_engine(hf_tiny_b, dtype=torch.float64), ids)
    exact = (
        position_logits(make_engine(hf_tiny_b, dtype=torch.bfloat16, device="cuda"), ids)
        .double()
        .cpu()
    )
    from benchmark_modules import inexact

    fast_engine = make_engine(hf_tiny_b, dtype=torch.bfloat16, device="cuda")
    inexact.make_inexact(fast_engine.model)
    fast = position_logits(fast_engine, ids)
    fast = fast.double().cpu()
    off = lambda x: float((x - ref).norm() / ref.norm())  # noqa: E731
    assert torch.isfinite(fast).all()
    assert off(fast) < 2 * off(exact), (off(fast), off(exact))


RULES_9B = [
    dict(presence_penalty=0.8, frequency_penalty=0.4),
    dict(repetition_penalty=1.3),
    dict(logit_bias={7: 25.0, 11: -100.0}),
    dict(min_tokens=8, stop_token_ids=(5,)),
    dict(prompt_logprobs=2),
]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_request_rules_concurrent_equals_solo_9b(nine_b, temperature):
    """Penalties, biases, min_tokens and prompt logprobs in one bf16 batch (decode passes as
    CUDA graphs): each request's tokens and prompt logprobs equal its own alone."""
    jobs = [
        (
            sample_prompt(400 + i, 30 + 11 * i, VOCAB),
            SamplingParams(
                max_tokens=16, temperature=temperature, seed=3 + i, ignore_eos=True, **rule
            ),
        )  # fmt: skip
        for i, rule in enumerate(RULES_9B)
    ]
    alone = []
    for ids, params in jobs:
        eng = _engine(nine_b, parallel=1)
        req = eng.add_request(ids, params)
        eng.run_until_done()
        alone.append((req.output_ids, req.prompt_logprobs))
    eng = _engine(nine_b, parallel=len(jobs))
    reqs = [eng.add_request(ids, params) for ids, params in jobs]
    eng.run_until_done()
    assert [(r.output_ids, r.prompt_logprobs) for r in reqs] == alone
