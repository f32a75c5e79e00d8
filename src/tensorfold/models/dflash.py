"""DFlash block drafters as z-lab publishes them, v1 and DFlash2 (docs/model.md, 'DFlash drafters').

A small stack of Qwen3-style layers with no embedding or head of its own. The target's residual
streams after the tapped layers are concatenated and fused, c = hidden_norm(fc(taps)); every
layer projects c with its own k_proj/v_proj (+ k_norm, rotary at the context's positions) into
context K/V kept per position. A round embeds [anchor, mask x (B-1)] with the target's table,
runs the layers with the block's queries over [context ; block] (non-causal within the block
unless a layer is sliding or `is_causal` says so), then the final norm and the target's head give
the drafts for the B-1 positions after the anchor (DFlash2: convolutions inside each layer and a
candidate selector over the drafts, models/dflash2.py). Plain torch on either device: a drafter
only guesses, the verify pass decides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import DraftForAnotherTarget, NotStockDrafter
from ..layers.linear import Linear
from ..ops import dispatch as op
from ..ops.rope import apply_rope, rope_tables
from .checkpoint import Checkpoint
from .dflash2 import PAIRS, Conv, DFlash2Fields, Selector, dflash2_shapes, load_conv, load_selector
from .dflash2 import read_fields as read_dflash2_fields

V1, V2 = "DFlashDraftModel", "DFlash2DraftModel"


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    num_target_layers: int
    taps: tuple[int, ...]
    mask_token_id: int
    block_size: int
    rope_theta: float
    eps: float
    layer_types: tuple[str, ...]
    sliding_window: int | None
    is_causal: bool | None
    embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    softcap: float | None = None
    v2: DFlash2Fields | None = None  # DFlash2's convolutions and selector

    def causal(self, layer: int) -> bool:
        kind = self.layer_types[layer]
        return kind == "sliding_attention" if self.is_causal is None else self.is_causal

    def window(self, layer: int) -> int | None:
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None


def read_config(path: str | Path) -> DFlashConfig:
    """The drafter's config.json; a kind we do not serve is a NotStockDrafter by name."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise NotStockDrafter(f"{path}: no config.json (a drafter folder holds one)")
    raw = json.loads(file.read_text())
    arch = tuple(raw.get("architectures") or ())
    if V1 not in arch and V2 not in arch:
        raise NotStockDrafter(f"{path}: architectures {list(arch)} is not a DFlash drafter")
    v2 = read_dflash2_fields(raw, path) if V2 in arch else None
    d = raw.get("dflash_config") or {}
    marks = ("projector_type", "markov_rank") + (() if v2 else tuple(k for p in PAIRS for k in p))
    extra = [k for k in marks if k in d or k in raw]
    if extra or raw.get("attention_bias"):
        kind = V2 if v2 else "DFlash v1"
        raise NotStockDrafter(f"{path}: {extra or ['attention_bias']} is not a stock {kind} field")
    if "target_layer_ids" not in d or "mask_token_id" not in d:
        raise NotStockDrafter(f"{path}: dflash_config needs target_layer_ids and mask_token_id")
    n = int(raw["num_hidden_layers"])
    rope = raw.get("rope_parameters") or {}
    heads = int(raw["num_attention_heads"])
    return DFlashConfig(
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=n,
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads", heads)),
        head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
        vocab_size=int(raw["vocab_size"]),
        num_target_layers=int(raw.get("num_target_layers", -1)),
        taps=tuple(int(t) for t in d["target_layer_ids"]),
        mask_token_id=int(d["mask_token_id"]),
        block_size=int(d.get("block_size", raw.get("block_size", 16))),
        rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
        eps=float(raw.get("rms_norm_eps", 1e-6)),
        layer_types=tuple(raw.get("layer_types") or ["full_attention"] * n),
        # As transformers' Qwen3 config reads it: the window only with use_sliding_window.
        sliding_window=raw.get("sliding_window") if raw.get("use_sliding_window") else None,
        is_causal=raw.get("is_causal", d.get("causal")),
        embedding_scale=float(d.get("input_embedding_scale", 1.0)),
        output_multiplier=float(d.get("output_multiplier", raw.get("output_multiplier", 1.0))),
        softcap=d.get("final_logit_softcapping", raw.get("final_logit_softcapping")),
        v2=v2,
    )


