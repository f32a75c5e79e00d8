"""Model configuration: config.json of a Qwen3.5 checkpoint, validated before any weight is read."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import (
    ConfigError,
    InconsistentShape,
    UnknownLayerType,
    UnsupportedExperts,
    UnsupportedModelType,
    UnsupportedMoE,
    UnsupportedQuantization,
)

DENSE_TYPES = ("qwen3_5", "qwen3_5_text")
MOE_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
LAYER_KINDS = {"linear_attention": "linear", "full_attention": "full"}
# MLX affine widths and group sizes the products serve (ops/quant.py packs and unpacks them).
SUPPORTED_BITS = (2, 3, 4, 5, 6, 8)
SUPPORTED_GROUP_SIZES = (32, 64, 128)
# Routing limits: a router row and its top-k are held per row (docs/model.md, 'Mixture of experts').
MAX_EXPERTS = 1024
MAX_TOP_K = 16


@dataclass(frozen=True)
class QuantSpec:
    bits: int
    group_size: int


@dataclass(frozen=True)
class QuantConfig:
    """MLX affine quantization: a default and per-module overrides keyed by module path."""

    default: QuantSpec
    overrides: dict[str, QuantSpec | None] = field(default_factory=dict)

    def for_module(self, paths: list[str]) -> QuantSpec | None:
        """The spec for the first of `paths` that has an override, else the default."""
        for path in paths:
            if path in self.overrides:
                return self.overrides[path]
        return self.default


@dataclass(frozen=True)
class MoEConfig:
    """Every layer's MLP is a sparse mixture of experts with one gated shared expert."""

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    shared_intermediate_size: int


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # the dense MLP's; 0 in MoE models
    layer_kinds: tuple[str, ...]  # "linear" (Gated DeltaNet) or "full" (gated attention)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    rms_norm_eps: float
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    conv_kernel: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    max_position_embeddings: int
    quant: QuantConfig | None = None
    moe: MoEConfig | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == "full")

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == "linear")

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        from .checkpoint_info import CheckpointInfo

        info = CheckpointInfo.open(path)
        return cls.from_dict(info.config, generation_config=info.generation)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], generation_config: dict | None = None) -> "ModelConfig":
        family = _check_model_type(raw.get("model_type"), "model_type")
        text = raw.get("text_config", raw)
        prefix = "text_config." if "text_config" in raw else ""
        if text is not raw and "model_type" in text:
            if _check_model_type(text["model_type"], prefix + "model_type") != family:
                raise UnsupportedModelType(
                    f"config.json: {prefix}model_type={text['model_type']!r} does not match "
                    f"model_type={raw.get('model_type')!r}"
                )
        r = _Reader(text, prefix)
        moe = _moe_config(r) if family == "moe" else _no_experts(r)
        cfg = cls(
            vocab_size=r.int("vocab_size"),
            hidden_size=r.int("hidden_size"),
            intermediate_size=r.int("intermediate_size") if moe is None else 0,
            layer_kinds=_layer_kinds(r),
            num_heads=r.int("num_attention_heads"),
            num_kv_heads=r.int("num_key_value_heads"),
            head_dim=r.int("head_dim"),
            rotary_dim=_rotary_dim(r),
            rope_theta=float(_rope(r).get("rope_theta", r.get("rope_theta", 1e7))),
            rms_norm_eps=float(r.get("rms_norm_eps", 1e-6)),
            linear_num_key_heads=r.int("linear_num_key_heads"),
            linear_num_value_heads=r.int("linear_num_value_heads"),
            linear_key_head_dim=r.int("linear_key_head_dim"),
            linear_value_head_dim=r.int("linear_value_head_dim"),
            conv_kernel=r.int("linear_conv_kernel_dim", 4),
            tie_word_embeddings=bool(
                text.get("tie_word_embeddings", raw.get("tie_word_embeddings", False))
            ),
            eos_token_ids=_eos_ids(raw, text, generation_config or {}),
            max_position_embeddings=r.int("max_position_embeddings", 262144),
            quant=_quant_config(raw),
            moe=moe,
        )
        cfg._check_shapes(prefix)
        return cfg

    def _check_shapes(self, prefix: str) -> None:
        def need(cond: bool, name: str, why: str) -> None:
            if not cond:
                raise InconsistentShape(f"config.json: {prefix}{name}: {why}")

        need(
            self.num_kv_heads <= self.num_heads and self.num_heads % self.num_kv_heads == 0,
            "num_key_value_heads",
            f"{self.num_kv_heads} does not divide num_attention_heads={self.num_heads}",
        )
        need(
            self.linear_num_value_heads % self.linear_num_key_heads == 0,
            "linear_num_value_heads",
            f"{self.linear_num_value_heads} is not a multiple of linear_num_key_heads={self.linear_num_key_heads}",
        )
        need(
            self.rotary_dim % 2 == 0 and 0 < self.rotary_dim <= self.head_dim,
            "partial_rotary_factor",
            f"rotary width {self.rotary_dim} must be even and within head_dim={self.head_dim}",
        )
        need(self.conv_kernel >= 1, "linear_conv_kernel_dim", "must be at least 1")
        if self.quant is not None:
            for spec, where in [(self.quant.default, "quantization")] + [
                (s, f"quantization.{k}") for k, s in self.quant.overrides.items() if s is not None
            ]:
                for width_name, width in (("hidden_size", self.hidden_size),):
                    need(
                        width % spec.group_size == 0,
                        width_name,
                        f"{width} is not a multiple of {where}.group_size={spec.group_size}",
                    )


