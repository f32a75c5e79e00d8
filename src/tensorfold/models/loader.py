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
from ..layers.split import RowSplit
from ..ops.collective import Group
from ..ops.moe import Experts, ExpertStack
from .checkpoint import Checkpoint
from .qwen3_5 import DecoderLayer, Qwen35Model
from .split import Ranges, Shard, plan_shard, plan_split, row_widths, take_rows
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
        self,
        cfg: ModelConfig,
        wm: WeightMap,
        dtype: torch.dtype,
        device: torch.device,
        bar,
        shard: Shard | None = None,
        group: Group | None = None,
    ) -> None:
        self.cfg, self.wm, self.dtype, self.device, self.bar = cfg, wm, dtype, device, bar
        self.shard, self.group = shard, group  # a tensor split: this rank's rows (models/split.py)
        self.plans: tuple[Shard, ...] | None = None  # every rank's, when a layer needs them
        self.book = None
        if device.type == "cuda":  # GPU launch shapes, timed once and shared by all layers
            from ..ops.triton.linear import TileBook

            self.book = TileBook()
        self.acc = torch.float64 if dtype == torch.float64 else torch.float32

    def input_widths(self, total: int) -> tuple[int, ...] | None:
        """Every rank's columns of an input cut by `row_ranges`; None when whole."""
        return row_widths(total, self.group.world) if self.group is not None else None

    def head_widths(self, heads, width: int) -> tuple[int, ...] | None:
        """Every rank's columns of an input made of its heads (`heads(shard)`, `width` each)."""
        if self.shard is None:
            return None
        if self.plans is None:  # every rank's shard, planned once for all layers
            self.plans = plan_split(self.cfg, self.shard.world, self.dtype)
        return tuple(heads(s).count * width for s in self.plans)

    def rows(self, ranges) -> Ranges | None:
        """`ranges(shard)` on a split rank; None (every row) otherwise."""
        return ranges(self.shard) if self.shard is not None else None

    def tensor(
        self, local: str, dtype: torch.dtype | None, rows: Ranges | None = None
    ) -> torch.Tensor:
        t = take_rows(self.wm.read(local), rows)
        self.bar.update(t.numel() * t.element_size())
        return t.to(self.device, dtype) if dtype is not None else t.to(self.device)

    def weight(self, stem: str, rows: Ranges | None = None):
        w = self.wm.read_matrix(stem)
        if isinstance(w, torch.Tensor):
            w = take_rows(w, rows)
            self.bar.update(w.numel() * w.element_size())
            return w.to(self.device, self.dtype)
        packed, scales, biases, spec = (*(take_rows(t, rows) for t in w[:3]), w[3])
        q = QuantizedWeight(packed, scales, biases, spec.bits, spec.group_size)
        self.bar.update(q.nbytes)
        return q.to(self.device)

    def linear(self, stem: str, rows: Ranges | None = None) -> Linear:
        whole = self.wm.read_matrix(stem)  # mapped, not read: the whole weight's row count
        n = (whole if isinstance(whole, torch.Tensor) else whole[0]).shape[0]
        return Linear(self.weight(stem, rows), self.dtype, self.book, n)

    def gathered(
        self,
        stem: str,
        rows: Ranges | None = None,
        gather_input: bool = True,
        total: int | None = None,
        inputs: tuple[int, ...] | None = None,
    ) -> Linear:
        """A projection whose output the split gathers (its input too, when the rank holds only
        its heads' or inner columns of it); a plain projection when the model is whole. `total`:
        the whole width of an output cut by `row_ranges`; `inputs`: every rank's input columns
        (None: equal pieces)."""
        if self.group is None:
            return self.linear(stem)
        widths = row_widths(total, self.group.world) if total else None
        w = self.weight(stem, rows)
        return RowSplit(w, self.dtype, self.group, gather_input, self.book, widths, inputs)

    def mlp(self, p: str, shared: bool = False) -> MLP:
        inter = self.rows(lambda s: (s.shared,) if shared else (s.inter,))
        return MLP(
            self.linear(p + "gate_proj", inter),
            self.linear(p + "up_proj", inter),
            self.gathered(
                p + "down_proj",
                self.rows(lambda s: (s.hidden,)),
                total=self.cfg.hidden_size,
                inputs=self.input_widths(
                    self.cfg.moe.shared_intermediate_size if shared else self.cfg.intermediate_size
                ),
            ),
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
        moe, first, stop = self.cfg.moe, *(self.shard.experts if self.shard else (0, None))
        raw = self.wm.read_experts(p, moe.expert_intermediate_size, first, stop)
        experts = Experts(self.stack(raw["gate"]), self.stack(raw["up"]), self.stack(raw["down"]))
        return SparseMoE(
            self.linear(p + "gate"),  # the router whole on every rank: every rank routes
            experts,
            self.mlp(p + "shared_expert.", shared=True),
            self.linear(p + "shared_expert_gate"),
            moe.top_k,
            self.group,
            first,
        )

    def norm(self, local: str) -> RMSNorm:
        return RMSNorm(
            self.tensor(local, self.acc), self.cfg.rms_norm_eps, self.wm.layout.norm_offset
        )

    def attention(self, p: str) -> GatedAttention:
        c, s = self.cfg, self.shard
        kv = self.rows(lambda s: s.kv_rows(c.head_dim))
        return GatedAttention(
            self.linear(p + "q_proj", self.rows(lambda s: s.q_rows(c.head_dim))),
            self.linear(p + "k_proj", kv),
            self.linear(p + "v_proj", kv),
            self.gathered(
                p + "o_proj",
                self.rows(lambda s: (s.hidden,)),
                total=c.hidden_size,
                inputs=self.head_widths(lambda s: s.q_heads, c.head_dim),
            ),
            self.norm(p + "q_norm.weight"),
            self.norm(p + "k_norm.weight"),
            s.q_heads.count if s else c.num_heads,
            s.kv_heads.count if s else c.num_kv_heads,
            c.head_dim,
        )

    def gdn(self, p: str) -> GatedDeltaNet:
        c, s = self.cfg, self.shard
        channels = self.rows(lambda s: s.conv_rows(c))
        gates = self.rows(lambda s: s.gate_rows())
        conv = self.tensor(p + "conv1d.weight", self.dtype)
        conv = take_rows(conv.reshape(c.conv_dim, c.conv_kernel), channels)
        norm_w = self.tensor(
            p + "norm.weight", torch.float64 if self.dtype == torch.float64 else None
        )
        shape = GDNShape(
            s.k_heads.count if s else c.linear_num_key_heads,
            s.v_heads.count if s else c.linear_num_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
        )
        return GatedDeltaNet(
            shape,
            self.linear(p + "in_proj_qkv", channels),
            self.linear(p + "in_proj_z", self.rows(lambda s: s.z_rows(c))),
            self.linear(p + "in_proj_b", gates),
            self.linear(p + "in_proj_a", gates),
            conv,
            self.tensor(p + "A_log", None, gates),
            self.tensor(p + "dt_bias", None, gates),
            GatedRMSNorm(norm_w, c.rms_norm_eps),
            self.gathered(
                p + "out_proj",
                self.rows(lambda s: (s.hidden,)),
                total=c.hidden_size,
                inputs=self.head_widths(lambda s: s.v_heads, c.linear_value_head_dim),
            ),
        )

    def head(self, embed: Embedding) -> Linear:
        """The output head (the embedding table when tied); split by vocabulary on a split rank,
        each rank's logits gathered in rank order into whole rows."""
        vocab = self.rows(lambda s: (s.vocab,))
        if not self.cfg.tie_word_embeddings:
            return self.gathered("lm_head", vocab, False, total=self.cfg.vocab_size)
        if self.group is None:
            return embed.as_linear(self.book)
        w = embed.weight
        part = (
            take_rows(w, vocab)
            if isinstance(w, torch.Tensor)
            else QuantizedWeight(
                *(take_rows(t, vocab) for t in (w.packed, w.scales, w.biases)),
                w.bits,
                w.group_size,
            )
        )
        widths = row_widths(self.cfg.vocab_size, self.group.world)
        return RowSplit(part, self.dtype, self.group, False, self.book, widths)

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
    group: Group | None = None,
    checkpoint: Checkpoint | None = None,
) -> Qwen35Model:
    """The model, or with `group` (a tensor split) this rank's part of it: only its rows of
    each weight are read from the mapped files (the embedding table whole). `checkpoint`: the
    tensors from elsewhere than path's files (tools/random_checkpoint.py, benchmarks only).
    A whole MoE model runs each layer's shared expert in its grouped launches where the file's
    formats allow (the same bits, fewer launches: docs/exactness.md, 'Experts')."""
    cfg = ModelConfig.from_dir(path)  # refuses a bad config before any file is opened
    device = torch.device(device)
    shard = plan_shard(cfg, group.rank, group.world, dtype) if group is not None else None
    ckpt = checkpoint if checkpoint is not None else Checkpoint(path)  # headers only
    wm = WeightMap(ckpt, cfg)
    validate(cfg, wm)
    show = progress if progress is not None else ckpt.nbytes >= PROGRESS_BYTES
    with tqdm(
        total=ckpt.nbytes, unit="B", unit_scale=True, desc="loading", disable=not show
    ) as bar:
        b = _Builder(cfg, wm, dtype, device, bar, shard, group)
        embed = Embedding(b.weight("embed_tokens"), dtype)
        head = b.head(embed)
        counters = {"full": 0, "linear": 0}
        layers = []
        for n, kind in enumerate(cfg.layer_kinds):
            layers.append(b.layer(n, kind, counters[kind]))
            counters[kind] += 1
        model = Qwen35Model(
            cfg, embed, layers, b.norm("norm.weight"), head, dtype, device, layout=wm.layout.name
        )
        model.shard, model.group = shard, group
    if group is None:
        model.join_shared_experts()
    model.path = Path(path)
    return model
