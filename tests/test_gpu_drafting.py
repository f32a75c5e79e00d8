"""Drafted = plain on the GPU (skipped without CUDA): a random 9B-shape checkpoint (4-bit, mixed)
with a random MTP head, 1/4/16 lanes, greedy and seeded: scripted drafts, the head's own, a random
DFlash (v1) and a random DFlash2 drafter bound to it. The
plain runs are eager (no CUDA graphs); the drafted runs replay decode and verify passes from
graphs (runner/cuda_graph.py), so graph = eager is checked for verify passes too."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from drafting_util import Script, add_mtp_head, dflash2_over, write_drafter  # noqa: E402
from engine_util import finish_prints, sample_prompt  # noqa: E402

from tensorfold.engine.engine import Engine, EngineConfig  # noqa: E402
from tensorfold.engine.request import SamplingParams  # noqa: E402
from tensorfold.tools.make_random import make_random  # noqa: E402

VOCAB = 248320
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.95, seed=3, ignore_eos=True)


@pytest.fixture(scope="module")
def nine_b(tmp_path_factory):
    from tensorfold.models.loader import load_model

    path = make_random(tmp_path_factory.mktemp("ckpt") / "9b-mtp", "9b", "mixed", device="cuda")
    add_mtp_head(path, device="cuda")
    return load_model(path, dtype=torch.bfloat16, device="cuda")


@pytest.fixture(scope="module")
def dflash_9b(nine_b, tmp_path_factory):
    """A random DFlash drafter bound to the 9B shape (taps of the 9B-DFlash drafter)."""
    taps = list(range(1, 30, 4))
    return write_drafter(
        tmp_path_factory.mktemp("dflash") / "d", nine_b.config, target_layer_ids=taps
    )


@pytest.fixture(scope="module")
def dflash2_9b(nine_b, tmp_path_factory):
    """Block 8, every layer sliding and non-causal, z-lab's convolution and top-k; a small
    selector rank keeps the two codebooks (vocab rows) light."""
    taps = list(range(1, 30, 4))
    over = dflash2_over(target_layer_ids=taps, block_size=8, selector_rank=32, selector_top_k=16)
    return write_drafter(tmp_path_factory.mktemp("dflash2") / "d", nine_b.config, **over)


def _run(model, prompts, params, parallel, draft=None, drafter=None, graphs=True):
    config = EngineConfig(
        parallel=parallel,
        context=2048,
        chunk=128,
        prompt_cache_bytes=1 << 28,
        draft=draft,
        cuda_graphs=graphs,
    )
    eng = Engine(model, None, config)
    if drafter is not None:
        eng.drafting.default = drafter
    prints, reqs = {}, []
    for ids in prompts:
        reqs.append(eng.add_request(ids, params, watch=finish_prints(eng, prints)))
        eng.step()
    eng.run_until_done()
    return [(r.output_ids, prints[r.request_id]) for r in reqs], eng


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("parallel", [1, 4, 16])
def test_drafted_equals_plain_9b(nine_b, dflash_9b, dflash2_9b, parallel, params):
    prompts = [sample_prompt(300 + i, 20 + 29 * i, VOCAB) for i in range(parallel)]
    want = [_run(nine_b, [p], params, 1, graphs=False)[0][0] for p in prompts]
    replies = {tuple(p): ids for p, (ids, _) in zip(prompts, want)}
    for wrong in (lambda p: False, lambda p: p % 3 == 2, lambda p: True):
        got, eng = _run(nine_b, prompts, params, parallel, "ngram", Script(replies, wrong))
        assert got == want
        assert eng.drafting.stats.proposed > 0
        if eng.drafting.stats.accepted == eng.drafting.stats.proposed:  # every pass 1 + K rows
            assert _verify_replays(eng) > 0
    for draft in ("mtp", str(dflash_9b), str(dflash2_9b)):
        got, eng = _run(nine_b, prompts, params, parallel, draft)
        assert got == want
        assert eng.drafting.stats.proposed > 0
        if draft == str(dflash2_9b):
            assert eng.drafting.default.model.selector is not None  # served as DFlash2


def _verify_replays(eng) -> int:
    """Verify passes (1 + K rows per lane) run from CUDA graphs."""
    return sum(n for (_, rows), n in eng.runner.replays.items() if rows > 1)
