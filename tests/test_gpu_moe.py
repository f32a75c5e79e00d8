"""GPU (skipped without CUDA): the invariants at the 35B-A3B MoE shape with random 4-bit weights
(8-bit router), bitwise: rows of several lanes pick the same and different experts in one pass."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from engine_util import decoded_logits, position_logits, sample_prompt  # noqa: E402

from tensorfold.engine.request import SamplingParams  # noqa: E402
from tensorfold.tools.make_random import RandomPlan  # noqa: E402
from tensorfold.tools.random_checkpoint import load_random  # noqa: E402
from tensorfold.tools.run import generate_once  # noqa: E402

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
VOCAB = 248320


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """Drawn in memory through the loader's path: no 19.5 GB file written."""
    plan = RandomPlan("35b-a3b", "4", device="cuda")
    return load_random(tmp_path_factory.mktemp("ckpt") / "35b-a3b", plan, torch.bfloat16)


def _engine(model, **kw):
    from tensorfold.engine.engine import Engine, EngineConfig

    return Engine(model, None, EngineConfig(**{"parallel": 8, "context": 2048, "chunk": 128, **kw}))


@pytest.mark.parametrize("parallel", [1, 8, 64])
def test_moe_concurrent_equals_solo(moe, parallel):
    """Lanes of different lengths route their rows to overlapping experts in one pass; a sample
    of them (first, middle, last) equals each alone."""
    prompts = [sample_prompt(700 + i, 15 + (41 * i) % 600, VOCAB) for i in range(parallel)]
    sample = sorted({0, 1, 2, parallel // 2, parallel - 1} & set(range(parallel)))
    solo = [
        generate_once(_engine(moe, parallel=1), prompts[i], GREEDY)[0].output_ids for i in sample
    ]
    eng = _engine(moe, parallel=parallel)
    reqs = [eng.add_request(p, GREEDY) for p in prompts]
    eng.run_until_done()
    assert [reqs[i].output_ids for i in sample] == solo


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


def test_moe_joint_shared_expert_gives_the_separate_bits(moe):
    """The shared expert run as expert E of the grouped launches (the load's default for a whole
    model): a prompt's logits and its decoded rows (CUDA graphs) equal those of its own launches
    (`h200.py --own-shared`), bitwise. Joined again after."""
    from tensorfold.layers.moe import SparseMoE

    ids = sample_prompt(990, 70, VOCAB)
    moes = [layer.mlp for layer in moe.layers if isinstance(layer.mlp, SparseMoE)]
    assert all(layer.joint is not None for layer in moes)
    try:
        moe.separate_shared_experts()
        prompt = position_logits(_engine(moe), ids)
        req, decoded = decoded_logits(_engine(moe), ids, GREEDY)
    finally:
        assert moe.join_shared_experts() == len(moes)
    assert torch.equal(position_logits(_engine(moe), ids), prompt)
    again, joint = decoded_logits(_engine(moe), ids, GREEDY)
    assert again.output_ids == req.output_ids and torch.equal(joint, decoded)


def test_moe_registry_entries_and_controls():
    """The MoE kernels against their references at the 35B-A3B shape, each planted fault red."""
    from tensorfold.checks.registry import run_all

    lines, ok = run_all(only="moe.")
    assert ok, "\n".join(lines)


@pytest.mark.parametrize("rows", [1, 16, 100, 700])
def test_fused_experts_are_the_unfused_bits(moe, rows):
    """The decode-time form (one-launch tile table, gate and up fused, no gather or scatter) gives
    the earlier three-product form's bits on the model's own 4-bit stacks and routing."""
    from tensorfold.layers.moe import SparseMoE
    from tensorfold.ops import dispatch as op
    from tensorfold.ops.triton import moe as tmoe

    block = next(layer.mlp for layer in moe.layers if isinstance(layer.mlp, SparseMoE))
    x = torch.randn(rows, 2048, device="cuda").to(torch.bfloat16)
    ids = op.moe_route(block.gates(x)[0], block.top_k).ids
    fused = tmoe.expert_swiglu(x, ids, block.experts)
    assert torch.equal(fused, tmoe.expert_swiglu_unfused(x, ids, block.experts))
    assert torch.equal(tmoe.expert_swiglu(x[-1:], ids[-1:], block.experts)[0], fused[-1])
