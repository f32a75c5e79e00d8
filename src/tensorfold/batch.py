"""What one forward pass computes: rows of several lanes, flattened. The description every layer
and kernel reads; the runner builds it."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Segment:
    """Consecutive rows of one lane in a pass (a prompt chunk, or one decode row)."""

    slot: int  # the lane's GDN state slot
    start: int  # absolute position of the first row
    row0: int  # index of the first row in the pass
    length: int
    kv_rows: torch.Tensor  # [start+length] KV cache row of every position of the lane so far

    @property
    def rows(self) -> slice:
        return slice(self.row0, self.row0 + self.length)


@dataclass(frozen=True)
class LaneIndex:
    """Index tensors of the per-lane kernels, on the pass's device."""

    slots: torch.Tensor  # [lanes] GDN state slot of each segment
    cu_seqlens: torch.Tensor  # [lanes + 1] row boundaries of the segments
    conv_taps: torch.Tensor  # [rows, K] rows of [lanes' conv states ; new rows] each output reads
    conv_keep: torch.Tensor  # [lanes, K-1] the rows that become each lane's next conv state
    attention: object = None  # ops.triton.attention.AttentionTiles on CUDA; None on the CPU


@dataclass(frozen=True)
class ForwardBatch:
    token_ids: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    kv_write: torch.Tensor  # [N] KV cache row each row's K/V is written to
    segments: tuple[Segment, ...]
    logit_rows: torch.Tensor  # [R] rows whose next-token logits are wanted
    lanes: LaneIndex

    @property
    def num_rows(self) -> int:
        return int(self.token_ids.shape[0])
