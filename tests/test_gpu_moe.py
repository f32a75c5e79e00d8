"""GPU (skipped without CUDA): the invariants at the 35B-A3B MoE shape with random 4-bit weights
(8-bit router), bitwise: rows of several lanes pick the same and different experts in one pass."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from engine_util import decoded_logits, position_logits, sample_prompt  # noqa: E402

from tensorfold.engine.request import SamplingParams  # noqa: E402
from tensorfold.tools.make_random import make_random  # noqa: E402
from tensorfold.tools.run import generate_once  # noqa: E402

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
VOCAB = 248320


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    from tensorfold.models.loader import load_model

    path = make_random(tmp_path_factory.mktemp("ckpt") / "35b-a3b", "35b-a3b", "4", device="cuda")
    return load_model(path, dtype=torch.bfloat16, device="cuda")


def _engine(model, **kw):
    from tensorfold.engine.engine import Engine, EngineConfig

    return Engine(model, None, EngineConfig(**{"parallel": 8, "context": 2048, "chunk": 128, **kw}))


@pytest.mark.parametrize("parallel", [1, 8])
def test_moe_concurrent_equals_solo(moe, parallel):
    prompts = [sample_prompt(700 + i, 15 + 41 * i, VOCAB) for i in range(parallel)]
    solo = [generate_once(_engine(moe, parallel=1), p, GREEDY)[0].output_ids for p in prompts[:3]]
    eng = _engine(moe, parallel=parallel)
    reqs = [eng.add_request(p, GREEDY) for p in prompts]
    eng.run_until_done()
    assert [r.output_ids for r in reqs[:3]] == solo


def test_moe_seams(moe):
    ids = sample_prompt(800, 300, VOCAB)
    _, ref = generate_once(_engine(moe, chunk=128), ids, GREEDY, seams=128)
    _, other = generate_once(_engine(moe, chunk=37), ids, GREEDY, seams=128)
    assert ref == other


def test_moe_decode_equals_prefill(moe):
    ids = sample_prompt(900, 40, VOCAB)
    req, decoded = decoded_logits(_engine(moe), ids, GREEDY)
    prefilled = position_logits(_engine(moe), ids + req.output_ids[:-1])[len(ids) :]
    assert torch.equal(decoded, prefilled)


def test_moe_cuda_graph_decode_equals_eager(moe):
    """Decode passes replayed as CUDA graphs give the eager passes' bytes (tokens and lane state)."""
    from engine_util import finish_prints

    prompts = [sample_prompt(950 + i, 30 + 17 * i, VOCAB) for i in range(4)]
    runs = []
    for graphs in (False, True):
        eng = _engine(moe, parallel=4, cuda_graphs=graphs)
        prints = {}
        reqs = [eng.add_request(p, GREEDY, watch=finish_prints(eng, prints)) for p in prompts]
        eng.run_until_done()
        runs.append([(r.output_ids, prints[r.request_id]) for r in reqs])
    assert runs[0] == runs[1]
