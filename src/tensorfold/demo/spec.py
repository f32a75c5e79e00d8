"""The demo model's shape: the real Qwen3.5 dense layout at about 7M parameters."""

from __future__ import annotations

from dataclasses import asdict, dataclass

VOCAB_SIZE = 2048  # BPE merges + control tokens, a multiple of 64


@dataclass(frozen=True)
class ModelSpec:
    """The demo's Qwen3.5 shape: every linear input width is a multiple of 64 (MLX 4-bit g64)."""

    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 8
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    linear_num_key_heads: int = 4
    linear_num_value_heads: int = 8
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    partial_rotary_factor: float = 0.25
    rope_theta: float = 1e7
    max_position_embeddings: int = 65536

    def text_config(self, vocab_size: int, ids: dict[str, int]) -> dict:
        rope = ("partial_rotary_factor", "rope_theta")
        shape = {k: v for k, v in asdict(self).items() if k not in rope}
        return dict(
            shape,
            vocab_size=vocab_size,
            linear_conv_kernel_dim=4,
            tie_word_embeddings=True,
            # mlx_lm only knows full attention at (i + 1) % 4 == 0.
            layer_types=[
                "full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                for i in range(self.num_hidden_layers)
            ],
            rope_parameters={
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
                "mrope_section": self.mrope_section(),
                "mrope_interleaved": True,
            },
            rms_norm_eps=1e-6,
            hidden_act="silu",
            bos_token_id=None,
            eos_token_id=ids["<|endoftext|>"],
            pad_token_id=ids["<|endoftext|>"],
        )

    def mrope_section(self) -> list[int]:
        # The released [11, 11, 10] scaled to our rotary pairs; text-only input never uses it.
        n = int(self.head_dim * self.partial_rotary_factor) // 2
        w = n // 3
        h = (n - w) // 2
        return [n - h - w, h, w]
