"""Gated DeltaNet state slots: per lane, per layer, the conv window, the fp32 state at the lane's
last 64-row grid boundary and the rows since (ops/gated_delta.py).

Slots are plain rows of preallocated tensors, so a lane's whole state can be copied out
(a snapshot: the prompt cache, a draft position) and copied back bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..batch import CHUNK, GDNState
from .lazy import zeros


@dataclass(frozen=True)
class StateSnapshot:
    tensors: tuple[torch.Tensor, ...]  # one slot of every pool tensor, in StatePool.tensors order

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds (on the meta device: what it would hold, nothing allocated)."""
        return sum(t.numel() * t.element_size() for t in self.tensors)


class StatePool:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        conv_kernel: int,
        conv_dim: int,
        num_v_heads: int,
        k_head_dim: int,
        v_head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        tail_rows: int = 0,
    ) -> None:
        """tail_rows: CHUNK for the chunk form of the gated delta rule, 0 for the recurrence."""
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        self.num_slots = num_slots

        def per_layer(*shape, dt=dtype):
            return [zeros(num_slots, *shape, dtype=dt, device=device) for _ in range(num_layers)]

        self.conv = per_layer(conv_kernel - 1, conv_dim)
        self.recurrent = per_layer(num_v_heads, k_head_dim, v_head_dim, dt=state_dtype)
        # the conv outputs, g and beta of each lane's rows since its last 64-row grid boundary
        self.tail = per_layer(tail_rows, conv_dim)
        self.tail_gates = per_layer(tail_rows, 2, num_v_heads, dt=state_dtype)
        self._free = list(range(num_slots - 1, -1, -1))
        # a pass's lanes: each slot at most once, padding lanes too (one per bucket place)
        self.arrivals = (
            zeros(2 * num_slots, dtype=torch.int32, device=device) if tail_rows else None
        )

    @property
    def tensors(self) -> list[torch.Tensor]:
        return self.conv + self.recurrent + self.tail + self.tail_gates

    def layer(self, i: int) -> GDNState:
        return GDNState(
            self.conv[i], self.recurrent[i], self.tail[i], self.tail_gates[i], self.arrivals
        )

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise MemoryError("state pool exhausted")
        slot = self._free.pop()
        self.reset(slot)
        return slot

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def reset(self, slot: int) -> None:
        for t in self.tensors:
            t[slot].zero_()

    def snapshot(self, slot: int) -> StateSnapshot:
        return StateSnapshot(tuple(t[slot].clone() for t in self.tensors))

    def restore(self, slot: int, snap: StateSnapshot) -> None:
        for dst, src in zip(self.tensors, snap.tensors):
            dst[slot].copy_(src)

    def copy_slot(self, src: int, dst: int, into: StatePool | None = None) -> None:
        """Copies slot `src` to slot `dst` of `into` (this pool by default), bit for bit."""
        self.copy_slots([src], [dst], into)

    def copy_slots(self, src: list[int], dst: list[int], into: StatePool | None = None) -> None:
        """copy_slot for several slots at once, bit for bit: one gather and one scatter a state
        tensor for all the slots (a copy per tensor and slot was ~770 launches from the host
        for a 16-lane verify pass at the 9B); one slot's tensors in one multi-tensor copy."""
        into = into or self
        pairs = [(a, b) for a, b in zip(self.tensors, into.tensors) if a[0].numel()]
        if not pairs or not src:
            return
        if len(src) > 1:
            dev = pairs[0][0].device
            rows = torch.tensor(src, device=dev), torch.tensor(dst, device=dev)
            for a, b in pairs:
                b.index_copy_(0, rows[1], a.index_select(0, rows[0]))
            return
        torch._foreach_copy_(
            [b[j] for j in dst for _, b in pairs], [a[i] for i in src for a, _ in pairs]
        )

    def like(self, num_slots: int) -> StatePool:
        """An empty pool of `num_slots` slots shaped like this one (the draft spares)."""
        pool = object.__new__(StatePool)
        pool.num_slots, pool._free = num_slots, list(range(num_slots - 1, -1, -1))

        def empty(ts):
            return [t.new_zeros(num_slots, *t.shape[1:]) for t in ts]

        pool.conv, pool.recurrent = empty(self.conv), empty(self.recurrent)
        pool.tail, pool.tail_gates = empty(self.tail), empty(self.tail_gates)
        pool.arrivals = None if self.arrivals is None else self.arrivals.new_zeros(2 * num_slots)
        return pool

    def slot_bytes(self, slot: int, position: int) -> list[torch.Tensor]:
        """What a lane's state is at `position`: every layer's conv window, boundary state and the
        tail rows that are real (rows past them are leftovers no row reads)."""
        n = position % CHUNK if self.tail and self.tail[0].shape[1] else 0
        out = []
        for conv, rec, tail, gates in zip(self.conv, self.recurrent, self.tail, self.tail_gates):
            out += [conv[slot], rec[slot], tail[slot, :n], gates[slot, :n]]
        return out

    @property
    def slot_nbytes(self) -> int:
        return self.nbytes // max(1, self.num_slots)

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds (on the meta device: what it would hold, nothing allocated)."""
        return sum(t.numel() * t.element_size() for t in self.tensors)
