"""The Qwen3.5 decoder: Gated DeltaNet layers with gated full attention every few layers
(docs/model.md); the MLP is dense, or a sparse mixture of experts in every layer of an MoE model.

    h = embed(ids)
    for each layer:  h = h + mixer(norm_in(h));  h = h + mlp(norm_post(h))
    logits = head(norm(h))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..batch import ForwardBatch
from ..config import ModelConfig
from ..layers.attention import GatedAttention
from ..layers.gdn import GatedDeltaNet
from ..layers.linear import Embedding, Linear, product_linears
from ..layers.mlp import MLP
from ..layers.moe import SparseMoE
from ..layers.norm import RMSNorm
from ..ops import dispatch as op
from ..ops.gated_delta import OWN_KERNELS, grid_card_refuses, grid_chunked
from ..ops.quant import QuantizedWeight
from ..ops.rope import rope_tables


@dataclass(frozen=True)
class CacheWidths:
    """The widths of the caches this process holds (a rank of a split: its heads only)."""

    kv_heads: int
    conv_dim: int
    v_heads: int


@dataclass
class DecoderLayer:
    input_norm: RMSNorm
    mixer: GatedDeltaNet | GatedAttention
    post_norm: RMSNorm
    mlp: MLP | SparseMoE
    cache_index: int  # index into the KV layers or the state layers of the caches


class Qwen35Model:
    def __init__(
        self,
        config: ModelConfig,
        embed: Embedding,
        layers: list[DecoderLayer],
        norm: RMSNorm,
        lm_head: Linear,
        dtype: torch.dtype,
        device: torch.device,
        layout: str = "hf",
    ) -> None:
        self.config, self.embed, self.layers, self.norm = config, embed, layers, norm
        self.lm_head, self.dtype, self.device = lm_head, dtype, device
        self.layout = layout  # the file's weight layout: "hf" or "mlx"
        self.path = None  # the checkpoint folder it was loaded from (loader sets it)
        self.keep_hidden = False  # keep every row's post-final-norm state (an MTP drafter reads it)
        self.hidden: torch.Tensor | None = None
        self.taps: tuple[int, ...] = ()  # layers whose output a block drafter reads (DFlash)
        self.tapped: torch.Tensor | None = None  # those outputs, concatenated in `taps` order
        self.shard = None  # models.split.Shard: this rank's part of a tensor split
        self.group = None  # ops.collective.Group: the ranks of that split

    @property
    def cache_widths(self) -> CacheWidths:
        cfg, s = self.config, self.shard
        if s is None:
            return CacheWidths(cfg.num_kv_heads, cfg.conv_dim, cfg.linear_num_value_heads)
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        return CacheWidths(
            s.kv_heads.count, 2 * dk * s.k_heads.count + dv * s.v_heads.count, s.v_heads.count
        )

    def forward(self, batch: ForwardBatch, caches) -> torch.Tensor:
        """Runs every row of the pass through all layers; returns logits [R, vocab] of batch.logit_rows.

        `caches` provides kv_layer(i) -> (k, v) and state_layer(i) -> a GDNState. Each
        residual add is fused into the norm after it: h, x = norm(delta, residual=h).
        """
        cfg = self.config
        positions = op.pad_rows(batch.positions)
        h = self.embed(op.pad_rows(batch.token_ids)).to(self.dtype)
        rope = rope_tables(positions, cfg.rotary_dim, cfg.rope_theta, self.dtype)
        x = self.layers[0].input_norm(h)
        norms_after = [layer.input_norm for layer in self.layers[1:]] + [self.norm]
        tapped = {}
        for i, (layer, next_norm) in enumerate(zip(self.layers, norms_after)):
            # each output's segment sums are added inside the residual add that reads it
            h, x = layer.post_norm(self._mix(layer, x, batch, rope, caches), residual=h)
            h, x = next_norm(layer.mlp(x, partial=True), residual=h)
            if i in self.taps:
                tapped[i] = h  # the residual stream after layer i
        if self.taps:
            self.tapped = torch.cat([tapped[i] for i in self.taps], dim=-1)
        if self.keep_hidden:
            self.hidden = x
        return self.lm_head(x[batch.logit_rows])

    @staticmethod
    def _mix(layer: DecoderLayer, x, batch, rope, caches) -> torch.Tensor:
        if isinstance(layer.mixer, GatedAttention):
            return layer.mixer(x, batch, rope, *caches.kv_layer(layer.cache_index), partial=True)
        return layer.mixer(x, batch, caches.state_layer(layer.cache_index), partial=True)

    @property
    def gdn_form(self) -> str:
        forms = {
            layer.mixer.form for layer in self.layers if isinstance(layer.mixer, GatedDeltaNet)
        }
        return forms.pop() if forms else "recurrence"

    def set_gdn_form(self, form: str) -> None:
        """Every Gated DeltaNet layer's exact form (ops.dispatch.gated_delta)."""
        grid_chunked(form)  # names an unknown form
        mixers = [layer.mixer for layer in self.layers if isinstance(layer.mixer, GatedDeltaNet)]
        # our chunk kernels' card limits; the CPU runs the reference at any shape
        if form in OWN_KERNELS and self.device.type == "cuda":
            refused = next(filter(None, (grid_card_refuses(m.shape) for m in mixers)), None)
            if refused:
                raise ValueError(refused)
        for mixer in mixers:
            mixer.form = form

    def join_shared_experts(self) -> int:
        """Each MoE layer's shared expert as one more expert of its grouped launches, where its
        format allows (layers.moe.SparseMoE.join_shared); returns how many layers took it."""
        return sum(layer.mlp.join_shared() for layer in self.layers if _moe(layer))

    def separate_shared_experts(self) -> None:
        """Each MoE layer's shared expert through its own launches (the same bits)."""
        for layer in filter(_moe, self.layers):
            layer.mlp.separate_shared()

    @property
    def weight_bytes(self) -> int:
        """Bytes of the projection and embedding weights as held (packed ones stay packed)."""
        weights = {id(w): w for w in [self.embed.weight] + [lin.weight for lin in self.linears()]}
        experts = sum(  # joined, the stacks hold the shared expert a second time
            (layer.mlp.appended or layer.mlp.experts).nbytes for layer in filter(_moe, self.layers)
        )
        return experts + sum(
            w.nbytes if isinstance(w, QuantizedWeight) else w.numel() * w.element_size()
            for w in weights.values()
        )  # a tied head shares the embedding: counted once

    def product_weights(self) -> list[QuantizedWeight]:
        """The packed weights the passes multiply by (the head and every layer's projections,
        joined ones as their products), each once; the MoE's expert stacks are not among them."""
        owners = [layer.mixer for layer in self.layers] + [layer.mlp for layer in self.layers]
        owners += [layer.mlp.shared for layer in filter(_moe, self.layers)]
        lins = [self.lm_head] + [lin for owner in owners for lin in product_linears(owner)]
        packed = {id(lin.weight): lin.weight for lin in lins}
        return [w for w in packed.values() if isinstance(w, QuantizedWeight)]

    def unpacked_bytes(self, held: bool = True) -> int:
        """Bytes of the packed product weights dequantized to the model's dtype: held now, or
        (`held` False) all of them, as `hold_unpacked` would hold them."""
        item = torch.empty((), dtype=self.dtype).element_size()
        ws = self.product_weights()
        return sum(w.unpacked_nbytes if held else w.shape[0] * w.shape[1] * item for w in ws)

    def hold_unpacked(self) -> None:
        """Holds each packed product weight dequantized too (`--unpacked-weights`): the products
        that dequantize a whole weight first (many rows a pass) read it instead, the same bits."""
        for w in self.product_weights():
            if w.unpacked(self.dtype) is None:
                w.hold_unpacked(op.unpacked(w, self.dtype))

    def release_unpacked(self) -> None:
        """Drops the held dequantized weights: the products read the packed ones again."""
        for w in self.product_weights():
            w.release_unpacked()

    def linears(self):
        """Every projection of the model (the head first), each once, merged ones as their parts."""
        yield self.lm_head
        for layer in self.layers:
            yield from (v for v in vars(layer.mixer).values() if isinstance(v, Linear))
            if isinstance(layer.mlp, SparseMoE):  # its routed experts are stacks, not projections
                yield from layer.mlp.linears()
            else:
                yield from (v for v in vars(layer.mlp).values() if isinstance(v, Linear))


def _moe(layer: DecoderLayer) -> bool:
    return isinstance(layer.mlp, SparseMoE)
