"""The Qwen3.5 dense decoder: Gated DeltaNet layers with gated full attention every few layers.

    h = embed(ids)
    for each layer:  h = h + mixer(norm_in(h));  h = h + mlp(norm_post(h))
    logits = head(norm(h))
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ModelConfig
from ..layers.attention import GatedAttention
from ..layers.gdn import GatedDeltaNet
from ..layers.linear import Embedding, Joined, Linear, QuantizedWeight
from ..layers.mlp import MLP
from ..layers.norm import RMSNorm
from ..ops.linear import pad_rows
from ..ops.rope import rope_tables
from ..runner.batch import ForwardBatch


@dataclass
class DecoderLayer:
    input_norm: RMSNorm
    mixer: GatedDeltaNet | GatedAttention
    post_norm: RMSNorm
    mlp: MLP
    cache_index: int          # index into the KV layers or the state layers of the caches


class Qwen35Model:
    def __init__(self, config: ModelConfig, embed: Embedding, layers: list[DecoderLayer], norm: RMSNorm,
                 lm_head: Linear, dtype: torch.dtype, device: torch.device) -> None:
        self.config, self.embed, self.layers, self.norm, self.lm_head = config, embed, layers, norm, lm_head
        self.dtype, self.device = dtype, device
        self.exact = True         # False once use_inexact_kernels() has run (benchmarks only)

    def forward(self, batch: ForwardBatch, caches) -> torch.Tensor:
        """Runs every row of the pass through all layers; returns logits [R, vocab] of batch.logit_rows.

        `caches` provides kv_layer(i) -> (k, v) and state_layer(i) -> (conv, recurrent).
        """
        if batch.gpu is not None:
            return self._forward_gpu(batch, caches)
        # Row-wise ops see a row count padded to the tile: a contiguous elementwise op then has no
        # scalar tail, so every element takes the same (vector) code path whatever the pass holds.
        ids, positions = pad_rows(batch.token_ids), pad_rows(batch.positions)
        h = self.embed(ids).to(self.dtype)
        cfg = self.config
        rope = rope_tables(positions, cfg.rotary_dim, cfg.rope_theta, self.dtype)
        for layer in self.layers:
            x = layer.input_norm(h)
            if isinstance(layer.mixer, GatedAttention):
                h = h + layer.mixer(x, batch, rope, *caches.kv_layer(layer.cache_index))
            else:
                h = h + layer.mixer(x, batch, *caches.state_layer(layer.cache_index))
            h = h + layer.mlp(layer.post_norm(h))
        return self.lm_head(self.norm(h[batch.logit_rows]))

    def _forward_gpu(self, batch: ForwardBatch, caches) -> torch.Tensor:
        """The same layers with each residual add fused into the norm after it; no row padding (the
        GPU kernels' bits never depend on the row count)."""
        from ..ops.triton.norm import add_rms_norm
        cfg = self.config
        h = self.embed(batch.token_ids).to(self.dtype)
        rope = rope_tables(batch.positions, cfg.rotary_dim, cfg.rope_theta, self.dtype)
        x = self.layers[0].input_norm(h)
        norms_after = [layer.input_norm for layer in self.layers[1:]] + [self.norm]
        for layer, next_norm in zip(self.layers, norms_after):
            if isinstance(layer.mixer, GatedAttention):
                delta = layer.mixer(x, batch, rope, *caches.kv_layer(layer.cache_index))
            else:
                delta = layer.mixer(x, batch, *caches.state_layer(layer.cache_index))
            h, x = add_rms_norm(h, delta, layer.post_norm.weight, layer.post_norm.eps, layer.post_norm.offset)
            h, x = add_rms_norm(h, layer.mlp(x), next_norm.weight, next_norm.eps, next_norm.offset)
        return self.lm_head(x[batch.logit_rows])

    def use_inexact_kernels(self) -> None:
        """For benchmarks only: cuBLAS products for bf16 weights and fla's chunked (WY) recurrence for
        prompt rows, the fastest kernels at hand that do not keep the invariants. What exactness
        costs is the gap between this and the default."""
        merged = [j.whole for layer in self.layers for obj in (layer.mixer, layer.mlp) for j in vars(obj).values()
                  if isinstance(j, Joined) and j.whole is not None]
        for lin in list(self._linears()) + merged:
            lin.inexact = True
        for layer in self.layers:
            if isinstance(layer.mixer, GatedDeltaNet):
                layer.mixer.inexact = True
        self.exact = False

    @property
    def weight_bytes(self) -> int:
        """Bytes of the projection and embedding weights as held (packed ones stay packed)."""
        weights = {id(w): w for w in [self.embed.weight] + [lin.weight for lin in self._linears()]}
        return sum(w.nbytes if isinstance(w, QuantizedWeight) else w.numel() * w.element_size()
                   for w in weights.values())   # a tied head shares the embedding: counted once

    def _linears(self):
        yield self.lm_head
        for layer in self.layers:
            for obj in (layer.mixer, layer.mlp):
                yield from (v for v in vars(obj).values() if isinstance(v, Linear))
