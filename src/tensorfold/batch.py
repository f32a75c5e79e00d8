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
    writes: int = -1  # the slot its state is written to when not `slot` (a verify pass's spare)

    @property
    def rows(self) -> slice:
        return slice(self.row0, self.row0 + self.length)

    @property
    def out(self) -> int:
        """The slot the pass leaves the lane's state in."""
        return self.slot if self.writes < 0 else self.writes


@dataclass(frozen=True)
class LaneIndex:
    """Index tensors of the per-lane kernels, on the pass's device."""

    slots: torch.Tensor  # [lanes] GDN state slot of each segment
    cu_seqlens: torch.Tensor  # [lanes + 1] row boundaries of the segments
    conv_taps: torch.Tensor  # [rows, K] rows of [lanes' conv states ; new rows] each output reads
    conv_keep: torch.Tensor  # [lanes, K-1] the rows that become each lane's next conv state
    attention: object = None  # ops.triton.attention.AttentionTiles on CUDA; None on the CPU
    tails: torch.Tensor | None = None  # [lanes] rows since each lane's last 64-row boundary
    gdn: object = (
        None  # ops.triton.gated_delta_chunk.LanePlan of an eager CUDA pass; None otherwise
    )
    # rows past a lane's real ones (a mixed graph's prompt piece): no kernel of the recurrence or
    # attention writes them, so their outputs start as zeros and the rows stay finite (the
    # experts' routing reads every row)
    padded: bool = False
    # [lanes] the slot each lane's conv and recurrent state are written to, where a lane reads
    # one slot and leaves its state in another (a verify pass keeps the state it started from);
    # None: every lane's own. The per-token recurrence's kernels take it, the chunk forms refuse it
    writes: torch.Tensor | None = None
    most_rows: int = 0  # the most rows of one lane, known to the host (0: not known)


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


CHUNK = 64  # rows of one Gated DeltaNet chunk on the absolute position grid


@dataclass(frozen=True)
class GDNState:
    """One Gated DeltaNet layer's state slots (cache/state_pool.py allocates them)."""

    conv: torch.Tensor  # [slots, K-1, conv_dim] the conv's last input rows
    recurrent: torch.Tensor  # [slots, Hv, dk, dv] the state at the lane's last grid boundary
    tail: torch.Tensor  # [slots, 64, conv_dim] the conv's output rows since that boundary
    tail_gates: torch.Tensor  # [slots, 64, 2, Hv] their log-decay g and beta, in the state dtype
    # [n] int32 zeros, shared by the layers: the grid form's count of each lane's programs done
    # reading (the last one writes the lane's tail; ops/triton/gated_delta_grid.py)
    arrivals: torch.Tensor | None = None

    def lane_rows(self, slot: int, t0: int, x: torch.Tensor, g: torch.Tensor, beta: torch.Tensor):
        """(x, g, beta) of the lane's rows from its boundary: the tail's t0 rows, then the new."""
        gates = self.tail_gates[slot, :t0]
        return (
            torch.cat([self.tail[slot, :t0], x]),
            torch.cat([gates[:, 0], g.to(gates.dtype)]),
            torch.cat([gates[:, 1], beta.to(gates.dtype)]),
        )

    def keep_tail(self, slot: int, x: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> None:
        """The rows of the lane's unfinished chunk become its tail."""
        n = x.shape[0] % CHUNK
        if n:
            self.tail[slot, :n] = x[-n:]
            self.tail_gates[slot, :n, 0] = g[-n:]
            self.tail_gates[slot, :n, 1] = beta[-n:]
