"""Qwen3.5's multi-token-prediction head (`mtp.*`), a drafter that ships inside the checkpoint
(docs/model.md, 'MTP head').

    x = fc(cat[pre_fc_norm_embedding(embed(t[i+1])), pre_fc_norm_hidden(h[i])])   # [H, 2H]
    x = one gated full-attention decoder layer (its own KV cache)
    logits = lm_head(norm(x))        # predicts t[i+2]; the target's embedding and head

h[i] is the target's hidden state after its final norm at position i. Later draft steps feed
the head's own output (after its norm) back in place of h.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..batch import ForwardBatch
from ..errors import CheckpointError, DraftForAnotherTarget, NotStockDrafter
from ..layers.attention import GatedAttention
from ..layers.linear import Linear
from ..layers.mlp import MLP
from ..layers.norm import RMSNorm
from ..ops.rope import apply_rope, rope_tables
from .qwen3_5 import Qwen35Model
from .weights import WeightMap

PREFIX = "mtp."


def mtp_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """The dense head's tensors as the released files name them, with their shapes."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    a = "layers.0.self_attn."
    m = "layers.0.mlp."
    return {
        "fc.weight": (h, 2 * h),
        "pre_fc_norm_embedding.weight": (h,),
        "pre_fc_norm_hidden.weight": (h,),
        "norm.weight": (h,),
        "layers.0.input_layernorm.weight": (h,),
        "layers.0.post_attention_layernorm.weight": (h,),
        a + "q_proj.weight": (2 * cfg.num_heads * d, h),
        a + "k_proj.weight": (cfg.num_kv_heads * d, h),
        a + "v_proj.weight": (cfg.num_kv_heads * d, h),
        a + "o_proj.weight": (h, cfg.num_heads * d),
        a + "q_norm.weight": (d,),
        a + "k_norm.weight": (d,),
        m + "gate_proj.weight": (i, h),
        m + "up_proj.weight": (i, h),
        m + "down_proj.weight": (h, i),
    }


def check_mtp(wm: WeightMap, cfg) -> WeightMap:
    """Binds the head to the target by its tensors' names and shapes, reading no data; returns
    the weight map that reads it."""
    ckpt = wm.ckpt
    if PREFIX + "fc.weight" not in ckpt:
        raise NotStockDrafter(
            f"{ckpt.folder}: no MTP head (mtp.fc.weight is missing; MLX conversions drop mtp.*)"
        )
    if cfg.moe is not None or any(
        n.startswith(PREFIX + "layers.0.mlp.experts") for n in ckpt.infos
    ):
        raise NotStockDrafter("an MTP head with experts (MoE) is not served yet")
    if any(n.startswith(PREFIX + "layers.1.") for n in ckpt.infos):
        raise NotStockDrafter("an MTP head of more than one layer is not served")
    if any(n.startswith(PREFIX) and n.endswith(".scales") for n in ckpt.infos):
        raise NotStockDrafter("a quantized MTP head is not served yet")
    for local, shape in mtp_shapes(cfg).items():
        key = PREFIX + local
        if key not in ckpt:
            raise NotStockDrafter(f"{ckpt.folder}: the MTP head has no {key}")
        got = ckpt.info(key).shape
        if tuple(got) != shape:
            raise DraftForAnotherTarget(
                f"{key}: shape {list(got)}, but this target needs {list(shape)} "
                f"(hidden {cfg.hidden_size}, heads {cfg.num_heads}/{cfg.num_kv_heads})"
            )
    mtp = WeightMap(ckpt, cfg, dataclasses.replace(wm.layout, prefix=PREFIX))
    try:
        for stem in ("fc", "layers.0.self_attn.q_proj", "layers.0.self_attn.k_proj"):
            mtp.check_matrix(stem, *mtp_shapes(cfg)[stem + ".weight"])
        for stem in ("layers.0.self_attn.v_proj", "layers.0.self_attn.o_proj"):
            mtp.check_matrix(stem, *mtp_shapes(cfg)[stem + ".weight"])
        for stem in ("gate_proj", "up_proj", "down_proj"):
            mtp.check_matrix(
                "layers.0.mlp." + stem, *mtp_shapes(cfg)[f"layers.0.mlp.{stem}.weight"]
            )
    except CheckpointError as exc:
        raise NotStockDrafter(str(exc)) from None
    return mtp


def check_mtp_head(path) -> None:
    """check_mtp for the checkpoint folder `path`, from its config and headers alone."""
    from ..config import ModelConfig
    from .checkpoint import Checkpoint

    cfg = ModelConfig.from_dir(path)
    check_mtp(WeightMap(Checkpoint(path), cfg), cfg)


