"""--unpacked-weights: every packed product weight held dequantized too. The tokens and
fingerprints are the packed path's bitwise (mixed widths and a MoE file included), every product
reads the held values, /memory counts them, and a device without room refuses them by name
before any is made."""

from types import SimpleNamespace

import pytest
import torch
from engine_util import make_engine, sample_prompt

from tensorfold.cache import budget
from tensorfold.engine.engine import hold_unpacked, wants_unpacked
from tensorfold.engine.request import SamplingParams
from tensorfold.errors import ConfigError, UnpackedTooLarge
from tensorfold.ops import linear as ref_linear
from tensorfold.ops.quant import QuantizedWeight, dequantize
from tensorfold.tools.run import generate_once

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _replies(engine, prompts):
    """Each prompt alone: its token ids and its seams' and reply's fingerprints."""
    return [
        (req.output_ids, prints)
        for req, prints in (generate_once(engine, p, GREEDY, seams=16) for p in prompts)
    ]


@pytest.mark.parametrize("ckpt", ["mlx_q4", "mlx_mixed", "mlx_q8_g32", "mlx_moe_q4"])
def test_held_weights_give_the_packed_tokens_and_fingerprints(ckpt, request):
    path = request.getfixturevalue(ckpt)
    packed = make_engine(path, torch.bfloat16, unpacked_weights=False)
    held = make_engine(path, torch.bfloat16, unpacked_weights=True)
    vocab = packed.model.config.vocab_size
    prompts = [sample_prompt(7 + i, 20 + 23 * i, vocab) for i in range(3)]
    assert _replies(held, prompts) == _replies(packed, prompts)
    weights = held.model.product_weights()
    assert weights and all(isinstance(w, QuantizedWeight) for w in weights)
    for w in weights:  # the values the products would dequantize, as they make them
        want = dequantize(w.packed, w.scales, w.biases, w.bits, w.group_size, torch.bfloat16)
        assert torch.equal(w.unpacked(torch.bfloat16), want)
        assert w.unpacked(torch.float32) is None  # held for the model's dtype only
    expected = sum(w.shape[0] * w.shape[1] * 2 for w in weights)
    assert held.memory().unpacked_bytes == expected == held.model.unpacked_bytes(held=False)
    assert packed.memory().unpacked_bytes == 0
    held.model.release_unpacked()
    assert held.memory().unpacked_bytes == 0 and weights[0].unpacked(torch.bfloat16) is None


def test_every_product_reads_the_held_values(mlx_mixed, monkeypatch):
    """With the weights held, no product dequantizes a packed weight on its own."""
    engine = make_engine(mlx_mixed, torch.bfloat16, unpacked_weights=True)

    def refused(*_args, **_kw):
        raise AssertionError("a product dequantized a weight the model holds unpacked")

    monkeypatch.setattr(ref_linear, "matmul_packed_rows", refused)
    req, _ = generate_once(engine, list(range(3, 40)), GREEDY)
    assert len(req.output_ids) == GREEDY.max_tokens


def test_no_room_for_the_held_weights_is_refused_by_name(mlx_q4, monkeypatch):
    monkeypatch.setattr(budget, "free_bytes", lambda device: 1 << 10)
    with pytest.raises(UnpackedTooLarge, match="--unpacked-weights holds .* GiB"):
        make_engine(mlx_q4, torch.bfloat16, unpacked_weights=True)


def test_a_split_model_refuses_held_weights():
    with pytest.raises(ConfigError, match="--tensor-parallel"):
        hold_unpacked(SimpleNamespace(group=object()))


def test_a_small_model_on_the_cpu_holds_them_unless_told_not_to(mlx_q4):
    assert make_engine(mlx_q4).memory().unpacked_bytes > 0
    assert make_engine(mlx_q4, unpacked_weights=False).memory().unpacked_bytes == 0
    cpu = torch.device("cpu")
    big = SimpleNamespace(device=cpu, group=None, unpacked_bytes=lambda held=True: 1 << 40)
    assert not wants_unpacked(big, None) and wants_unpacked(big, True)
    dense = SimpleNamespace(device=cpu, group=None, unpacked_bytes=lambda held=True: 0)
    assert not wants_unpacked(dense, None)  # nothing packed to hold


def test_a_held_weights_launch_shape_is_kept_in_the_tile_file(tmp_path):
    """Held weights time their own choices (the dequantize-first shape costs them less); the
    tile file keeps them apart from the packed weights' and admits the shape for 17-128 rows."""
    tiles = pytest.importorskip("tensorfold.ops.triton.tiles")
    packed_key, held_key = (4, 4096, 4096, 4, 64), (4, 4096, 4096, 4, 64, "held")
    book = tiles.TileBook()
    book.chosen = {held_key: tiles.HELD, packed_key: tiles.candidates(100, packed=True)[0]}
    book.save(tmp_path / "tiles.json")
    again = tiles.TileBook()
    assert again.load(tmp_path / "tiles.json") == 2 and again.chosen == book.chosen
    for m in (1, 16):  # few rows: the packed forms alone
        assert tiles.HELD not in tiles.candidates(m, packed=True, held=True)
    for m in (17, 64, 100, 128):  # offered to a held weight only
        assert tiles.HELD in tiles.candidates(m, packed=True, held=True)
        assert tiles.HELD not in tiles.candidates(m, packed=True)


def test_a_gpu_holds_them_unasked_for_many_lanes_with_room_to_spare(monkeypatch):
    from tensorfold.engine import engine as engine_mod

    gib = 1 << 30
    model = SimpleNamespace(
        device=torch.device("cuda"),
        group=None,
        unpacked_bytes=lambda held=True: 0 if held else 10 * gib,
    )
    monkeypatch.setattr(engine_mod, "free_bytes", lambda device: 40 * gib)
    assert engine_mod.wants_unpacked(model, None, parallel=256, pools=12 * gib)
    assert not engine_mod.wants_unpacked(model, None, parallel=128, pools=12 * gib)  # few lanes
    assert not engine_mod.wants_unpacked(model, None, parallel=256, pools=25 * gib)  # 35 > 0.8 x 40
    assert not engine_mod.wants_unpacked(model, False, parallel=256)
    monkeypatch.setattr(engine_mod, "free_bytes", lambda device: None)  # unknown: not unasked
    assert not engine_mod.wants_unpacked(model, None, parallel=256)
