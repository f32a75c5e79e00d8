"""Every released dense shape validates (config and every tensor header), and random checkpoints
load (MoE shapes: tests/test_moe.py)."""

import json
import struct

import pytest
import torch

from tensorfold.config import ModelConfig
from tensorfold.models.checkpoint import Checkpoint
from tensorfold.models.loader import load_model, validate
from tensorfold.models.weights import WeightMap
from tensorfold.tools.make_random import MIXED45_HIGH, _tensors, make_random
from tensorfold.tools.shapes import MOE_SHAPES, SHAPES, text_config


def _header_only(path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """A safetensors header without data: enough for validation, which reads no data."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset]}
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)


def _manifest(cfg: dict, mlx: bool) -> dict:
    prefix, head = (
        ("language_model.model.", "language_model.lm_head")
        if mlx
        else ("model.language_model.", "lm_head")
    )
    out = {}
    for local, dims, kind in _tensors(cfg):
        stem = head if local == "lm_head" else prefix + local
        if kind == "linear" and mlx:
            out[stem + ".weight"] = ("U32", (dims[0], dims[1] * 4 // 32))
            out[stem + ".scales"] = out[stem + ".biases"] = ("BF16", (dims[0], dims[1] // 64))
        elif kind == "conv":
            out[stem] = ("BF16", (dims[0], 4, 1) if mlx else (dims[0], 1, 4))
        else:
            out[stem + (".weight" if kind == "linear" else "")] = (
                "F32" if kind == "a_log" else "BF16",
                dims,
            )
    return out


@pytest.mark.parametrize("mlx", [False, True], ids=["hf", "mlx4"])
@pytest.mark.parametrize("shape", [s for s in SHAPES if s != "tiny" and s not in MOE_SHAPES])
def test_released_shapes_validate(shape, mlx, tmp_path):
    cfg = text_config(shape)
    raw = {"model_type": "qwen3_5", "text_config": cfg}
    if mlx:
        raw["quantization"] = {"group_size": 64, "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    _header_only(tmp_path / "model.safetensors", _manifest(cfg, mlx))
    config = ModelConfig.from_dir(tmp_path)
    ckpt = Checkpoint(tmp_path)
    wm = WeightMap(ckpt, config)
    validate(config, wm)
    assert ckpt.reads == 0
    assert wm.layout.name == ("mlx" if mlx else "hf")
    assert config.num_heads // config.num_kv_heads in (4, 6)


@pytest.mark.parametrize("quantize", [None, "4", "mixed", "mixed45"])
def test_make_random_writes_a_loadable_checkpoint(quantize, tmp_path):
    path = make_random(tmp_path / "ckpt", "tiny", quantize)
    model = load_model(path)
    assert model.layout == ("mlx" if quantize else "hf")
    cfg = json.loads((path / "config.json").read_text())
    if quantize == "mixed":
        assert any(v.get("bits") == 6 for v in cfg["quantization"].values() if isinstance(v, dict))
    if quantize == "mixed45":  # the GDN out and gate inputs and the embedding at 5 bits, the rest 4
        five = {k for k, v in cfg["quantization"].items() if isinstance(v, dict) and v["bits"] == 5}
        assert five and all(k.endswith(MIXED45_HIGH) for k in five)
        assert any(k.endswith("embed_tokens") for k in five)
    from tensorfold.layers.linear import QuantizedWeight

    head = model.lm_head.weight
    assert isinstance(head, QuantizedWeight) == (quantize is not None)  # stays packed in memory
    assert torch.isfinite(head.scales if quantize else head).all()
