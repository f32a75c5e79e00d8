"""The split code path on one GPU (skipped without CUDA): a one-rank split through NCCL gives the
whole model's bits at the 9B shape (random weights), with and without CUDA graphs. Its speed
is a benchmark's business, not a test's."""

import os

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from engine_util import decoded_logits, finish_prints, sample_prompt  # noqa: E402
from split_util import free_port  # noqa: E402

from tensorfold.engine.engine import Engine, EngineConfig  # noqa: E402
from tensorfold.engine.request import SamplingParams  # noqa: E402
from tensorfold.models.loader import load_model  # noqa: E402
from tensorfold.tools.make_random import make_random  # noqa: E402

VOCAB = 248320
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(whole, one-rank split) of the 9B shape, mixed bits, on cuda:0."""
    from tensorfold.runner.distributed import init_group

    path = make_random(tmp_path_factory.mktemp("ckpt") / "9b-mixed", "9b", "mixed", device="cuda")
    env = dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        device = torch.device("cuda", 0)
        group = init_group(1, device)
        whole = load_model(path, dtype=torch.bfloat16, device=device)
        split = load_model(path, dtype=torch.bfloat16, device=device, group=group)
        yield whole, split
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _engine(model, **kw):
    return Engine(model, None, EngineConfig(**{"parallel": 4, "context": 2048, "chunk": 128, **kw}))


def _results(model, graphs: bool) -> dict:
    out = {}
    prompt = sample_prompt(5, 300, VOCAB)
    for chunk in (128, 37):
        req, logits = decoded_logits(
            _engine(model, chunk=chunk, cuda_graphs=graphs), prompt, GREEDY
        )
        out[chunk] = (req.output_ids, logits.float().cpu().numpy().tobytes())
    engine, prints = _engine(model, cuda_graphs=graphs), {}
    lanes = [sample_prompt(30 + i, 20 + 41 * i, VOCAB) for i in range(4)]
    reqs = [engine.add_request(p, GREEDY, watch=finish_prints(engine, prints)) for p in lanes]
    engine.run_until_done()
    out["lanes"] = [(r.output_ids, prints[r.request_id]) for r in reqs]
    return out


@pytest.mark.parametrize("graphs", [False, True])
def test_one_rank_split_equals_whole_9b(models, graphs):
    whole, split = models
    a, b = _results(whole, graphs), _results(split, graphs)
    assert a[128] == a[37]
    assert b == a
