"""A DFlash2 drafter on the GPU (skipped without CUDA): random, bound to a random 9B-shape target
(4-bit, mixed); drafted = plain at 1/4/16 lanes, greedy and seeded."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from drafting_util import dflash2_over, write_drafter  # noqa: E402
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

    path = make_random(tmp_path_factory.mktemp("ckpt") / "9b", "9b", "mixed", device="cuda")
    return load_model(path, dtype=torch.bfloat16, device="cuda")


@pytest.fixture(scope="module")
def dflash2_9b(nine_b, tmp_path_factory):
    """Taps of the 9B DFlash drafters, block 8, every layer sliding and non-causal, z-lab's
    convolution and top-k; a small selector rank keeps the two codebooks (vocab rows) light."""
    taps = list(range(1, 30, 4))
    over = dflash2_over(target_layer_ids=taps, block_size=8, selector_rank=32, selector_top_k=16)
    return write_drafter(tmp_path_factory.mktemp("dflash2") / "d", nine_b.config, **over)


def _run(model, prompts, params, parallel, draft=None):
    config = EngineConfig(
        parallel=parallel, context=2048, chunk=128, prompt_cache_bytes=1 << 28, draft=draft
    )
    eng = Engine(model, None, config)
    prints, reqs = {}, []
    for ids in prompts:
        reqs.append(eng.add_request(ids, params, watch=finish_prints(eng, prints)))
        eng.step()
    eng.run_until_done()
    return [(r.output_ids, prints[r.request_id]) for r in reqs], eng


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("parallel", [1, 4, 16])
def test_dflash2_drafted_equals_plain_9b(nine_b, dflash2_9b, parallel, params):
    prompts = [sample_prompt(500 + i, 20 + 29 * i, VOCAB) for i in range(parallel)]
    want = [_run(nine_b, [p], params, 1)[0][0] for p in prompts]
    got, eng = _run(nine_b, prompts, params, parallel, str(dflash2_9b))
    assert got == want
    assert eng.drafting.default.model.selector is not None
    assert eng.drafting.stats.proposed > 0
