"""The DFlash drafter (models/dflash.py) in the engine: after each pass it reads the target's
tapped residual streams of every row whose input and next token are committed and writes the
drafter's context K/V there (its own pool over the target's pages and rows); a proposal is one
block pass over [anchor, mask x k] (DFlash2: then the selector's walk). It only guesses; the
verify pass decides.

Every request drafts greedily (each row's argmax, or DFlash2's greedy walk), sampled ones too: a
draft stands only where it equals the token the request itself draws there with its own seeded
randomness, so what is proposed changes the speed, never the reply, and drafting must not draw
from that randomness. A walk sampled at the request's temperature would only move acceptance."""

from __future__ import annotations

import torch

from ..cache import KVShape, ModelCaches
from ..models.dflash import DFlashModel
from ..models.qwen3_5 import Qwen35Model
from .base import Drafter, LaneDrafter


class DFlashDrafter(Drafter):
    reads_states = True

    def __init__(self, target: Qwen35Model, caches: ModelCaches, model: DFlashModel) -> None:
        """`model`: read beforehand (drafters.lookup.load_drafter), so that the pools were
        fitted beside its KV pool."""
        self.target, self.model = target, model
        c, kv = self.model.config, caches.kv
        self.kv = self.kv_shape(target, self.model).pool(kv.num_pages, kv.page_size, target.device)
        target.taps = c.taps

    @staticmethod
    def kv_shape(target: Qwen35Model, model: DFlashModel) -> KVShape:
        """Its own KV pool over the target's pages: every drafter layer's keys and values."""
        c = model.config
        return KVShape(c.num_layers, c.num_kv_heads, c.head_dim, target.dtype)

    def features(self, target: Qwen35Model) -> torch.Tensor:
        return target.tapped

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes

    def for_request(self, req) -> DFlashLane:
        return DFlashLane(self, req)


class DFlashLane(LaneDrafter):
    def __init__(self, drafter: DFlashDrafter, req) -> None:
        self.drafter, self.req = drafter, req
        self.done = 0  # positions whose context K/V hold the target's features

    def observe(self, start: int, features: torch.Tensor) -> None:
        req = self.req
        if start > self.done:  # resumed from the prompt cache: those rows are not ours
            self.done = start
        last = min(start + features.shape[0] - 1, req.num_tokens - 2)
        if last < self.done:
            return
        rows = features[self.done - start : last - start + 1]
        dev = self.drafter.target.device
        with torch.inference_mode():
            self.drafter.model.context(
                rows,
                torch.arange(self.done, last + 1, device=dev),
                req.lane.kv_rows[self.done : last + 1],
                self.drafter.kv,
            )
        self.done = last + 1

    def propose(self, tokens: list[int], output: list[int], k: int) -> list[int]:
        anchor = len(tokens) - 1
        if self.done != anchor:
            return []
        d = self.drafter
        k = min(k, d.model.config.block_size - 1)
        ids = [tokens[-1]] + [d.model.config.mask_token_id] * k
        with torch.inference_mode():  # greedy for sampled requests too (module docstring)
            return d.model.draft(
                d.target.embed, d.target.lm_head, ids, anchor, self.req.lane.kv_rows[:anchor], d.kv
            )
