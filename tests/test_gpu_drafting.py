"""Drafted = plain on the GPU (skipped without CUDA): a random 9B-shape checkpoint (4-bit, mixed)
with a random MTP head, 1/4/16 lanes, greedy and seeded (and 64 greedy, gates opening and
closing mid-request): scripted drafts, the head's own, a random
DFlash (v1) and a random DFlash2 drafter bound to it. The
plain runs are eager (no CUDA graphs); the drafted runs replay decode and verify passes from
graphs (runner/cuda_graph.py), so graph = eager is checked for verify passes too."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from drafting_util import (  # noqa: E402
    Script,
    add_mtp_head,
    dflash2_over,
    stepped_run,
    write_drafter,
)
from engine_util import sample_prompt  # noqa: E402

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
    return stepped_run(eng, prompts, params), eng


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


def test_drafted_equals_plain_64_lanes_as_gates_open_and_close(nine_b):
    """64 lanes, greedy: half the lanes' drafts right for 8 positions then wrong for 8 (their
    gates close and reopen mid-request), the other half's always wrong (closed lanes ride the
    verify passes of open ones, or the pass goes plain); then the random MTP head's drafts."""
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    prompts = [sample_prompt(900 + i, 16 + (7 * i) % 50, VOCAB) for i in range(64)]
    want, _ = _run(nine_b, prompts, params, 64, graphs=False)
    replies = {
        tuple(p): ids if i % 2 == 0 else [(t + 1) % VOCAB for t in ids]
        for i, (p, (ids, _)) in enumerate(zip(prompts, want))
    }
    got, eng = _run(nine_b, prompts, params, 64, "ngram", Script(replies, lambda p: p % 16 >= 8))
    assert got == want
    assert eng.drafting.stats.accepted > 0 and _verify_replays(eng) > 0
    got, eng = _run(nine_b, prompts, params, 64, "mtp")
    assert got == want and eng.drafting.stats.proposed > 0


def _verify_replays(eng) -> int:
    """Verify passes (1 + K rows per lane) run from CUDA graphs."""
    return sum(n for key, n in eng.runner.replays.items() if len(key) == 2 and key[1] > 1)


def test_mtp_head_graphs_replay_their_eager_run_and_draft_the_demo():
    """The head's catch-up and chain graphs (runner/mtp_graph.py) give the drafts of their first,
    eager run for every catch-up size, whichever lane ran before; the demo drafted with its
    trained head through them equals plain and keeps its acceptance length."""
    import dataclasses
    from pathlib import Path

    from tensorfold.demo.data import generate
    from tensorfold.models.loader import load_model
    from tensorfold.runner.plan import LaneRows
    from tensorfold.tokenizer import Tokenizer

    demo = Path(__file__).resolve().parents[1] / "src" / "tensorfold" / "demo" / "bf16"
    model = load_model(demo, dtype=torch.bfloat16, device="cuda")
    eng = Engine(model, None, EngineConfig(parallel=2, context=512, draft="mtp", draft_tokens=4))
    graphs = eng.drafting.default.graphs
    assert graphs is not None and graphs.most == 4
    g = torch.Generator(device="cuda").manual_seed(0)
    rows_of = [torch.arange(512, device="cuda") + 512 * i for i in range(2)]
    lanes = [LaneRows(str(i), i, 0, (), rows_of[i], ()) for i in range(2)]
    for n in range(1, 6):
        ids = torch.randint(0, model.config.vocab_size, (n,), generator=g, device="cuda").tolist()
        rows = torch.randn(n, model.config.hidden_size, generator=g, device="cuda")
        runs = []
        for trial in range(4):  # eager, recorded, replayed, replayed after the other lane
            graphs.catch_up(lanes[0], 40, ids, [rows.to(torch.bfloat16)])
            runs.append(graphs.chain(lanes[0], 40 + n, 4))
            if trial == 2:
                graphs.catch_up(lanes[1], 7, ids[:1], [rows[:1].to(torch.bfloat16)])
                graphs.chain(lanes[1], 8, 4)
        assert runs[1:] == runs[:1] * 3, n
        assert graphs.catch_ups[n][1].graph is not None
    assert graphs.chains[4][1].graph is not None

    tok = Tokenizer(demo)
    tasks = [dataclasses.replace(s, thinking=True) for s in generate(7, 4)]  # as the head learnt
    prompts = [tok.encode(s.prompt_text()) for s in tasks]
    params = SamplingParams(max_tokens=96, temperature=0.0)
    plain = Engine(model, None, EngineConfig(parallel=2, context=512, cuda_graphs=False))
    want = [plain.add_request(p, params) for p in prompts]
    plain.run_until_done()
    got = [eng.add_request(p, params) for p in prompts]
    eng.run_until_done()
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    assert eng.drafting.stats.acceptance_length >= 3  # the trained head: 4.17 at K=4 in training
