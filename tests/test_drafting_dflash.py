"""The dflash drafter: a z-lab DFlash (v1) block drafter made tiny here with its published config
fields and tensor names. Drafted = plain bitwise whatever it guesses; a drafter bound to another
target is refused by name before any weight of either is read; the block pass matches the
reference implementation (the `dflash` package) when that is installed."""

import pytest
import torch
from drafting_util import (
    DRAFT_MODES,
    assert_overlapped_reads_as_sequential,
    drafted_run,
    write_drafter,
)
from engine_util import make_engine

from tensorfold.config import ModelConfig
from tensorfold.drafters.choice import check
from tensorfold.errors import DraftForAnotherTarget, NotStockDrafter
from tensorfold.models.checkpoint import Checkpoint
from tensorfold.models.dflash import read_config


@pytest.fixture(scope="module")
def drafter(hf_tiny_b, tmp_path_factory):
    return write_drafter(tmp_path_factory.mktemp("dflash") / "d", ModelConfig.from_dir(hf_tiny_b))


@pytest.mark.parametrize("mode", sorted(DRAFT_MODES))
@pytest.mark.parametrize("parallel", [1, 4])
def test_dflash_drafted_equals_plain(hf_tiny_b, drafter, mode, parallel):
    want, _ = drafted_run(hf_tiny_b, DRAFT_MODES[mode], 1, None)
    got, eng = drafted_run(hf_tiny_b, DRAFT_MODES[mode], parallel, str(drafter))
    assert got == want
    assert eng.drafting.stats.proposed > 0
    assert eng.memory().draft_state_bytes >= eng.drafting.default.kv.nbytes > 0


def test_an_overlapped_dflash_reads_the_passes_before_a_retry_as_a_sequential_one(
    hf_tiny_b, drafter, monkeypatch
):
    """The drafter's context rows of overlapped passes are the sequential engine's."""
    from tensorfold.drafters.dflash import DFlashLane

    assert_overlapped_reads_as_sequential(hf_tiny_b, str(drafter), DFlashLane, monkeypatch)


MISBOUND = {  # each names one way a drafter can belong to another target
    "width": (DraftForAnotherTarget, lambda t: {"hidden_size": 2 * t.hidden_size}),
    "vocab": (DraftForAnotherTarget, lambda t: {"vocab_size": t.vocab_size + 16}),
    "depth": (DraftForAnotherTarget, lambda t: {"num_target_layers": t.num_layers + 4}),
    "taps": (DraftForAnotherTarget, lambda t: {"target_layer_ids": [1, t.num_layers]}),
    "mask_id": (DraftForAnotherTarget, lambda t: {"mask_token_id": t.vocab_size}),
    "dflash2_without_its_fields": (
        NotStockDrafter,
        lambda t: {"architectures": ["DFlash2DraftModel"]},
    ),
    "selector": (NotStockDrafter, lambda t: {"selector_rank": 256}),
}


@pytest.mark.parametrize("case", sorted(MISBOUND))
def test_misbound_drafter_refused_before_any_read(hf_tiny_b, tmp_path, case, monkeypatch):
    error, over = MISBOUND[case]
    target = ModelConfig.from_dir(hf_tiny_b)
    good = read_config(write_drafter(tmp_path / "good", target))
    path = write_drafter(tmp_path / case, target, shapes_from=good, **over(target))
    reads = []
    monkeypatch.setattr(Checkpoint, "read", lambda self, name: reads.append(name))
    with pytest.raises(error):
        check(str(path), 4, hf_tiny_b)  # what serve and run call before loading
    assert reads == []


def test_fc_for_other_taps_is_refused(hf_tiny_b, tmp_path):
    target = ModelConfig.from_dir(hf_tiny_b)
    three = read_config(write_drafter(tmp_path / "three", target, target_layer_ids=[1, 3, 5]))
    path = write_drafter(tmp_path / "two", target, shapes_from=three)  # fc for 3 taps, config 2
    with pytest.raises(DraftForAnotherTarget, match="fc.weight"):
        check(str(path), 4, hf_tiny_b)


def test_block_matches_the_reference(hf_tiny_b, drafter):
    """Our block pass against z-lab's DFlashDraftModel with the same weights (float32)."""
    ref = pytest.importorskip("dflash.model")
    from transformers import AutoConfig

    eng = make_engine(hf_tiny_b, parallel=1, draft=str(drafter))
    d = eng.drafting.default
    c = d.model.config
    g = torch.Generator().manual_seed(4)
    ctx = 11
    feats = torch.randn(ctx, len(c.taps) * c.hidden_size, generator=g)
    anchor = 42
    rows = torch.arange(ctx + c.block_size)
    d.model.context(feats, torch.arange(ctx), rows[:ctx], d.kv)
    ids = [anchor] + [c.mask_token_id] * (c.block_size - 1)
    ours = d.model.block(eng.model.embed, eng.model.lm_head, ids, ctx, rows[:ctx], d.kv)

    cfg = AutoConfig.from_pretrained(drafter)
    model = ref.DFlashDraftModel.from_pretrained(drafter, config=cfg, torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        noise = eng.model.embed(torch.tensor([ids])).float()
        pos = torch.arange(ctx + c.block_size)[None]
        hidden = model(position_ids=pos, noise_embedding=noise, target_hidden=feats[None])
        want = eng.model.lm_head(hidden[0, 1:].float())
    torch.testing.assert_close(ours, want, atol=2e-3, rtol=2e-3)