def _check_model_type(value: Any, name: str) -> str:
    """The model family, "dense" or "moe"."""
    if value in DENSE_TYPES:
        return "dense"
    if value in MOE_TYPES:
        return "moe"
    raise UnsupportedModelType(
        f"config.json: {name}={value!r}: TensorFold runs Qwen3.5 checkpoints "
        f"({', '.join(DENSE_TYPES + MOE_TYPES)})"
    )


def _no_experts(r: "_Reader") -> None:
    """A dense type must not describe experts: which one the file is would be a guess."""
    for key in ("num_experts", "moe_intermediate_size"):
        if r.get(key):
            raise UnsupportedMoE(
                f"config.json: {r.prefix}{key}={r.get(key)!r} in a dense config: "
                f"MoE checkpoints declare model_type {MOE_TYPES[0]!r}"
            )


def _moe_config(r: "_Reader") -> MoEConfig:
    moe = MoEConfig(
        num_experts=r.int("num_experts"),
        top_k=r.int("num_experts_per_tok"),
        expert_intermediate_size=r.int("moe_intermediate_size"),
        shared_intermediate_size=r.int("shared_expert_intermediate_size"),
    )
    where = f"config.json: {r.prefix}"
    if moe.top_k > moe.num_experts:
        raise InconsistentShape(
            f"{where}num_experts_per_tok={moe.top_k} exceeds num_experts={moe.num_experts}"
        )
    if moe.num_experts > MAX_EXPERTS:
        raise UnsupportedExperts(
            f"{where}num_experts={moe.num_experts}: at most {MAX_EXPERTS} are served"
        )
    if moe.top_k > MAX_TOP_K:
        raise UnsupportedExperts(
            f"{where}num_experts_per_tok={moe.top_k}: at most {MAX_TOP_K} are served"
        )
    if r.get("norm_topk_prob", True) is not True:
        raise UnsupportedExperts(
            f"{where}norm_topk_prob={r.get('norm_topk_prob')!r}: the routing "
            "weights are always renormalised over the top-k"
        )
    for key, plain in (("mlp_only_layers", []), ("decoder_sparse_step", 1)):
        if r.get(key, plain) not in (plain, None):
            raise UnsupportedExperts(
                f"{where}{key}={r.get(key)!r}: every layer must be a mixture-of-experts layer"
            )
    return moe


