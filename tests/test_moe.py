"""MoE checkpoints: config, the three expert layouts, refusals before any data is read, the
routing and expert-product ops (docs/exactness.md, 'Experts'), and random checkpoints of the
released MoE shapes."""

import json
import math
import shutil
import struct

import pytest
import torch
from engine_util import generate, make_engine, sample_prompt
from safetensors.torch import load_file, save_file

from tensorfold.config import ModelConfig
from tensorfold.errors import (
    BadTensor,
    ConfigError,
    InconsistentShape,
    MissingTensor,
    UnsupportedExperts,
    UnsupportedModelType,
    UnsupportedMoE,
)
from tensorfold.layers.moe import SparseMoE
from tensorfold.models import checkpoint as ckpt_mod
from tensorfold.models.checkpoint import Checkpoint
from tensorfold.models.loader import load_model, validate
from tensorfold.models.weights import WeightMap
from tensorfold.ops import linear as ref_linear
from tensorfold.ops import moe as ref_moe
from tensorfold.ops.quant import QuantizedWeight, quantize
from tensorfold.tools.make_random import _tensors, make_random
from tensorfold.tools.shapes import model_types, text_config


@pytest.fixture
def no_reads(monkeypatch):
    def refuse(self, name):
        raise AssertionError(f"tensor {name} was read before the refusal")

    monkeypatch.setattr(ckpt_mod.Checkpoint, "read", refuse)


def _copy(src, tmp_path):
    return shutil.copytree(src, tmp_path / "ckpt")


def _edit_config(folder, fn):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    fn(cfg.get("text_config", cfg), cfg)
    path.write_text(json.dumps(cfg))


