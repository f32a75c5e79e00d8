"""Checkpoint layouts -> the model's weights (docs/model.md, 'Weight names' and
'MLX affine packing').

Layouts: Hugging Face (`model.language_model.*` or `model.*`, conv1d [C,1,K], zero-centred
norms) and MLX (`language_model.model.*`, conv1d [C,K,1], norms stored shifted, affine-packed
linears with `.scales`/`.biases`). MoE experts come fused, one per expert (HF) or stacked (MLX
`switch_mlp`; docs/model.md, 'Mixture of experts'). Every expected tensor's dtype and shape is
checked from the file headers before any data is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..config import ModelConfig, QuantSpec
from ..errors import BadTensor, CheckpointError, MissingTensor
from .checkpoint import Checkpoint

FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")
PREFIXES = (  # (body prefix, head key stem, layout name)
    ("model.language_model.", "lm_head", "hf"),
    ("language_model.model.", "language_model.lm_head", "mlx"),
    ("model.", "lm_head", "hf"),
)
SKIPPED = ("model.visual.", "vision_tower.", "visual.", "mtp.", "model.mtp.")


@dataclass(frozen=True)
class Layout:
    prefix: str
    head_stem: str
    name: str
    norm_offset: float  # 1.0 when norms are zero-centred in the file (HF), else 0.0
    conv_hf: bool  # conv1d stored [C, 1, K]


class WeightMap:
    """Finds, validates and reads the tensors of one checkpoint for one config."""

    def __init__(self, ckpt: Checkpoint, cfg: ModelConfig, layout: Layout | None = None) -> None:
        self.ckpt, self.cfg = ckpt, cfg
        self.layout = layout or self._detect_layout()  # given: a part under its own prefix
        self.quant: dict[str, QuantSpec | None] = {}
        self.experts: dict[str, str] = {}  # `layers.N.mlp.` -> its experts' layout

    def _detect_layout(self) -> Layout:
        names = [n for n in self.ckpt.infos if not n.startswith(SKIPPED)]
        for prefix, head, name in PREFIXES:
            if any(
                n.startswith(prefix + "layers.") or n.startswith(prefix + "embed_tokens")
                for n in names
            ):
                conv_hf = self._conv_is_hf(prefix)
                # The conv layout marks whether norms were already shifted (as mlx_lm decides).
                return Layout(prefix, head, name, 1.0 if conv_hf else 0.0, conv_hf)
        raise CheckpointError(
            f"{self.ckpt.folder}: no Qwen3.5 decoder tensors found (expected model.layers.*, "
            "model.language_model.layers.* or language_model.model.layers.*)"
        )

    def _conv_is_hf(self, prefix: str) -> bool:
        i = self.cfg.linear_layers[0] if self.cfg.linear_layers else None
        if i is None:
            return prefix != "language_model.model."
        key = f"{prefix}layers.{i}.linear_attn.conv1d.weight"
        shape = self.ckpt.info(key).shape
        k = self.cfg.conv_kernel
        if shape == (self.cfg.conv_dim, 1, k):
            return True
        if shape == (self.cfg.conv_dim, k, 1):
            return False
        raise BadTensor(
            f"{key}: shape {list(shape)}, expected [{self.cfg.conv_dim}, 1, {k}] (Hugging Face) "
            f"or [{self.cfg.conv_dim}, {k}, 1] (MLX)"
        )

    def key(self, local: str) -> str:
        return (
            self.layout.head_stem + ".weight"
            if local == "lm_head.weight"
            else self.layout.prefix + local
        )

    # -- validation (headers only) -------------------------------------------------------
    def check_vector(self, local: str, length: int, dtypes=FLOAT_DTYPES) -> None:
        self._check(self.key(local), (length,), dtypes)

    def check_conv(self, local: str) -> None:
        c, k = self.cfg.conv_dim, self.cfg.conv_kernel
        self._check(self.key(local), (c, 1, k) if self.layout.conv_hf else (c, k, 1), FLOAT_DTYPES)

    def check_matrix(self, stem: str, n: int, k: int) -> None:
        """A linear or embedding weight [n, k]: dense, or packed with scales and biases."""
        key = self.key(stem + ".weight") if stem != "lm_head" else self.layout.head_stem + ".weight"
        base = key[: -len(".weight")]
        if base + ".scales" not in self.ckpt:
            self._check(key, (n, k), FLOAT_DTYPES)
            self.quant[stem] = None
            return
        spec = self._quant_spec(stem, base)
        if k % spec.group_size:
            raise BadTensor(
                f"{base}: in_features {k} is not a multiple of group_size {spec.group_size}"
            )
        self._check(key, (n, k * spec.bits // 32), ("U32", "I32"))
        self._check(base + ".scales", (n, k // spec.group_size), FLOAT_DTYPES)
        self._check(base + ".biases", (n, k // spec.group_size), FLOAT_DTYPES)
        self.quant[stem] = spec

    def _quant_spec(self, stem: str, base: str) -> QuantSpec:
        if self.cfg.quant is None:
            raise BadTensor(
                f"{base}.scales: the file holds quantized weights but config.json has no quantization"
            )
        local = stem if stem != "lm_head" else None
        paths = [base] + (
            [f"{p}{local}" for p, _, _ in PREFIXES]
            if local
            else ["language_model.lm_head", "lm_head"]
        )
        spec = self.cfg.quant.for_module(paths)
        if spec is None:
            raise BadTensor(
                f"{base}: config.json marks it unquantized but the file has {base}.scales"
            )
        return spec

    def _check(self, key: str, shape: tuple[int, ...], dtypes: tuple[str, ...]) -> None:
        if key not in self.ckpt:
            raise MissingTensor(f"{self.ckpt.folder}: tensor {key} is missing")
        info = self.ckpt.info(key)
        if info.shape != tuple(shape) or info.dtype not in dtypes:
            raise BadTensor(
                f"{key}: {info.dtype} {list(info.shape)}, expected {'/'.join(dtypes)} {list(shape)}"
            )

    # -- experts (headers only) --------------------------------------------------------
    def check_experts(self, p: str, e: int, inter: int, h: int) -> None:
        """The routed experts under `p` (`layers.N.mlp.`) in one of three layouts (docs/model.md,
        'Mixture of experts'): HF fused, HF per expert, MLX stacked."""
        layout = self._experts_layout(p)
        self.experts[p] = layout
        if layout == "fused":
            self._check(self.key(p + "experts.gate_up_proj"), (e, 2 * inter, h), FLOAT_DTYPES)
            self._check(self.key(p + "experts.down_proj"), (e, h, inter), FLOAT_DTYPES)
            return
        for name, rows, cols in (
            ("gate_proj", inter, h),
            ("up_proj", inter, h),
            ("down_proj", h, inter),
        ):
            if layout == "stacked":
                self._check_stack(p + "switch_mlp." + name, e, rows, cols)
                continue
            stems = [f"{p}experts.{i}.{name}" for i in range(e)]
            for stem in stems:
                self.check_matrix(stem, rows, cols)
            if len({self.quant[stem] for stem in stems}) > 1:
                raise BadTensor(f"{self.key(stems[0])}: the experts' {name} differ in quantization")

    def _experts_layout(self, p: str) -> str:
        for layout, local in (
            ("fused", "experts.gate_up_proj"),
            ("per_expert", "experts.0.gate_proj.weight"),
            ("stacked", "switch_mlp.gate_proj.weight"),
        ):
            if self.key(p + local) in self.ckpt:
                return layout
        raise MissingTensor(
            f"{self.ckpt.folder}: no experts under {self.key(p)[:-1]}: expected "
            "experts.gate_up_proj (fused), experts.0.gate_proj.weight (per expert) "
            "or switch_mlp.gate_proj.weight (MLX)"
        )

    def _check_stack(self, stem: str, e: int, n: int, k: int) -> None:
        """A stacked projection [e, n, k]: dense, or packed with scales and biases."""
        base = self.key(stem)
        if base + ".scales" not in self.ckpt:
            self._check(base + ".weight", (e, n, k), FLOAT_DTYPES)
            self.quant[stem] = None
            return
        spec = self._quant_spec(stem, base)
        if k % spec.group_size:
            raise BadTensor(
                f"{base}: in_features {k} is not a multiple of group_size {spec.group_size}"
            )
        self._check(base + ".weight", (e, n, k * spec.bits // 32), ("U32", "I32"))
        self._check(base + ".scales", (e, n, k // spec.group_size), FLOAT_DTYPES)
        self._check(base + ".biases", (e, n, k // spec.group_size), FLOAT_DTYPES)
        self.quant[stem] = spec

    def read_experts(self, p: str, inter: int, first: int = 0, stop: int | None = None):
        """{"gate", "up", "down"}: experts [first, stop) each stacked, a dense [E, N, K] tensor or
        (packed, scales, biases, spec) with the expert axis first (views of the mapped files
        where the file stacks them, so a rank of a split reads only its experts)."""
        layout, stop = self.experts[p], stop or self.cfg.moe.num_experts
        if layout == "fused":
            gate_up = self.read(p + "experts.gate_up_proj")[first:stop]  # [E, 2I, H], gate first
            return {
                "gate": gate_up[:, :inter],
                "up": gate_up[:, inter:],
                "down": self.read(p + "experts.down_proj")[first:stop],
            }
        if layout == "stacked":
            return {
                name: _experts(self.read_matrix(f"{p}switch_mlp.{name}_proj"), first, stop)
                for name in ("gate", "up", "down")
            }
        return {
            name: _stack(
                [self.read_matrix(f"{p}experts.{i}.{name}_proj") for i in range(first, stop)]
            )
            for name in ("gate", "up", "down")
        }

    # -- reading -------------------------------------------------------------------------
    def read(self, local: str) -> torch.Tensor:
        return self.ckpt.read(self.key(local))

    def read_matrix(self, stem: str):
        """Dense tensor, or (packed, scales, biases, spec) for a quantized one."""
        key = self.key(stem + ".weight") if stem != "lm_head" else self.layout.head_stem + ".weight"
        spec = self.quant.get(stem)
        if spec is None:
            return self.ckpt.read(key)
        base = key[: -len(".weight")]
        return (
            self.ckpt.read(key),
            self.ckpt.read(base + ".scales"),
            self.ckpt.read(base + ".biases"),
            spec,
        )


def _experts(stack: Any, first: int, stop: int) -> Any:
    """Experts [first, stop) of a stacked projection, dense or (packed, scales, biases, spec)."""
    if isinstance(stack, torch.Tensor):
        return stack[first:stop]
    return (*(t[first:stop] for t in stack[:3]), stack[3])


def _stack(parts: list) -> Any:
    """Per-expert matrices stacked over a new first axis (packed ones part by part)."""
    if isinstance(parts[0], torch.Tensor):
        return torch.stack(parts)
    return (*(torch.stack([q[i] for q in parts]) for i in range(3)), parts[0][3])
