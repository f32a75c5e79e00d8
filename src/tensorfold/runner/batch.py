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
    conv_taps: torch.Tensor   # [rows, K] rows of [lanes' conv states ; new rows] each output reads
    conv_keep: torch.Tensor   # [lanes, K-1] the rows that become each lane's next conv state

    @staticmethod
    def build(segments, device, conv_kernel: int) -> "GPUMeta":
        from ..ops.triton.attention import AttentionTiles
        bounds, taps, keep = [0], [], []
        lanes, hist = len(segments), conv_kernel - 1

        def source(i: int, seg: Segment, p: int) -> int:   # p-th row of lane i's [state ; new rows]
            return i * hist + p if p < hist else lanes * hist + seg.row0 + p - hist
        for i, seg in enumerate(segments):
            bounds.append(bounds[-1] + seg.length)
            taps += [[source(i, seg, t + j) for j in range(conv_kernel)] for t in range(seg.length)]
            keep.append([source(i, seg, seg.length + j) for j in range(hist)])
        as_t = lambda v: torch.tensor(v, dtype=torch.long, device=device)  # noqa: E731
        return GPUMeta(AttentionTiles.build(segments, device), as_t([s.slot for s in segments]), as_t(bounds),
                       as_t(taps), as_t(keep))
