"""The released Qwen3.5 shapes, dense and MoE (docs/model.md, 'Released shapes' and 'Mixture of
experts'), as text_config dicts."""

from __future__ import annotations

COMMON = {
    "vocab_size": 248320,
    "head_dim": 256,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "max_position_embeddings": 262144,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000,
        "partial_rotary_factor": 0.25,
    },
    "eos_token_id": 248044,
}

SHAPES = {  # hidden, intermediate, layers, q heads, kv heads, GDN value heads, tied
    "0.8b": (1024, 3584, 24, 8, 2, 16, True),
    "2b": (2048, 6144, 24, 8, 2, 16, True),
    "4b": (2560, 9216, 32, 16, 4, 32, True),
    "9b": (4096, 12288, 32, 16, 4, 32, False),
    "27b": (5120, 17408, 64, 24, 4, 48, False),
    "tiny": (128, 256, 8, 4, 2, 4, False),
    "35b-a3b": (2048, 0, 40, 16, 2, 32, False),
    "122b-a10b": (3072, 0, 48, 32, 2, 64, False),
    "tiny-moe": (128, 0, 4, 4, 2, 4, False),
}
MOE_SHAPES = {  # experts, top-k, expert intermediate, shared-expert intermediate
    "35b-a3b": (256, 8, 512, 512),
    "122b-a10b": (256, 8, 1024, 1024),
    "tiny-moe": (8, 2, 64, 128),
}


def model_types(shape: str) -> tuple[str, str]:
    """(model_type, text_config.model_type) of the shape's config.json."""
    return (
        ("qwen3_5_moe", "qwen3_5_moe_text") if shape in MOE_SHAPES else ("qwen3_5", "qwen3_5_text")
    )


def text_config(shape: str) -> dict:
    hidden, inter, layers, heads, kv, v_heads, tied = SHAPES[shape]
    cfg = dict(
        COMMON,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        linear_num_value_heads=v_heads,
        tie_word_embeddings=tied,
    )
    cfg["layer_types"] = [
        "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)
    ]
    if shape.startswith("tiny"):
        cfg.update(
            vocab_size=512,
            head_dim=32,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            linear_num_key_heads=2,
        )
    if shape in MOE_SHAPES:
        experts, top_k, inter, shared = MOE_SHAPES[shape]
        del cfg["intermediate_size"]
        cfg.update(
            num_experts=experts,
            num_experts_per_tok=top_k,
            moe_intermediate_size=inter,
            shared_expert_intermediate_size=shared,
        )
    return cfg