@dataclass
class MTPHead:
    fc: Linear
    norm_embedding: RMSNorm
    norm_hidden: RMSNorm
    input_norm: RMSNorm
    attention: GatedAttention
    post_norm: RMSNorm
    mlp: MLP
    norm: RMSNorm
    # the target's output table in the head's dtype (None: the target's own)
    lm_head: Linear | None = None
    scales: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    def forward(
        self,
        target: Qwen35Model,
        token_ids: torch.Tensor,
        hidden: torch.Tensor,
        start: int,
        kv_rows: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One lane's rows at positions start.. (KV rows `kv_rows` for positions 0..start+n-1):
        (the last row's logits, the head's output of every row).

        Plain torch ops over the rows as they are, none of the target's fixed row tiles: a
        draft is only a guess (the target decides every token), so its bits need not be
        invariant, and on the CPU one row then costs one small product per weight, not a
        16-row tile per 256 output columns."""
        dt = self.fc.weight.dtype
        e = target.embed(token_ids).to(dt)
        x = torch.cat(
            [self._norm(self.norm_embedding, e), self._norm(self.norm_hidden, hidden.to(dt))], -1
        )
        h = _product(x, self.fc)
        h = h + self._attend(target.config, self._norm(self.input_norm, h), start, kv_rows, kv)
        x = self._norm(self.post_norm, h)
        m = self.mlp
        x = _product(F.silu(_product(x, m.gate_proj)) * _product(x, m.up_proj), m.down_proj)
        x = self._norm(self.norm, h + x)
        head = self.lm_head or target.lm_head
        last = x[-1:]
        logits = _product(last, head) if isinstance(head.weight, torch.Tensor) else head(last)
        return logits[0], x

    def forward_pass(
        self, target: Qwen35Model, token_ids, hidden, batch: ForwardBatch, kv, last=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` through the layers' own kernels over a pass of one lane's rows (`batch`):
        on the GPU it makes no host sync, so a CUDA graph can record it (runner/mtp_graph.py).
        `last` (rows of the pass): the logits of those rows [len(last), V] instead of the last
        row's, for a pass over many lanes (drafters/mtp_lanes.py)."""
        cfg = target.config
        e = target.embed(token_ids).to(self.fc.weight.dtype)
        h = self.fc(torch.cat([self.norm_embedding(e), self.norm_hidden(hidden)], -1))
        rope = rope_tables(batch.positions, cfg.rotary_dim, cfg.rope_theta, h.dtype)
        h, x = self.post_norm(self.attention(self.input_norm(h), batch, rope, *kv), residual=h)
        h, x = self.norm(self.mlp(x), residual=h)
        head = self.lm_head or target.lm_head
        if last is not None:
            return head(x[last]), x
        return head(x[-1:])[0], x

    def _attend(self, cfg, x, start: int, kv_rows, kv) -> torch.Tensor:
        """Gated causal attention of the rows over the lane's head KV rows (written first)."""
        a, n, d = self.attention, x.shape[0], cfg.head_dim
        qg = _product(x, a.q_proj).view(n, a.num_heads, 2 * d)
        k = _product(x, a.k_proj).view(n, a.num_kv_heads, d)
        v = _product(x, a.v_proj).view(n, a.num_kv_heads, d)
        positions = torch.arange(start, start + n, device=x.device)
        rope = rope_tables(positions, cfg.rotary_dim, cfg.rope_theta, x.dtype)
        q = apply_rope(self._norm(a.q_norm, qg[..., :d]), *rope)
        k_cache, v_cache = kv
        k_cache[kv_rows[start:]] = apply_rope(self._norm(a.k_norm, k), *rope).to(k_cache.dtype)
        v_cache[kv_rows[start:]] = v.to(v_cache.dtype)
        keys = k_cache[kv_rows].float().transpose(0, 1)  # [kv heads, L, D]
        values = v_cache[kv_rows].float().transpose(0, 1)
        seen = torch.arange(len(kv_rows), device=x.device)[None, :] <= positions[:, None]
        out = F.scaled_dot_product_attention(
            q.float().transpose(0, 1), keys, values, attn_mask=seen, scale=a.scale, enable_gqa=True
        )  # [heads, n, D]
        out = out.transpose(0, 1).to(x.dtype) * torch.sigmoid(qg[..., d:])
        return _product(out.reshape(n, a.num_heads * d), a.o_proj)

    def _norm(self, norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
        """One fused op over the last dim, the offset added to the weight once (a draft step
        runs seven norms)."""
        scale = self.scales.get(id(norm))
        if scale is None:
            scale = self.scales[id(norm)] = (norm.offset + norm.weight.float()).to(x.dtype)
        return F.rms_norm(x, scale.shape, scale, norm.eps)


def _product(x: torch.Tensor, linear: Linear) -> torch.Tensor:
    return F.linear(x, linear.weight)


def load_mtp(target: Qwen35Model, path, dtype: torch.dtype | None = None) -> MTPHead:
    """The checkpoint's MTP head for `target`, checked by name and shape before any read; in
    `dtype` (default the target's), with a copy of a dense output table when that differs."""
    from .checkpoint import Checkpoint
    from .loader import _Builder

    cfg = target.config
    wm = WeightMap(Checkpoint(path), cfg)
    mtp = check_mtp(wm, cfg)

    class _Quiet:
        def update(self, n: int) -> None:
            pass

    dtype = dtype or target.dtype
    b = _Builder(cfg, mtp, dtype, target.device, _Quiet())
    table = target.lm_head.weight
    copy = dtype != target.dtype and isinstance(table, torch.Tensor)
    a = "layers.0."
    return MTPHead(
        b.linear("fc"),
        b.norm("pre_fc_norm_embedding.weight"),
        b.norm("pre_fc_norm_hidden.weight"),
        b.norm(a + "input_layernorm.weight"),
        b.attention(a + "self_attn."),
        b.norm(a + "post_attention_layernorm.weight"),
        b.mlp(a + "mlp."),
        b.norm("norm.weight"),
        Linear(table.to(dtype), dtype) if copy else None,
    )
