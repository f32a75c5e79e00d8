"""`tensorfold make-random OUT --shape 9b`: a loadable checkpoint of a released shape with random
weights, for benchmarks without downloads. Timings do not depend on weight values.

bf16 files use the Hugging Face layout (MoE experts fused); quantized ones (--quantize 4, 8, mixed
or mixed45) the MLX layout with affine-packed weights (random words, small signed scales) and a `quantization`
block (MoE experts stacked as `switch_mlp`, the router and the shared-expert gate at 8 bits, as
mlx_lm makes them)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from .shapes import SHAPES, model_types, text_config

SHARD_BYTES = 4 << 30
MIXED_HIGH = ("mlp.down_proj", "self_attn.v_proj", "lm_head")  # 6-bit in the mixed recipe
# 5-bit in the mixed45 recipe (4-bit with the GDN out and gate inputs and the embedding at 5)
MIXED45_HIGH = (
    "linear_attn.out_proj",
    "linear_attn.in_proj_a",
    "linear_attn.in_proj_b",
    "embed_tokens",
)


# checkpoint format names (benchmarks, tests) -> --quantize
FORMATS = {"bf16": None, "4bit": "4", "8bit": "8", "mixed": "mixed", "mixed45": "mixed45"}


def add_parser(sub) -> None:
    p = sub.add_parser("make-random", help="write a random checkpoint of a released shape")
    p.add_argument("out")
    p.add_argument("--shape", choices=sorted(SHAPES), default="9b")
    p.add_argument("--quantize", choices=["4", "8", "mixed", "mixed45"], default=None)
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where to draw the numbers (cuda is faster)")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="copy this folder's tokenizer files in (e.g. the demo model's), for served runs",
    )
    p.set_defaults(func=_command)


def _command(args) -> int:
    path = make_random(args.out, args.shape, args.quantize, args.group_size, args.seed, args.device)
    if args.tokenizer:
        copy_tokenizer(Path(args.tokenizer), path)
    print(path)
    return 0


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)


def copy_tokenizer(src: Path, dst: Path) -> None:
    """A tokenizer whose ids fit the vocabulary, so prompts can be sent as text (timings do not
    depend on which ids they are)."""
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)


def _tensors(cfg: dict, mlx: bool = False) -> list[tuple[str, tuple[int, ...], str]]:
    """(local name, shape, kind) of every text tensor; kind: linear, router (a projection kept at 8
    bits when packed), experts (fused HF experts), norm (zero-centred), or raw."""
    h, i = cfg["hidden_size"], cfg.get("intermediate_size", 0)
    d, hq, hkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hv, dk, dv = (
        cfg["linear_num_value_heads"],
        cfg["linear_key_head_dim"],
        cfg["linear_value_head_dim"],
    )
    key_dim, value_dim = cfg["linear_num_key_heads"] * dk, hv * dv
    conv = 2 * key_dim + value_dim
    out = [("embed_tokens", (cfg["vocab_size"], h), "linear"), ("norm.weight", (h,), "norm")]
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head", (cfg["vocab_size"], h), "linear"))
    for n, kind in enumerate(cfg["layer_types"]):
        p = f"layers.{n}."
        out += [
            (p + "input_layernorm.weight", (h,), "norm"),
            (p + "post_attention_layernorm.weight", (h,), "norm"),
        ]
        out += (
            _moe_tensors(cfg, p + "mlp.", mlx)
            if "num_experts" in cfg
            else [
                (p + "mlp.gate_proj", (i, h), "linear"),
                (p + "mlp.up_proj", (i, h), "linear"),
                (p + "mlp.down_proj", (h, i), "linear"),
            ]
        )
        if kind == "full_attention":
            a = p + "self_attn."
            out += [
                (a + "q_proj", (2 * hq * d, h), "linear"),
                (a + "k_proj", (hkv * d, h), "linear"),
                (a + "v_proj", (hkv * d, h), "linear"),
                (a + "o_proj", (h, hq * d), "linear"),
                (a + "q_norm.weight", (d,), "norm"),
                (a + "k_norm.weight", (d,), "norm"),
            ]
        else:
            g = p + "linear_attn."
            out += [
                (g + "in_proj_qkv", (conv, h), "linear"),
                (g + "in_proj_z", (value_dim, h), "linear"),
                (g + "in_proj_b", (hv, h), "linear"),
                (g + "in_proj_a", (hv, h), "linear"),
                (g + "out_proj", (h, value_dim), "linear"),
                (g + "conv1d.weight", (conv, 4), "conv"),
                (g + "A_log", (hv,), "a_log"),
                (g + "dt_bias", (hv,), "raw"),
                (g + "norm.weight", (dv,), "gnorm"),
            ]
    return out


def _moe_tensors(cfg: dict, p: str, mlx: bool) -> list[tuple[str, tuple[int, ...], str]]:
    h, e = cfg["hidden_size"], cfg["num_experts"]
    i, s = cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    if mlx:
        experts = [
            (p + "switch_mlp.gate_proj", (e, i, h), "linear"),
            (p + "switch_mlp.up_proj", (e, i, h), "linear"),
            (p + "switch_mlp.down_proj", (e, h, i), "linear"),
        ]
    else:
        experts = [
            (p + "experts.gate_up_proj", (e, 2 * i, h), "experts"),
            (p + "experts.down_proj", (e, h, i), "experts"),
        ]
    return [
        (p + "gate", (e, h), "router"),
        *experts,
        (p + "shared_expert.gate_proj", (s, h), "linear"),
        (p + "shared_expert.up_proj", (s, h), "linear"),
        (p + "shared_expert.down_proj", (h, s), "linear"),
        (p + "shared_expert_gate", (1, h), "router"),
    ]


class _Writer:
    """Collects tensors into shards of about SHARD_BYTES and writes the index."""

    def __init__(self, out: Path) -> None:
        self.out, self.shard, self.size, self.files, self.weight_map = out, {}, 0, [], {}

    def add(self, name: str, t: torch.Tensor) -> None:
        self.shard[name] = t.contiguous().cpu()
        self.size += t.numel() * t.element_size()
        if self.size >= SHARD_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.shard:
            name = f"model-{len(self.files) + 1:05d}.safetensors"
            save_file(self.shard, self.out / name, metadata={"format": "pt"})
            self.files.append(name)
            self.weight_map.update({k: name for k in self.shard})
            self.shard, self.size = {}, 0

    def close(self) -> None:
        self.flush()
        (self.out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": self.weight_map}, indent=1)
        )


@dataclass(frozen=True)
class RandomPlan:
    """What make_random writes, tensor by tensor. Each entry is drawn from its own generator
    (seeded by the seed and the entry's index), so any one can be drawn alone and in any order:
    the in-memory checkpoint (RandomCheckpoint) draws them as the loader asks."""

    shape: str
    quantize: str | None = None
    group_size: int = 64
    seed: int = 0
    device: str = "cpu"

    @property
    def mlx(self) -> bool:
        return self.quantize is not None

    @cached_property
    def entries(self) -> list[tuple[str, str, tuple[int, ...], str]]:
        """(stem, local name, shape, kind) in file order."""
        prefix, head = (
            ("language_model.model.", "language_model.lm_head")
            if self.mlx
            else ("model.", "lm_head")
        )
        return [
            (head if local == "lm_head" else prefix + local, local, dims, kind)
            for local, dims, kind in _tensors(text_config(self.shape), self.mlx)
        ]

    def draw(self, index: int, device: str | None = None) -> dict[str, torch.Tensor]:
        """Entry `index`'s tensors by name (a packed weight is three); device "meta" gives their
        shapes and dtypes without drawing."""
        stem, local, dims, kind = self.entries[index]
        device = device or self.device
        g = None
        if device != "meta":
            g = torch.Generator(device=device).manual_seed(self.seed * 1_000_003 + index)
        if kind in ("linear", "router") and self.mlx:
            bits, gs = self._format(local, kind)
            return {f"{stem}.{k}": t for k, t in _packed(dims, bits, gs, g, device).items()}
        suffix = ".weight" if kind in ("linear", "router") else ""
        return {stem + suffix: _dense(dims, kind, self.mlx, g, device)}

    def _format(self, local: str, kind: str) -> tuple[int, int]:
        return _bits(local, kind, self.quantize), 64 if kind == "router" else self.group_size

    def config(self) -> dict:
        cfg = text_config(self.shape)
        top_type, text_type = model_types(self.shape)
        arch = (
            "Qwen3_5MoeForConditionalGeneration"
            if top_type.endswith("moe")
            else "Qwen3_5ForConditionalGeneration"
        )
        config = {
            "model_type": top_type,
            "architectures": [arch],
            "text_config": dict(cfg, model_type=text_type),
            "tie_word_embeddings": cfg["tie_word_embeddings"],
            "eos_token_id": 248046,
        }
        if self.mlx:
            base = 8 if self.quantize == "8" else 4
            quant: dict = {"group_size": self.group_size, "bits": base, "mode": "affine"}
            for stem, local, _, kind in self.entries:
                bits, gs = self._format(local, kind)
                if kind in ("linear", "router") and (bits, gs) != (base, self.group_size):
                    quant[stem] = {"group_size": gs, "bits": bits, "mode": "affine"}
            config["quantization"] = config["quantization_config"] = quant
        return config

    def write_config(self, out: str | Path) -> Path:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(self.config(), indent=1))
        return out


def make_random(
    out: str | Path,
    shape: str,
    quantize: str | None = None,
    group_size: int = 64,
    seed: int = 0,
    device: str = "cpu",
) -> Path:
    plan = RandomPlan(shape, quantize, group_size, seed, device)
    out = plan.write_config(out)
    writer = _Writer(out)
    for i in tqdm(range(len(plan.entries)), desc=f"random {shape}", unit="tensor"):
        for name, t in plan.draw(i).items():
            writer.add(name, t)
    writer.close()
    return out


def _bits(local: str, kind: str, quantize: str) -> int:
    """The router and the shared-expert gate at 8 bits g64 (routing decides which experts run)."""
    if kind == "router":
        return 8
    if quantize == "mixed":
        return 6 if any(s in local for s in MIXED_HIGH) else 4
    if quantize == "mixed45":
        return 5 if any(s in local for s in MIXED45_HIGH) else 4
    return int(quantize)


def _dense(dims, kind, mlx, g, device) -> torch.Tensor:
    if kind == "conv":  # HF [C, 1, K]; MLX [C, K, 1]
        t = torch.randn(dims, generator=g, device=device) * 0.3
        return (t[:, :, None] if mlx else t[:, None, :]).to(torch.bfloat16)
    if kind == "a_log":
        return torch.rand(dims, generator=g, device=device).mul(2.0).sub(1.0).float()
    if kind in ("norm", "gnorm"):
        t = torch.randn(dims, generator=g, device=device) * 0.05
        shifted = kind == "gnorm" or mlx  # MLX stores 1 + w; the gated norm is plain
        return (t + 1.0 if shifted else t).to(
            torch.bfloat16 if kind == "norm" or mlx else torch.float32
        )
    std = dims[-1] ** -0.5 if kind in ("linear", "router", "experts") else 0.5
    return (torch.randn(dims, generator=g, device=device) * std).to(torch.bfloat16)


def _packed(dims, bits, group_size, g, device) -> dict[str, torch.Tensor]:
    *lead, k = dims  # [N, K], or [E, N, K] for stacked experts
    words = (
        torch.randint(
            -(1 << 31),
            (1 << 31) - 1,
            (*lead, k * bits // 32),
            generator=g,
            device=device,
            dtype=torch.int64,
        )
        .to(torch.int32)
        .view(torch.uint32)
    )
    step = (2.0 * k**-0.5) / ((1 << bits) - 1)
    sign = torch.where(
        torch.rand((*lead, k // group_size), generator=g, device=device) < 0.5, -1.0, 1.0
    )
    scales = (sign * step).to(torch.bfloat16)
    biases = (-scales.float() * ((1 << bits) - 1) / 2).to(torch.bfloat16)
    return {"weight": words, "scales": scales, "biases": biases}
