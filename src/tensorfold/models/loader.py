"""Builds a Qwen35Model from a checkpoint folder: config first, every header next, data last."""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

from ..config import ModelConfig
from ..layers.attention import GatedAttention
from ..layers.gdn import GatedDeltaNet, GDNShape
from ..layers.linear import Embedding, Linear, QuantizedWeight
from ..layers.mlp import MLP
from ..layers.moe import SparseMoE
from ..layers.norm import GatedRMSNorm, RMSNorm
from ..ops.moe import Experts, ExpertStack
from .checkpoint import Checkpoint
from .qwen3_5 import DecoderLayer, Qwen35Model
from .weights import WeightMap

PROGRESS_BYTES = 1 << 30  # show a progress bar from 1 GiB of weights


def validate(cfg: ModelConfig, wm: WeightMap) -> None:
    """Every tensor the model needs: present, with the right dtype and shape. Reads no data."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    wm.check_matrix("embed_tokens", cfg.vocab_size, h)
    wm.check_vector("norm.weight", h)
    if not cfg.tie_word_embeddings:
        wm.check_matrix("lm_head", cfg.vocab_size, h)
    for n, kind in enumerate(cfg.layer_kinds):
        p = f"layers.{n}."
        wm.check_vector(p + "input_layernorm.weight", h)
        wm.check_vector(p + "post_attention_layernorm.weight", h)
        if cfg.moe is not None:
            _check_moe(cfg, wm, p + "mlp.")
        else:
            for name, rows, cols in (("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)):
                wm.check_matrix(p + "mlp." + name, rows, cols)
        if kind == "full":
            _check_attention(cfg, wm, p + "self_attn.")
        else:
            _check_gdn(cfg, wm, p + "linear_attn.")


def _check_moe(cfg: ModelConfig, wm: WeightMap, p: str) -> None:
    h, moe = cfg.hidden_size, cfg.moe
    s = moe.shared_intermediate_size
    wm.check_matrix(p + "gate", moe.num_experts, h)
    wm.check_experts(p, moe.num_experts, moe.expert_intermediate_size, h)
    for name, rows, cols in (("gate_proj", s, h), ("up_proj", s, h), ("down_proj", h, s)):
        wm.check_matrix(p + "shared_expert." + name, rows, cols)
    wm.check_matrix(p + "shared_expert_gate", 1, h)


def _check_attention(cfg: ModelConfig, wm: WeightMap, p: str) -> None:
    h, d = cfg.hidden_size, cfg.head_dim
    wm.check_matrix(p + "q_proj", 2 * cfg.num_heads * d, h)
    wm.check_matrix(p + "k_proj", cfg.num_kv_heads * d, h)
    wm.check_matrix(p + "v_proj", cfg.num_kv_heads * d, h)
    wm.check_matrix(p + "o_proj", h, cfg.num_heads * d)
    wm.check_vector(p + "q_norm.weight", d)
    wm.check_vector(p + "k_norm.weight", d)


def _check_gdn(cfg: ModelConfig, wm: WeightMap, p: str) -> None:
    h, hv = cfg.hidden_size, cfg.linear_num_value_heads
    wm.check_matrix(p + "in_proj_qkv", cfg.conv_dim, h)
    wm.check_matrix(p + "in_proj_z", cfg.value_dim, h)
    wm.check_matrix(p + "in_proj_b", hv, h)
    wm.check_matrix(p + "in_proj_a", hv, h)
    wm.check_matrix(p + "out_proj", h, cfg.value_dim)
    wm.check_conv(p + "conv1d.weight")
    wm.check_vector(p + "A_log", hv, dtypes=("F32", "BF16"))
    wm.check_vector(p + "dt_bias", hv)
    wm.check_vector(p + "norm.weight", cfg.linear_value_head_dim)


class _Builder:
    def __init__(
        self, cfg: ModelConfig, wm: WeightMap, dtype: torch.dtype, device: torch.device, bar
    ) -> None:
        self.cfg, self.wm, self.dtype, self.device, self.bar = cfg, wm, dtype, device, bar
        self.book = None
        if device.type == "cuda":  # GPU launch shapes, timed once and shared by all layers
            from ..ops.triton.linear import TileBook

            self.book = TileBook()
        self.acc = torch.float64 if dtype == torch.float64 else torch.float32

    def tensor(self, local: str, dtype: torch.dtype | None) -> torch.Tensor:
        t = self.wm.read(local)
        self.bar.update(t.numel() * t.element_size())
        return t.to(self.device, dtype) if dtype is not None else t.to(self.device)

    def weight(self, stem: str):
        w = self.wm.read_matrix(stem)
        if isinstance(w, torch.Tensor):
            self.bar.update(w.numel() * w.element_size())
            return w.to(self.device, self.dtype)
        packed, scales, biases, spec = w
        q = QuantizedWeight(packed, scales, biases, spec.bits, spec.group_size)
        self.bar.update(q.nbytes)
        return q.to(self.device)

    def linear(self, stem: str) -> Linear:
        return Linear(self.weight(stem), self.dtype, self.book)

    def mlp(self, p: str) -> MLP:
        return MLP(
            self.linear(p + "gate_proj"), self.linear(p + "up_proj"), self.linear(p + "down_proj")
        )

    def stack(self, raw) -> ExpertStack:
        """A stacked expert projection as read, on the device (dense ones in the model dtype)."""
        if isinstance(raw, torch.Tensor):
            self.bar.update(raw.numel() * raw.element_size())
            return ExpertStack(raw.to(self.device, self.dtype))
        packed, scales, biases, spec = raw
        self.bar.update(sum(t.numel() * t.element_size() for t in (packed, scales, biases)))
        return ExpertStack(
            packed.to(self.device),
            scales.to(self.device),
            biases.to(self.device),
            spec.bits,
            spec.group_size,
        )

    def moe(self, p: str) -> SparseMoE:
        moe = self.cfg.moe
        raw = self.wm.read_experts(p, moe.expert_intermediate_size)
        experts = Experts(self.stack(raw["gate"]), self.stack(raw["up"]), self.stack(raw["down"]))
        return SparseMoE(
            self.linear(p + "gate"),
            experts,
            self.mlp(p + "shared_expert."),
            self.linear(p + "shared_expert_gate"),
            moe.top_k,
        )

    def norm(self, local: str) -> RMSNorm:
        return RMSNorm(
            self.tensor(local, self.acc), self.cfg.rms_norm_eps, self.wm.layout.norm_offset
        )

    def attention(self, p: str) -> GatedAttention:
        c = self.cfg
        return GatedAttention(
            self.linear(p + "q_proj"),
            self.linear(p + "k_proj"),
            self.linear(p + "v_proj"),
            self.linear(p + "o_proj"),
            self.norm(p + "q_norm.weight"),
            self.norm(p + "k_norm.weight"),
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
        )

    def gdn(self, p: str) -> GatedDeltaNet:
        c = self.cfg
        conv = self.tensor(p + "conv1d.weight", self.dtype).reshape(c.conv_dim, c.conv_kernel)
        norm_w = self.tensor(
            p + "norm.weight", torch.float64 if self.dtype == torch.float64 else None
        )
        shape = GDNShape(
            c.linear_num_key_heads,
            c.linear_num_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
        )
        return GatedDeltaNet(
            shape,
            self.linear(p + "in_proj_qkv"),
            self.linear(p + "in_proj_z"),
            self.linear(p + "in_proj_b"),
            self.linear(p + "in_proj_a"),
            conv,
            self.tensor(p + "A_log", None),
            self.tensor(p + "dt_bias", None),
            GatedRMSNorm(norm_w, c.rms_norm_eps),
            self.linear(p + "out_proj"),
        )

    def layer(self, n: int, kind: str, cache_index: int) -> DecoderLayer:
        p = f"layers.{n}."
        mixer = self.attention(p + "self_attn.") if kind == "full" else self.gdn(p + "linear_attn.")
        mlp = self.moe(p + "mlp.") if self.cfg.moe else self.mlp(p + "mlp.")
        return DecoderLayer(
            self.norm(p + "input_layernorm.weight"),
            mixer,
            self.norm(p + "post_attention_layernorm.weight"),
            mlp,
            cache_index,
        )


def load_model(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    progress: bool | None = None,
) -> Qwen35Model:
    cfg = ModelConfig.from_dir(path)  # refuses a bad config before any file is opened
    ckpt = Checkpoint(path)  # headers only
    wm = WeightMap(ckpt, cfg)
    validate(cfg, wm)
    device = torch.device(device)
    show = progress if progress is not None else ckpt.nbytes >= PROGRESS_BYTES
    with tqdm(
        total=ckpt.nbytes, unit="B", unit_scale=True, desc="loading", disable=not show
    ) as bar:
        b = _Builder(cfg, wm, dtype, device, bar)
        embed = Embedding(b.weight("embed_tokens"), dtype)
        head = embed.as_linear(b.book) if cfg.tie_word_embeddings else b.linear("lm_head")
        counters = {"full": 0, "linear": 0}
        layers = []
        for n, kind in enumerate(cfg.layer_kinds):
            layers.append(b.layer(n, kind, counters[kind]))
            counters[kind] += 1
        model = Qwen35Model(
            cfg, embed, layers, b.norm("norm.weight"), head, dtype, device, layout=wm.layout.name
        )
    model.path = Path(path)
    return model
