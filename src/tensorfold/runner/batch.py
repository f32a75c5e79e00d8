"""What one forward pass computes: rows of several lanes, flattened."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Segment:
    """Consecutive rows of one lane in a pass (a prompt chunk, or one decode row)."""

    slot: int               # the lane's GDN state slot
    start: int              # absolute position of the first row
    row0: int               # index of the first row in the pass
    length: int
    kv_slots: torch.Tensor  # [start+length] KV cache row of every position of the lane so far

    @property
    def rows(self) -> slice:
        return slice(self.row0, self.row0 + self.length)


@dataclass(frozen=True)
class ForwardBatch:
    token_ids: torch.Tensor   # [N]
    positions: torch.Tensor   # [N]
    kv_write: torch.Tensor    # [N] KV cache row each row's K/V is written to
    segments: tuple[Segment, ...]
    logit_rows: torch.Tensor  # [R] rows whose next-token logits are wanted
    gpu: object = None        # GPUMeta on CUDA: attention tiles, lane slots, cu_seqlens

    @property
    def num_rows(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass(frozen=True)
class GPUMeta:
    attention: object         # ops.triton.attention.AttentionTiles
    slots: torch.Tensor       # [lanes] GDN state slot of each segment
    cu_seqlens: torch.Tensor  # [lanes + 1] row boundaries of the segments

    @staticmethod
    def build(segments, device) -> "GPUMeta":
        from ..ops.triton.attention import AttentionTiles
        bounds = [0]
        for seg in segments:
            bounds.append(bounds[-1] + seg.length)
        return GPUMeta(AttentionTiles.build(segments, device),
                       torch.tensor([s.slot for s in segments], dtype=torch.long, device=device),
                       torch.tensor(bounds, dtype=torch.long, device=device))
