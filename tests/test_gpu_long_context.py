"""Long context on the GPU (skipped without CUDA): the super-block attention at 1k-128k keys, a
CUDA graph whose lanes change length under it, and the engine's invariants at 30k-128k tokens
(9B shape, random weights; docs/exactness.md, 'Attention')."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from engine_util import finish_prints, sample_prompt  # noqa: E402

from tensorfold.batch import Segment  # noqa: E402
from tensorfold.engine.engine import Engine, EngineConfig  # noqa: E402
from tensorfold.engine.request import SamplingParams  # noqa: E402
from tensorfold.ops.attention import AttentionTiles  # noqa: E402
from tensorfold.ops.triton.attention import paged_attention  # noqa: E402
from tensorfold.tools.run import generate_once  # noqa: E402
from tensorfold.util import capturing  # noqa: E402

VOCAB = 248320
HQ, HKV, D = 16, 4, 256  # the 9B's attention
SCALE = D**-0.5


def _cache(keys: int):
    rows = keys + 4096
    kc = torch.randn(rows, HKV, D, device="cuda").to(torch.bfloat16)
    vc = torch.randn(rows, HKV, D, device="cuda").to(torch.bfloat16)
    return kc, vc, torch.randperm(rows, device="cuda")[:keys].to(torch.int32)


def _tiles(start: int, length: int, table) -> AttentionTiles:
    return AttentionTiles.build((Segment(0, start, 0, length, table[: start + length]),), "cuda")


@pytest.mark.parametrize("keys", [1024, 8192, 32768, 131072])
def test_decode_row_equals_prompt_row_at_depth(keys):
    """The last 512 rows of a prompt of `keys` tokens in one pass (64-row tiles), then each
    sampled row as a decode row after them; and the chunk's last 64 rows in the split plan."""
    kc, vc, table = _cache(keys)
    q = (torch.randn(512, HQ, D, device="cuda") * 4).to(torch.bfloat16)
    start = keys - 512
    prompt = paged_attention(q, kc, vc, _tiles(start, 512, table), SCALE)
    for i in (0, 255, 256, 511):
        row = paged_attention(q[i : i + 1], kc, vc, _tiles(start + i, 1, table), SCALE)
        assert torch.equal(row[0], prompt[i]), (keys, i)
    tail = paged_attention(q[448:], kc, vc, _tiles(keys - 64, 64, table), SCALE, plan="split")
    assert torch.equal(tail, prompt[448:])


def test_cuda_graph_over_lanes_of_changing_lengths():
    """One recorded decode launch over 4 lanes of a 40,000-key capacity, replayed with lengths
    that change every step (100 beside 30,000, then others), equals eager launches with each
    pass's exact tiles."""
    context, lanes = 40_000, 4
    kc, vc, _ = _cache(lanes * context)
    table = torch.randperm(kc.shape[0], device="cuda")[: lanes * context].to(torch.int32)
    table = table.view(lanes, context)
    q = (torch.randn(lanes, HQ, D, device="cuda") * 4).to(torch.bfloat16)
    as_t = lambda v: torch.tensor(v, dtype=torch.int32, device="cuda")  # noqa: E731
    pos0 = as_t([0] * lanes)
    static = AttentionTiles(
        as_t(range(lanes)), as_t([1] * lanes), pos0, as_t([i * context for i in range(lanes)]),
        table.view(-1), 16, 1, context,
    )  # fmt: skip
    paged_attention(q, kc, vc, static, SCALE)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with capturing(graph):
        out = paged_attention(q, kc, vc, static, SCALE)
    for lengths in ((100, 30_000, 5, 257), (30_001, 101, 6, 258), (39_999, 1, 256, 255)):
        pos0.copy_(as_t([n - 1 for n in lengths]))
        graph.replay()
        segs = tuple(Segment(i, n - 1, i, 1, table[i, :n]) for i, n in enumerate(lengths))
        eager = paged_attention(q, kc, vc, AttentionTiles.build(segs, "cuda"), SCALE)
        assert torch.equal(out, eager), lengths


def _engine(model, context: int, **kw) -> Engine:
    config = {"parallel": 1, "context": context + 64, "chunk": 4096, **kw}
    return Engine(model, None, EngineConfig(**config))


@pytest.mark.parametrize("context", [1024, 8192, 32768, 131072])
def test_decode_equals_prefill_at_depth_9b(nine_b, context):
    """After a prompt of `context` tokens and 4 decode steps (CUDA graphs), the lane's
    fingerprint (every KV row, every GDN state, the last row's logits) equals the prompt end's
    of the same tokens read as one prompt."""
    ids = sample_prompt(context, context, VOCAB)
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    req, decoded = generate_once(_engine(nine_b, context), ids, params, seams=context)
    longer = ids + req.output_ids[:-1]
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    _, read = generate_once(_engine(nine_b, context), longer, one, seams=len(longer))
    assert decoded[-1][:2] == ("reply end", len(longer))
    assert read[0][:2] == ("prompt end", len(longer))
    assert decoded[-1][2] == read[0][2]


def _finished(eng, prompts, params):
    """Each request's (ids, end-of-reply fingerprint, tokens resumed from the prompt cache)."""
    prints = {}
    reqs = [eng.add_request(p, params, watch=finish_prints(eng, prints)) for p in prompts]
    eng.run_until_done()
    return [(r.output_ids, prints[r.request_id], r.cached_tokens) for r in reqs]


def test_concurrent_equals_solo_short_beside_30k_9b(nine_b):
    """A lane at 100 tokens beside one at 30,000: the short one decodes while the long one reads
    its prompt, then both decode in one graph; each equals its solo run (ids, fingerprints)."""
    prompts = [sample_prompt(11, 100, VOCAB), sample_prompt(12, 30_000, VOCAB)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    solo = [_finished(_engine(nine_b, 30_100), [p], params)[0] for p in prompts]
    assert _finished(_engine(nine_b, 30_100, parallel=2), prompts, params) == solo


def test_seams_and_resume_at_32k_9b(nine_b):
    ids = sample_prompt(13, 32_768 + 100, VOCAB)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    _, ref = generate_once(_engine(nine_b, len(ids)), ids, params, seams=8192)
    _, other = generate_once(_engine(nine_b, len(ids), chunk=1500), ids, params, seams=8192)
    assert [p[:2] for p in ref][-2:] == [("prompt end", len(ids)), ("reply end", len(ids) + 15)]
    assert ref == other
    eng = _engine(nine_b, len(ids), prompt_cache_bytes=8 << 30, cache_every=4096)
    (first,), (second,) = _finished(eng, [ids], params), _finished(eng, [ids], params)
    (fresh,) = _finished(_engine(nine_b, len(ids)), [ids], params)
    assert first[2] == 0 and second[2] >= 32_768
    assert first[:2] == second[:2] == fresh[:2]
