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
    tensors: tuple[torch.Tensor, ...]  # one slot of every kind of state, every layer (stacks order)

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

        def stack(*shape, dt=dtype):
            return zeros(num_layers, num_slots, *shape, dtype=dt, device=device)

        self._stack(
            stack(conv_kernel - 1, conv_dim),
            stack(num_v_heads, k_head_dim, v_head_dim, dt=state_dtype),
            # the conv outputs, g and beta of each lane's rows since its last 64-row grid boundary
            stack(tail_rows, conv_dim),
            stack(tail_rows, 2, num_v_heads, dt=state_dtype),
        )
        self._free = list(range(num_slots - 1, -1, -1))
        # a pass's lanes: each slot at most once, padding lanes too (one per bucket place)
        self.arrivals = (
            zeros(2 * num_slots, dtype=torch.int32, device=device) if tail_rows else None
        )

    def _stack(self, *stacks: torch.Tensor) -> None:
        """Each kind of state is one tensor [layer, slot, ...], a layer's slots a contiguous view
        of it (what the kernels take): a slot of every layer is then one strided copy or fill
        (a draft's saved state and its put-back, a new lane's zeros), not one a layer."""
        self.stacks = list(stacks)
        self.conv, self.recurrent, self.tail, self.tail_gates = (list(s.unbind(0)) for s in stacks)

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
        for s in self.stacks:
            s[:, slot].zero_()

    def snapshot(self, slot: int) -> StateSnapshot:
        """The slot's state, every layer: one copy a kind (the prompt cache's cut)."""
        return StateSnapshot(tuple(s[:, slot].clone() for s in self.stacks))

    def restore(self, slot: int, snap: StateSnapshot) -> None:
        for dst, src in zip(self.stacks, snap.tensors):
            dst[:, slot].copy_(src)

    def copy_slot(self, src: int, dst: int, into: StatePool | None = None) -> None:
        """Copies slot `src` to slot `dst` of `into` (this pool by default), bit for bit."""
        self.copy_slots([src], [dst], into)

    def copy_slots(self, src: list[int], dst: list[int], into: StatePool | None = None) -> None:
        """copy_slot for several slots at once, bit for bit: one strided copy a kind of state
        and slot, every layer in it (a copy per layer, tensor and slot was ~770 launches from
        the host for a 16-lane verify pass at the 9B), all from one multi-tensor call."""
        into = into or self
        pairs = [(a, b) for a, b in zip(self.stacks, into.stacks) if a.numel()]
        torch._foreach_copy_(
            [b[:, j] for j in dst for _, b in pairs], [a[:, i] for i in src for a, _ in pairs]
        )

    def like(self, num_slots: int) -> StatePool:
        """An empty pool of `num_slots` slots shaped like this one (the draft spares)."""
        pool = object.__new__(StatePool)
        pool.num_slots, pool._free = num_slots, list(range(num_slots - 1, -1, -1))
        pool._stack(*(s.new_zeros(s.shape[0], num_slots, *s.shape[2:]) for s in self.stacks))
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