def tensor_shapes(c: DFlashConfig, names=()) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape (`names`: the file's, to pick a codebook's spelling)."""
    h, d = c.hidden_size, c.head_dim
    shapes = {
        "fc.weight": (h, len(c.taps) * h),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for i in range(c.num_layers):
        p, a = f"layers.{i}.", f"layers.{i}.self_attn."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            a + "q_proj.weight": (c.num_heads * d, h),
            a + "k_proj.weight": (c.num_kv_heads * d, h),
            a + "v_proj.weight": (c.num_kv_heads * d, h),
            a + "o_proj.weight": (h, c.num_heads * d),
            a + "q_norm.weight": (d,),
            a + "k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (c.intermediate_size, h),
            p + "mlp.up_proj.weight": (c.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, c.intermediate_size),
        }
    if c.v2 is not None:
        shapes |= dflash2_shapes(c.v2, h, c.vocab_size, c.num_layers, names)
    return shapes


def check_dflash(path: str | Path, target) -> tuple[DFlashConfig, Checkpoint]:
    """Binds the drafter to the target config by its fields and tensor headers, reading no data:
    width, vocabulary, depth, taps, fc, mask id (DraftForAnotherTarget); then every tensor."""
    c = read_config(path)
    wrong = [
        (
            c.hidden_size == target.hidden_size,
            f"hidden_size {c.hidden_size} != the target's {target.hidden_size}",
        ),
        (
            c.vocab_size == target.vocab_size,
            f"vocab_size {c.vocab_size} != the target's {target.vocab_size}",
        ),
        (
            c.num_target_layers in (-1, target.num_layers),
            f"num_target_layers {c.num_target_layers} != the target's {target.num_layers} layers",
        ),
        (
            bool(c.taps) and all(0 <= t < target.num_layers for t in c.taps),
            f"target_layer_ids {list(c.taps)} outside the target's {target.num_layers} layers",
        ),
        (
            0 <= c.mask_token_id < target.vocab_size,
            f"mask_token_id {c.mask_token_id} outside the vocabulary [0, {target.vocab_size})",
        ),
    ]
    for ok, why in wrong:
        if not ok:
            raise DraftForAnotherTarget(f"{path}: {why}")
    ckpt = Checkpoint(path)
    fc = ckpt.info("fc.weight").shape if "fc.weight" in ckpt else None
    if fc is not None and tuple(fc) != (c.hidden_size, len(c.taps) * c.hidden_size):
        raise DraftForAnotherTarget(
            f"{path}: fc.weight {list(fc)}, but {len(c.taps)} taps of width {c.hidden_size} need "
            f"[{c.hidden_size}, {len(c.taps) * c.hidden_size}]"
        )
    for name, shape in tensor_shapes(c, ckpt).items():
        rows = ckpt.info(name).shape[0] if "codebook" in name and name in ckpt else c.vocab_size
        if rows != c.vocab_size:  # the selector's codebooks are indexed by the target's ids
            raise DraftForAnotherTarget(
                f"{path}: {name} has {rows} rows; the target's vocabulary has {c.vocab_size}"
            )
        if name not in ckpt:
            raise NotStockDrafter(f"{path}: tensor {name} is missing")
        if tuple(ckpt.info(name).shape) != shape:
            raise NotStockDrafter(
                f"{path}: {name} {list(ckpt.info(name).shape)}, expected {list(shape)}"
            )
    return c, ckpt


@dataclass
class DraftLayer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    gate: Linear
    up: Linear
    down: Linear
    attention_conv: Conv | None = None  # DFlash2
    mlp_conv: Conv | None = None


class DFlashModel:
    def __init__(self, c: DFlashConfig, fc, hidden_norm, norm, layers, dtype, device) -> None:
        self.config, self.fc, self.hidden_norm, self.norm = c, fc, hidden_norm, norm
        self.layers, self.dtype, self.device = layers, dtype, device
        self.selector: Selector | None = None  # DFlash2

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # Qwen3 norms: x * w
        shape = x.shape
        return op.rms_norm(x.reshape(-1, shape[-1]), w, self.config.eps, 0.0).reshape(shape)

    def _rope(self, positions: torch.Tensor):
        return rope_tables(positions, self.config.head_dim, self.config.rope_theta, self.dtype)

    def _kv(self, layer: DraftLayer, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        c, n = self.config, x.shape[0]
        k = self._norm(layer.k(x).view(n, c.num_kv_heads, c.head_dim), layer.k_norm)
        return apply_rope(k, *rope), layer.v(x).view(n, c.num_kv_heads, c.head_dim)

    def context(self, features, positions, rows, kv) -> None:
        """Writes each layer's context K/V of the committed positions `positions` (KV `rows`)."""
        c = self.hidden_norm_apply(features)
        rope = self._rope(positions)
        for i, layer in enumerate(self.layers):
            k, v = self._kv(layer, c, rope)
            kv.k[i][rows] = k.to(kv.k[i].dtype)
            kv.v[i][rows] = v.to(kv.v[i].dtype)

    def hidden_norm_apply(self, features: torch.Tensor) -> torch.Tensor:
        return self._norm(self.fc(features.to(self.dtype)), self.hidden_norm)

    def hidden(self, embed, ids: list[int], start: int, ctx_rows, kv) -> torch.Tensor:
        """The final-normed states [len(ids) - 1, H] of the positions after the anchor ids[0]."""
        c, n, dev = self.config, len(ids), self.device
        h = embed(torch.tensor(ids, device=dev)).to(self.dtype) * c.embedding_scale
        positions = torch.arange(start, start + n, device=dev)
        rope = self._rope(positions)
        keys = torch.arange(start + n, device=dev)
        for i, layer in enumerate(self.layers):
            x, after = _before(layer.attention_conv, self._norm(h, layer.input_norm))
            q = self._norm(layer.q(x).view(n, c.num_heads, c.head_dim), layer.q_norm)
            q = apply_rope(q, *rope)
            k, v = self._kv(layer, x, rope)
            k = torch.cat([kv.k[i][ctx_rows].to(k.dtype), k])
            v = torch.cat([kv.v[i][ctx_rows].to(v.dtype), v])
            h = h + after(layer.o(self._attend(q, k, v, positions, keys, i).reshape(n, -1)))
            x, after = _before(layer.mlp_conv, self._norm(h, layer.post_norm))
            h = h + after(layer.down(F.silu(layer.gate(x)) * layer.up(x)))
        return self._norm(h, self.norm)[1:]

    def logits(self, head, hidden: torch.Tensor) -> torch.Tensor:
        c = self.config
        logits = head(hidden).float() * c.output_multiplier
        if c.softcap:
            logits = torch.tanh(logits / float(c.softcap)) * float(c.softcap)
        return logits

    def block(self, embed, head, ids: list[int], start: int, ctx_rows, kv) -> torch.Tensor:
        """Logits [len(ids) - 1, V] for the positions after the anchor ids[0] at `start`."""
        return self.logits(head, self.hidden(embed, ids, start, ctx_rows, kv))

    def draft(self, embed, head, ids: list[int], start: int, ctx_rows, kv) -> list[int]:
        """The drafts: each row's argmax (v1), or the selector's greedy walk (DFlash2)."""
        hidden = self.hidden(embed, ids, start, ctx_rows, kv)
        logits = self.logits(head, hidden)
        if self.selector is None:
            return logits.argmax(-1).tolist()
        return self.selector.walk(hidden, logits, ids[0])

    def _attend(self, q, k, v, qpos, kpos, layer: int) -> torch.Tensor:
        c = self.config
        visible = torch.ones(qpos.shape[0], kpos.shape[0], dtype=torch.bool, device=q.device)
        if c.causal(layer):
            visible &= kpos[None, :] <= qpos[:, None]
        window = c.window(layer)
        if window is not None:
            visible &= qpos[:, None] - kpos[None, :] < window
            if not c.causal(layer):
                visible &= kpos[None, :] - qpos[:, None] < window
        rep = c.num_heads // c.num_kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=visible
        )
        return out.transpose(0, 1)


