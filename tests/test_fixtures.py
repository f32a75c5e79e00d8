"""The tiny checkpoints are what conftest says they are (formats, names, dtypes, runners)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fixtures.checkpoints import (
    CONTROL_TOKENS,
    MARGIN_PROMPTS,
    MIXED_RECIPE,
    SPEC_A,
    SPEC_B,
    build_mlx_checkpoint,
    hf_forward_logits,
    hf_greedy,
    logit_margins,
    mlx_teacher_forced,
    special_token_ids,
)
from safetensors import safe_open

PROMPT = MARGIN_PROMPTS[0]


def _config(d: Path) -> dict:
    return json.loads((d / "config.json").read_text())


def _shards(d: Path) -> list[Path]:
    return sorted(d.glob("*.safetensors"))


def _meta(d: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (safetensors dtype, shape) over every shard of a checkpoint dir."""
    out = {}
    for shard in _shards(d):
        with safe_open(str(shard), "pt") as f:
            for k in f.keys():
                s = f.get_slice(k)
                out[k] = (s.get_dtype(), s.get_shape())
    return out


def _tensor(d: Path, name: str) -> torch.Tensor:
    for shard in _shards(d):
        with safe_open(str(shard), "pt") as f:
            if name in f.keys():
                return f.get_tensor(name)
    raise KeyError(name)


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_ids_and_template(tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    ids = special_token_ids(tokenizer_dir)
    assert list(ids.values()) == list(range(500, 500 + len(CONTROL_TOKENS)))  # end of vocab
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert len(tok) == 514
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    assert tok.eos_token_id == ids["<|im_end|>"] == 502
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 3?"}]
    head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2 + 3?<|im_end|>\n"
    off = tok.apply_chat_template(
        msgs, add_generation_prompt=True, enable_thinking=False, tokenize=False
    )
    assert off == head + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    on = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert on == head + "<|im_start|>assistant\n<think>\n"
    # Control tokens are atomic; think/tool markers survive skip_special_tokens like Qwen's.
    enc = tok.encode("<think>x</think><|im_end|>")
    assert enc[0] == ids["<think>"] and enc[-1] == ids["<|im_end|>"]
    assert tok.decode(enc, skip_special_tokens=True) == "<think>x</think>"


def test_tokenizer_tool_turns_render(tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": "x"}}}
    msgs = [
        {"role": "user", "content": "add"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "3"},
    ]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    assert (
        "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n"
        "<parameter=b>\nx\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
    ) in text
    assert text.endswith("<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n")


def test_mlx_loads_tokenizer(tokenizer_dir: Path) -> None:
    pytest.importorskip("mlx_lm", reason="mlx_lm not installed")
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    assert 502 in tok.eos_token_ids
    assert tok.encode("<think>") == [512]


def test_checkpoint_tokenizers_agree(
    tokenizer_dir: Path, hf_tiny: Path, hf_tiny_nested: Path, mlx_q4: Path
) -> None:
    """transformers swaps in Qwen3_5Tokenizer for model_type qwen3_5 and mlx_lm re-saves the
    tokenizer; every path must still encode exactly like the raw tokenizer.json."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    raw = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    text = "Héllo wörld 12 ½ naïve Ωμέγα 日本語 <think>x</think><|im_end|>\n\tf(): it's"
    for d in (tokenizer_dir, hf_tiny, hf_tiny_nested, mlx_q4):
        tok = AutoTokenizer.from_pretrained(d)
        assert tok.encode(text) == raw.encode(text).ids, d.name
        assert tok.decode(tok.encode(text)) == text


# ----------------------------------------------------------------------------- HF files


def test_hf_flat_layout(hf_tiny: Path) -> None:
    cfg = _config(hf_tiny)
    assert cfg["model_type"] == "qwen3_5_text" and cfg["architectures"] == ["Qwen3_5ForCausalLM"]
    assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert cfg["vocab_size"] == 576 and cfg["tie_word_embeddings"] is True
    meta = _meta(hf_tiny)
    assert "lm_head.weight" not in meta  # tied
    assert meta["model.layers.0.linear_attn.A_log"] == ("F32", [4])
    assert meta["model.layers.0.linear_attn.norm.weight"] == ("F32", [16])
    assert meta["model.layers.0.linear_attn.conv1d.weight"] == ("BF16", [128, 1, 4])
    assert meta["model.layers.3.self_attn.q_proj.weight"] == ("BF16", [256, 64])
    others = {dt for k, (dt, _) in meta.items() if not k.endswith(("A_log", "attn.norm.weight"))}
    assert others == {"BF16"}
    assert _tensor(hf_tiny, "model.norm.weight").abs().max() > 0.1  # non-trivial 1+w norm
    gen = json.loads((hf_tiny / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [502, 500]


def test_hf_nested_layout(hf_tiny_nested: Path, hf_tiny: Path) -> None:
    cfg = _config(hf_tiny_nested)
    assert cfg["model_type"] == "qwen3_5"
    assert cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert cfg["text_config"]["model_type"] == "qwen3_5_text"
    assert cfg["text_config"]["hidden_size"] == SPEC_A.hidden_size
    assert cfg["vision_config"]["model_type"] == "qwen3_5_vision"
    meta = _meta(hf_tiny_nested)
    assert any(k.startswith("model.visual.") for k in meta)
    assert {"mtp.fc.weight", "mtp.layers.0.mlp.gate_proj.weight"} <= set(meta)
    flat = _meta(hf_tiny)
    for k in flat:  # same text weights, VL prefix
        nk = k.replace("model.", "model.language_model.", 1)
        assert torch.equal(_tensor(hf_tiny, k), _tensor(hf_tiny_nested, nk)), k


def test_hf_sharded_untied_and_bf16_gdn(hf_tiny_b: Path, hf_tiny_c: Path) -> None:
    index = json.loads((hf_tiny_b / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    meta_b = _meta(hf_tiny_b)
    assert meta_b["lm_head.weight"] == ("BF16", [576, SPEC_B.hidden_size])
    assert sum(k.endswith("self_attn.q_proj.weight") for k in meta_b) == 2  # layers 3 and 7
    meta_c = _meta(hf_tiny_c)
    assert meta_c["model.layers.0.linear_attn.A_log"][0] == "BF16"
    assert meta_c["model.layers.0.linear_attn.conv1d.weight"][1] == [384, 1, 4]


def test_hf_models_are_confident(hf_tiny: Path, hf_tiny_b: Path, hf_tiny_c: Path) -> None:
    prompts = MARGIN_PROMPTS
    for d in (hf_tiny, hf_tiny_b, hf_tiny_c):
        margins = logit_margins(d, prompts)
        assert torch.isfinite(margins).all()
        assert margins.median() > 0.5, (d.name, margins.median())
        top = hf_forward_logits(d, PROMPT).argmax(-1)
        assert top.max() < 514  # padding rows of the vocab never win


def test_hf_greedy_matches_forward(hf_tiny: Path, hf_tiny_nested: Path) -> None:
    out = hf_greedy(hf_tiny, PROMPT, 8)
    assert len(out) == 8
    assert hf_greedy(hf_tiny_nested, PROMPT, 8) == out
    logits = hf_forward_logits(hf_tiny, PROMPT + out)[len(PROMPT) - 1 : -1]
    top2 = logits.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-3
    assert (logits.argmax(-1) == torch.tensor(out))[clear].all()


# ----------------------------------------------------------------------------- MLX files


def _bits_of(meta: dict, stem: str, in_dim: int) -> int:
    return meta[f"{stem}.weight"][1][-1] * 32 // in_dim


def test_mlx_q4_layout(mlx_q4: Path, hf_tiny_b: Path) -> None:
    cfg = _config(mlx_q4)
    q = {"group_size": 64, "bits": 4, "mode": "affine"}
    assert cfg["quantization"] == q and cfg["quantization_config"] == q
    assert cfg["model_type"] == "qwen3_5" and "text_config" in cfg
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= {
        p.name for p in mlx_q4.iterdir()
    }
    meta = _meta(mlx_q4)
    assert not any(k.startswith(("mtp.", "model.", "vision")) for k in meta)
    stem = "language_model.model.layers.0.linear_attn.in_proj_qkv"
    conv_dim = 2 * 2 * 32 + 2 * 32  # SPEC_B: 2 key heads, 2 value heads of 32
    assert meta[f"{stem}.weight"] == ("U32", [conv_dim, 128 * 4 // 32])
    assert meta[f"{stem}.scales"] == ("BF16", [conv_dim, 2]) == meta[f"{stem}.biases"]
    assert meta["language_model.lm_head.weight"][0] == "U32"
    gdn = "language_model.model.layers.0.linear_attn"
    assert meta[f"{gdn}.conv1d.weight"] == ("BF16", [conv_dim, 4, 1])
    assert meta[f"{gdn}.A_log"][0] == "F32" and meta[f"{gdn}.norm.weight"][0] == "BF16"
    # Zero-centred norms are stored shifted, bf16(1 + w); the gated GDN norm is not.
    hf_w = _tensor(hf_tiny_b, "model.layers.0.input_layernorm.weight")
    mlx_w = _tensor(mlx_q4, "language_model.model.layers.0.input_layernorm.weight")
    assert torch.equal(mlx_w, (hf_w.float() + 1.0).to(torch.bfloat16))
    hf_g = _tensor(hf_tiny_b, "model.layers.0.linear_attn.norm.weight")
    assert torch.equal(_tensor(mlx_q4, f"{gdn}.norm.weight"), hf_g.to(torch.bfloat16))
    hf_a = _tensor(hf_tiny_b, "model.layers.0.linear_attn.A_log")
    assert torch.equal(_tensor(mlx_q4, f"{gdn}.A_log"), hf_a)  # F32 kept, unrounded


def test_mlx_q8_g32_tied(mlx_q8_g32: Path) -> None:
    cfg = _config(mlx_q8_g32)
    assert cfg["quantization"] == {"group_size": 32, "bits": 8, "mode": "affine"}
    meta = _meta(mlx_q8_g32)
    assert "language_model.lm_head.weight" not in meta  # tied: the quantized table is the head
    emb = "language_model.model.embed_tokens"
    assert meta[f"{emb}.weight"] == ("U32", [576, 64 * 8 // 32])
    assert meta[f"{emb}.scales"][1] == [576, 2]


def test_mlx_mixed_bits(mlx_mixed: Path) -> None:
    q = _config(mlx_mixed)["quantization"]
    assert (q["group_size"], q["bits"]) == (64, 4)
    assert q["language_model.lm_head"]["bits"] == 6
    assert q["language_model.model.layers.0.mlp.down_proj"]["bits"] == 6
    assert q["language_model.model.layers.0.linear_attn.out_proj"]["bits"] == 5
    assert q["language_model.model.layers.3.self_attn.v_proj"] == {
        "group_size": 32,
        "bits": 8,
        "mode": "affine",
    }
    assert "language_model.model.layers.0.mlp.up_proj" not in q  # global default applies
    meta = _meta(mlx_mixed)
    pre = "language_model.model.layers"
    assert _bits_of(meta, f"{pre}.0.mlp.down_proj", 256) == 6
    assert _bits_of(meta, f"{pre}.0.linear_attn.out_proj", 256) == 5
    assert _bits_of(meta, f"{pre}.0.mlp.up_proj", 128) == 4
    assert meta[f"{pre}.3.self_attn.v_proj.scales"][1] == [64, 128 // 32]
    assert meta[f"{pre}.0.linear_attn.A_log"][0] == "BF16"  # source stored BF16
    assert set(MIXED_RECIPE) == {"down_proj", "out_proj", "lm_head", "self_attn.v_proj"}


def test_mlx_runs_and_teacher_forcing(mlx_q8_g32: Path, mlx_mixed: Path) -> None:
    from mlx_lm import generate, load

    model, tok = load(str(mlx_q8_g32))
    text = generate(model, tok, PROMPT, max_tokens=4)
    assert isinstance(text, str)
    for d in (mlx_q8_g32, mlx_mixed):
        hist = mlx_teacher_forced(d, PROMPT, 6)
        assert [h["pos"] for h in hist] == list(range(len(PROMPT), len(PROMPT) + 6))
        for h in hist:
            assert h["top1_logit"] >= h["top2_logit"] and h["top1"] != h["top2"]
            assert isinstance(h["top1_logit"], float) and h["token"] < 576
    # float32 activations: same file, low-noise logits; the chosen token is the logit argmax.
    hist32 = mlx_teacher_forced(mlx_q8_g32, PROMPT, 6, activations="float32")
    assert all(h["token"] == h["top1"] for h in hist32)


def test_mlx_convert_from_nested(hf_tiny_nested: Path, tmp_path: Path) -> None:
    pytest.importorskip("mlx_lm", reason="mlx_lm not installed")
    out = build_mlx_checkpoint(hf_tiny_nested, tmp_path / "q4n", bits=4, group_size=64)
    meta = _meta(out)
    assert not any("visual" in k or k.startswith("mtp.") for k in meta)
    assert "vision_config" not in _config(out)  # mlx_lm drops it
