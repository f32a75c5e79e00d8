"""Every refusal is a named error, raised before any tensor data is read."""

import json
import shutil

import pytest
import torch

from tensorfold.errors import (
    BadTensor,
    ConfigError,
    InconsistentShape,
    MissingTensor,
    UnknownLayerType,
    UnsupportedModelType,
    UnsupportedMoE,
    UnsupportedQuantization,
)
from tensorfold.models import checkpoint as ckpt_mod
from tensorfold.models.loader import load_model


@pytest.fixture
def no_reads(monkeypatch):
    def refuse(self, name):
        raise AssertionError(f"tensor {name} was read before the refusal")

    monkeypatch.setattr(ckpt_mod.Checkpoint, "read", refuse)


def _copy(src, tmp_path, name="ckpt"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def _edit_config(folder, fn):
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    fn(cfg.get("text_config", cfg), cfg)
    path.write_text(json.dumps(cfg))


CONFIG_CASES = [
    (
        "model_type",
        lambda t, top: top.update(model_type="llama"),
        UnsupportedModelType,
        "model_type",
    ),
    # An MoE type is served (tests/test_moe.py), but not without its experts; a dense one with them is refused.
    (
        "moe type",
        lambda t, top: top.update(model_type="qwen3_5_moe"),
        ConfigError,
        "num_experts is missing",
    ),
    ("moe fields", lambda t, top: t.update(num_experts=8), UnsupportedMoE, "num_experts"),
    (
        "layer type",
        lambda t, top: t["layer_types"].__setitem__(1, "sliding_attention"),
        UnknownLayerType,
        "layer_types[1]",
    ),
    ("layer count", lambda t, top: t["layer_types"].pop(), InconsistentShape, "layer_types"),
    (
        "gqa",
        lambda t, top: t.update(num_key_value_heads=3),
        InconsistentShape,
        "num_key_value_heads",
    ),
    (
        "gdn heads",
        lambda t, top: t.update(linear_num_value_heads=3),
        InconsistentShape,
        "linear_num_value_heads",
    ),
    (
        "rope",
        lambda t, top: t.update(rope_parameters={"rope_type": "yarn", "factor": 4.0}),
        ConfigError,
        "rope_parameters.rope_type",
    ),
    (
        "bits",
        lambda t, top: top.update(quantization={"bits": 7, "group_size": 64}),
        UnsupportedQuantization,
        "quantization.bits",
    ),
    (
        "group",
        lambda t, top: top.update(quantization={"bits": 4, "group_size": 48}),
        UnsupportedQuantization,
        "quantization.group_size",
    ),
    (
        "mode",
        lambda t, top: top.update(quantization={"bits": 4, "group_size": 64, "mode": "mxfp4"}),
        UnsupportedQuantization,
        "quantization.mode",
    ),
    (
        "method",
        lambda t, top: top.update(quantization_config={"quant_method": "gptq"}),
        UnsupportedQuantization,
        "quant_method",
    ),
]


@pytest.mark.parametrize("case", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_config_refusals_name_the_field(case, hf_tiny, tmp_path, no_reads):
    _, edit, error, field = case
    folder = _copy(hf_tiny, tmp_path)
    _edit_config(folder, edit)
    with pytest.raises(error) as info:
        load_model(folder)
    assert field in str(info.value)


@pytest.mark.parametrize(
    "name, text, why",
    [
        ("config.json", "{not json", "config.json: not JSON"),
        ("config.json", "[1, 2]", "config.json: must hold a JSON object"),
        ("generation_config.json", '{"eos_token_id": ', "generation_config.json: not JSON"),
    ],
)
def test_a_settings_file_that_is_not_json_is_named(name, text, why, hf_tiny, tmp_path, no_reads):
    folder = _copy(hf_tiny, tmp_path)
    (folder / name).write_text(text)
    with pytest.raises(ConfigError, match=why):
        load_model(folder)


def test_nested_config_field_is_named_with_its_path(hf_tiny_nested, tmp_path, no_reads):
    folder = _copy(hf_tiny_nested, tmp_path)
    _edit_config(folder, lambda t, top: t.update(num_key_value_heads=3))
    with pytest.raises(InconsistentShape, match=r"text_config\.num_key_value_heads"):
        load_model(folder)


def _rewrite_tensor(folder, name, tensor):
    from safetensors.torch import load_file, save_file

    for file in folder.glob("*.safetensors"):
        tensors = load_file(file)
        if name in tensors:
            tensors[name] = tensor
            save_file(tensors, file, metadata={"format": "pt"})
            return
    raise KeyError(name)


def _a_log_key(folder):
    from safetensors import safe_open

    for file in folder.glob("*.safetensors"):
        with safe_open(file, "pt") as fh:
            for key in fh.keys():
                if key.endswith("linear_attn.A_log"):
                    return key, fh.get_tensor(key)
    raise KeyError("A_log")


def test_f16_a_log_is_refused_by_name(hf_tiny, tmp_path):
    folder = _copy(hf_tiny, tmp_path)
    key, a_log = _a_log_key(folder)
    _rewrite_tensor(folder, key, a_log.to(torch.float16))
    with pytest.raises(BadTensor) as info:
        with _no_reads():
            load_model(folder)
    assert key in str(info.value) and "F16" in str(info.value) and "F32/BF16" in str(info.value)


def test_misshaped_tensor_is_refused_by_name(hf_tiny, tmp_path):
    folder = _copy(hf_tiny, tmp_path)
    key, a_log = _a_log_key(folder)
    _rewrite_tensor(folder, key, torch.cat([a_log, a_log]))
    with pytest.raises(BadTensor) as info:
        with _no_reads():
            load_model(folder)
    assert key in str(info.value) and str(list(a_log.shape)) in str(info.value)


def test_missing_tensor_is_refused_by_name(hf_tiny, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _copy(hf_tiny, tmp_path)
    file = next(folder.glob("*.safetensors"))
    tensors = load_file(file)
    victim = next(k for k in tensors if k.endswith("mlp.down_proj.weight"))
    del tensors[victim]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(MissingTensor, match=victim.replace(".", r"\.")):
        with _no_reads():
            load_model(folder)


class _no_reads:
    """Context manager form of the no_reads fixture, for tests that first rewrite files."""

    def __enter__(self):
        self.saved = ckpt_mod.Checkpoint.read

        def refuse(_self, name):
            raise AssertionError(f"tensor {name} was read before the refusal")

        ckpt_mod.Checkpoint.read = refuse

    def __exit__(self, *exc):
        ckpt_mod.Checkpoint.read = self.saved
        return False


def test_both_a_log_dtypes_load(hf_tiny, hf_tiny_c):
    for folder in (hf_tiny, hf_tiny_c):  # F32 A_log (official) and BF16 A_log
        model = load_model(folder)
        assert model.config.num_layers > 0


def test_caches_that_do_not_fit_are_refused_before_allocation(hf_tiny, monkeypatch):
    """--parallel x --context asking for more KV cache than the device has free is a named
    refusal, raised before the pools are allocated; a context that fits is served."""
    from tensorfold.cache import KVPool, budget
    from tensorfold.engine.engine import Engine, EngineConfig
    from tensorfold.errors import CacheTooLarge

    model = load_model(hf_tiny, dtype=torch.float32)
    monkeypatch.setattr(budget, "free_bytes", lambda device: 64 << 20)  # 64 MiB free
    allocated = []
    monkeypatch.setattr(KVPool, "__init__", lambda self, *a: allocated.append(a))
    with pytest.raises(CacheTooLarge, match=r"--parallel 4 x --context 1048576"):
        Engine(model, None, EngineConfig(parallel=4, context=1 << 20, chunk=64))
    assert allocated == []
    monkeypatch.undo()
    monkeypatch.setattr(budget, "free_bytes", lambda device: 64 << 20)
    Engine(model, None, EngineConfig(parallel=2, context=512, chunk=64))