class _Reader:
    """Typed access to a config dict; errors name the field."""

    def __init__(self, d: dict, prefix: str) -> None:
        self.d, self.prefix = d, prefix

    def get(self, key: str, default: Any = None) -> Any:
        return self.d.get(key, default)

    def int(self, key: str, default: int | None = None) -> int:
        value = self.d.get(key, default)
        if value is None:
            raise ConfigError(f"config.json: {self.prefix}{key} is missing")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InconsistentShape(
                f"config.json: {self.prefix}{key}={value!r} must be a positive integer"
            )
        return value


def _layer_kinds(r: _Reader) -> tuple[str, ...]:
    n = r.int("num_hidden_layers")
    types = r.get("layer_types")
    if types is None:
        interval = r.int("full_attention_interval", 4)
        return tuple("full" if (i + 1) % interval == 0 else "linear" for i in range(n))
    if len(types) != n:
        raise InconsistentShape(
            f"config.json: {r.prefix}layer_types has {len(types)} entries, num_hidden_layers={n}"
        )
    for i, t in enumerate(types):
        if t not in LAYER_KINDS:
            raise UnknownLayerType(
                f"config.json: {r.prefix}layer_types[{i}]={t!r}: expected one of {sorted(LAYER_KINDS)}"
            )
    return tuple(LAYER_KINDS[t] for t in types)


def _rope(r: _Reader) -> dict:
    rope = r.get("rope_parameters") or r.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "mrope"):
        raise ConfigError(
            f"config.json: {r.prefix}rope_parameters.rope_type={kind!r} is not supported"
        )
    return rope


def _rotary_dim(r: _Reader) -> int:
    factor = _rope(r).get("partial_rotary_factor", r.get("partial_rotary_factor", 0.25))
    return int(r.int("head_dim") * float(factor))


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else [int(v) for v in value]


def _eos_ids(raw: dict, text: dict, gen: dict) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (gen.get("eos_token_id"), raw.get("eos_token_id"), text.get("eos_token_id")):
        ids += [i for i in _as_ids(source) if i not in ids]
    return tuple(ids)


def _quant_spec(d: Any, where: str, defaults: QuantSpec) -> QuantSpec | None:
    if d is False:
        return None
    if not isinstance(d, dict):
        raise UnsupportedQuantization(f"config.json: {where} must be an object, got {d!r}")
    mode = d.get("mode", "affine")
    if mode != "affine":
        raise UnsupportedQuantization(
            f"config.json: {where}.mode={mode!r}: only MLX affine quantization is supported"
        )
    bits, gs = d.get("bits", defaults.bits), d.get("group_size", defaults.group_size)
    if bits not in SUPPORTED_BITS:
        raise UnsupportedQuantization(
            f"config.json: {where}.bits={bits!r}: supported bit widths are {SUPPORTED_BITS}"
        )
    if gs not in SUPPORTED_GROUP_SIZES:
        raise UnsupportedQuantization(
            f"config.json: {where}.group_size={gs!r}: supported group sizes are {SUPPORTED_GROUP_SIZES}"
        )
    return QuantSpec(bits=bits, group_size=gs)


def _quant_config(raw: dict) -> QuantConfig | None:
    key = "quantization" if "quantization" in raw else "quantization_config"
    q = raw.get(key)
    if q is None:
        return None
    if "quant_method" in q:
        raise UnsupportedQuantization(
            f"config.json: {key}.quant_method={q['quant_method']!r}: only MLX affine quantization is supported"
        )
    mode_defaults = QuantSpec(bits=4, group_size=64)  # MLX's own defaults for a per-module entry
    default = _quant_spec(
        {k: v for k, v in q.items() if not isinstance(v, (dict, bool))}, key, mode_defaults
    )
    overrides = {
        k: _quant_spec(v, f"{key}.{k}", mode_defaults)
        for k, v in q.items()
        if isinstance(v, (dict, bool))
    }
    return QuantConfig(default=default, overrides=overrides)