def _before(conv: Conv | None, u: torch.Tensor):
    """A sublayer's input through its first convolution, and what its output goes through."""
    if conv is None:
        return u, lambda y: y
    x, dyn = conv.before(u)
    return x, lambda y: conv.after(y, dyn)


def load_dflash(path: str | Path, target) -> DFlashModel:
    """The drafter at `path` for `target` (a loaded Qwen35Model), checked before any read."""
    c, ckpt = check_dflash(path, target.config)
    dtype, dev = target.dtype, target.device
    acc = torch.float64 if dtype == torch.float64 else torch.float32

    def t(name, dt=None):
        return ckpt.read(name).to(dev, dt or acc)

    def lin(name):
        return Linear(ckpt.read(name + ".weight").to(dev, dtype), dtype)

    def conv(prefix):
        return load_conv(lambda n: t(n, dtype), lin, prefix) if c.v2 else None

    layers = []
    for i in range(c.num_layers):
        p, a = f"layers.{i}.", f"layers.{i}.self_attn."
        layers.append(
            DraftLayer(
                t(p + "input_layernorm.weight"),
                t(p + "post_attention_layernorm.weight"),
                lin(a + "q_proj"),
                lin(a + "k_proj"),
                lin(a + "v_proj"),
                lin(a + "o_proj"),
                t(a + "q_norm.weight"),
                t(a + "k_norm.weight"),
                lin(p + "mlp.gate_proj"),
                lin(p + "mlp.up_proj"),
                lin(p + "mlp.down_proj"),
                conv(p + "attention_conv."),
                conv(p + "mlp_conv."),
            )
        )
    model = DFlashModel(c, lin("fc"), t("hidden_norm.weight"), t("norm.weight"), layers, dtype, dev)
    if c.v2 is not None:
        model.selector = load_selector(ckpt, c.v2, lambda n: t(n, dtype), lin)
    return model