def _edit_tensors(folder, fn):
    file = next(folder.glob("*.safetensors"))
    tensors = load_file(file)
    fn(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


# -- config ------------------------------------------------------------------------------------


def test_moe_config_flat_and_nested(hf_moe, tmp_path):
    flat = ModelConfig.from_dir(hf_moe)
    assert (flat.moe.num_experts, flat.moe.top_k) == (16, 4)
    assert (flat.moe.expert_intermediate_size, flat.moe.shared_intermediate_size) == (64, 64)
    assert flat.intermediate_size == 0
    raw = json.loads((hf_moe / "config.json").read_text())
    nested = {"model_type": "qwen3_5_moe", "text_config": raw}
    assert ModelConfig.from_dict(nested) == ModelConfig.from_dict(raw)


CONFIG_CASES = [
    (
        "top-k above experts",
        lambda t, top: t.update(num_experts_per_tok=17),
        InconsistentShape,
        "num_experts_per_tok=17",
    ),
    (
        "too many experts",
        lambda t, top: t.update(num_experts=2048),
        UnsupportedExperts,
        "num_experts=2048",
    ),
    (
        "top-k past the limit",
        lambda t, top: t.update(num_experts=64, num_experts_per_tok=17),
        UnsupportedExperts,
        "num_experts_per_tok=17",
    ),
    (
        "unnormalised",
        lambda t, top: t.update(norm_topk_prob=False),
        UnsupportedExperts,
        "norm_topk_prob",
    ),
    (
        "dense layers",
        lambda t, top: t.update(mlp_only_layers=[1]),
        UnsupportedExperts,
        "mlp_only_layers",
    ),
    (
        "sparse step",
        lambda t, top: t.update(decoder_sparse_step=2),
        UnsupportedExperts,
        "decoder_sparse_step",
    ),
    (
        "no expert width",
        lambda t, top: t.pop("moe_intermediate_size"),
        ConfigError,
        "moe_intermediate_size",
    ),
    (
        "dense type with experts",
        lambda t, top: top.update(model_type="qwen3_5_text"),
        UnsupportedMoE,
        "num_experts",
    ),
    (
        "families disagree",
        lambda t, top: top.update(model_type="qwen3_5", text_config=dict(t)),
        UnsupportedModelType,
        "text_config.model_type",
    ),
]


@pytest.mark.parametrize("case", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_config_refusals_name_the_field(case, hf_moe_fused, tmp_path, no_reads):
    _, edit, error, field = case
    folder = _copy(hf_moe_fused, tmp_path)
    _edit_config(folder, edit)
    with pytest.raises(error) as info:
        load_model(folder)
    assert field in str(info.value)


def _shrink(name):
    return lambda ts: ts.__setitem__(name, ts[name][:, :-1].contiguous())


def _drop(*suffixes):
    def fn(ts):
        for k in [k for k in ts if k.endswith(suffixes)]:
            del ts[k]

    return fn


HEADER_CASES = [
    (
        "hf_moe_fused",
        _shrink("model.layers.1.mlp.experts.gate_up_proj"),
        BadTensor,
        "model.layers.1.mlp.experts.gate_up_proj",
    ),
    (
        "hf_moe_fused",
        _drop("experts.gate_up_proj", "experts.down_proj"),
        MissingTensor,
        "switch_mlp.gate_proj.weight (MLX)",
    ),
    (
        "hf_moe",
        _drop("layers.2.mlp.experts.7.up_proj.weight"),
        MissingTensor,
        "model.layers.2.mlp.experts.7.up_proj.weight",
    ),
    (
        "hf_moe",
        _shrink("model.layers.0.mlp.shared_expert_gate.weight"),
        BadTensor,
        "model.layers.0.mlp.shared_expert_gate.weight",
    ),
]


@pytest.mark.parametrize(
    "case",
    HEADER_CASES,
    ids=["fused shape", "no experts", "one expert missing", "shared gate shape"],
)
def test_header_refusals_name_the_tensor(case, tmp_path, request):
    name, edit, error, tensor = case
    folder = _copy(request.getfixturevalue(name), tmp_path)
    _edit_tensors(folder, edit)
    ckpt = Checkpoint(folder)
    with pytest.raises(
        error, match=tensor.replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")
    ):
        validate(ModelConfig.from_dir(folder), WeightMap(ckpt, ModelConfig.from_dir(folder)))
    assert ckpt.reads == 0


def test_mixed_bits_are_checked_against_the_headers(mlx_moe_mixed, tmp_path, no_reads):
    """The experts' up projection is 3-bit in the file; without its config entry it would be read
    at the default 4 bits, and its packed shape says otherwise."""
    folder = _copy(mlx_moe_mixed, tmp_path)
    _edit_config(
        folder,
        lambda t, top: [
            q.pop("language_model.model.layers.0.mlp.switch_mlp.up_proj")
            for q in (top["quantization"], top["quantization_config"])
        ],
    )
    with pytest.raises(BadTensor, match=r"layers\.0\.mlp\.switch_mlp\.up_proj\.weight"):
        load_model(folder)


# -- what loads --------------------------------------------------------------------------------


def _stack_bits(stack: ref_moe.ExpertStack):
    return stack.bits if stack.packed else None


def test_the_three_layouts_load(hf_moe, hf_moe_fused, mlx_moe_mixed, mlx_moe_q4):
    for path in (hf_moe, hf_moe_fused):
        moe = load_model(path).layers[0].mlp
        assert isinstance(moe, SparseMoE) and not moe.experts.gate.packed
        assert moe.experts.gate.shape == (64, 64) and moe.experts.down.shape == (64, 64)
    mixed = load_model(mlx_moe_mixed).layers[0].mlp
    assert [_stack_bits(s) for s in (mixed.experts.gate, mixed.experts.up, mixed.experts.down)] == [
        4,
        3,
        6,
    ]
    for model in (load_model(mlx_moe_q4), load_model(mlx_moe_mixed)):
        moe = model.layers[0].mlp
        assert moe.router.weight.bits == moe.shared_gate.weight.bits == 8  # mlx_lm's rule
        assert isinstance(moe.experts.gate.expert(3), QuantizedWeight)  # kept packed
        experts = sum(layer.mlp.experts.nbytes for layer in model.layers)
        assert experts < model.weight_bytes < 2 * experts


# -- the ops -----------------------------------------------------------------------------------


def test_route_ties_to_the_lowest_id_and_renormalises():
    logits = torch.tensor([[0.5, 2.0, 1.0, 2.0, 2.0, -1.0]] * 3)
    route = ref_moe.route(logits, 2)
    assert route.ids.tolist() == [[1, 3]] * 3
    assert torch.allclose(route.weights, torch.full((3, 2), 0.5))
    route = ref_moe.route(torch.tensor([[3.0, 0.0, 1.0, 2.0]]), 3)
    assert route.ids.tolist() == [[0, 2, 3]]  # ascending, weights alongside
    p = torch.softmax(torch.tensor([3.0, 1.0, 2.0]), -1)
    assert torch.allclose(route.weights[0], p / p.sum())


def test_combine_adds_in_ascending_id_then_the_shared_expert():
    """1e8 + 1 rounds to 1e8 in fp32: the order of the sum shows in the result."""
    routed = torch.tensor([[[1.0], [1e8], [-1e8]]]).expand(16, 3, 1)
    weights = torch.ones(16, 3)
    out = ref_moe.combine(routed, weights, torch.zeros(16, 1), torch.zeros(16, 1))
    assert out.flatten().tolist() == [0.0] * 16  # ((1 + 1e8) - 1e8), not (1e8 - 1e8) + 1
    shared = torch.full((16, 1), 4.0)
    out = ref_moe.combine(routed, weights, shared, torch.zeros(16, 1))
    assert out.flatten().tolist() == [2.0] * 16  # + sigmoid(0) * 4 last


def _random_experts(packed: bool, e: int = 8, h: int = 64, i: int = 64) -> ref_moe.Experts:
    g = torch.Generator().manual_seed(5)

    def stack(n, k):
        w = torch.randn((e, n, k), generator=g) * k**-0.5
        if not packed:
            return ref_moe.ExpertStack(w)
        return ref_moe.ExpertStack(*quantize(w, 4, 64), bits=4, group_size=64)

    return ref_moe.Experts(stack(i, h), stack(i, h), stack(h, i))


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_an_expert_gives_the_same_bits_for_1_row_or_500(packed):
    experts = _random_experts(packed)
    g = torch.Generator().manual_seed(6)
    x = torch.randn((500, 64), generator=g)
    ids = torch.sort(torch.rand((500, 8), generator=g).argsort(-1)[:, :2], -1).values
    ids[:, 0] = 0  # expert 0 serves every row
    together = ref_moe.expert_swiglu(x, ids, experts)
    for row in (0, 7, 499):
        alone = ref_moe.expert_swiglu(x[row : row + 1], ids[row : row + 1], experts)
        assert torch.equal(alone[0], together[row])


def test_planted_grouped_product_that_sees_the_row_count_is_caught(monkeypatch):
    """Each expert's rows as one call of their own count (no fixed row tile): the test above fails."""
    monkeypatch.setattr(ref_linear, "pad_rows", lambda x, tile=16: x)
    monkeypatch.setattr(
        ref_linear, "matmul_rows", lambda x, w, out=None, tile=None: torch.mm(x, w.t())
    )
    with pytest.raises(AssertionError):
        test_an_expert_gives_the_same_bits_for_1_row_or_500(False)


# -- random checkpoints of the released MoE shapes ------------------------------------------------


def _manifest(cfg: dict, mlx: bool) -> dict:
    prefix, head = (
        ("language_model.model.", "language_model.lm_head")
        if mlx
        else ("model.language_model.", "lm_head")
    )
    out = {}
    for local, dims, kind in _tensors(cfg, mlx):
        stem = head if local == "lm_head" else prefix + local
        if kind in ("linear", "router") and mlx:
            bits = 8 if kind == "router" else 4
            out[stem + ".weight"] = ("U32", (*dims[:-1], dims[-1] * bits // 32))
            out[stem + ".scales"] = out[stem + ".biases"] = ("BF16", (*dims[:-1], dims[-1] // 64))
        elif kind == "conv":
            out[stem] = ("BF16", (dims[0], 4, 1) if mlx else (dims[0], 1, 4))
        else:
            suffix = ".weight" if kind in ("linear", "router") else ""
            out[stem + suffix] = ("F32" if kind == "a_log" else "BF16", dims)
    return out


def _header_only(path, tensors) -> None:
    header = {
        name: {"dtype": dt, "shape": list(shape), "data_offsets": [0, 0]}
        for name, (dt, shape) in tensors.items()
    }
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)


@pytest.mark.parametrize("mlx", [False, True], ids=["hf", "mlx4"])
@pytest.mark.parametrize("shape,params", [("35b-a3b", 34.66e9), ("122b-a10b", 122.11e9)])
def test_released_moe_shapes_validate(shape, params, mlx, tmp_path):
    cfg = text_config(shape)
    raw = {"model_type": model_types(shape)[0], "text_config": cfg}
    if mlx:
        raw["quantization"] = {
            "group_size": 64,
            "bits": 4,
            **{
                f"language_model.model.{local}": {"group_size": 64, "bits": 8}
                for local, _, kind in _tensors(cfg, True)
                if kind == "router"
            },
        }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    _header_only(tmp_path / "model.safetensors", _manifest(cfg, mlx))
    config = ModelConfig.from_dir(tmp_path)
    ckpt = Checkpoint(tmp_path)
    validate(config, WeightMap(ckpt, config))
    assert ckpt.reads == 0
    assert (config.moe.num_experts, config.moe.top_k) == (256, 8)
    assert abs(sum(math.prod(d) for _, d, _ in _tensors(cfg)) / params - 1) < 1e-3


@pytest.mark.parametrize("quantize_as", [None, "4", "mixed"])
def test_make_random_tiny_moe_loads_and_runs(quantize_as, tmp_path):
    path = make_random(tmp_path / "ckpt", "tiny-moe", quantize_as)
    model = load_model(path)
    moe = model.layers[0].mlp
    assert isinstance(moe, SparseMoE) and moe.experts.num_experts == 8
    assert moe.experts.gate.packed == (quantize_as is not None)
    if quantize_as:
        assert moe.router.weight.bits == 8
    params = generate(make_engine(path), sample_prompt(1, 20, 500))
    assert len(params) == 16
