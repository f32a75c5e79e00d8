"""Gated DeltaNet state slots: per lane, per layer, the conv window and the fp32 recurrent state.

Slots are plain rows of preallocated tensors, so a lane's whole state can be copied out
(a snapshot: the prompt cache, a draft position) and copied back bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StateSnapshot:
    conv: tuple[torch.Tensor, ...]  # per GDN layer [K-1, conv_dim]
    recurrent: tuple[torch.Tensor, ...]  # per GDN layer [Hv, dk, dv]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.conv + self.recurrent)


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
    ) -> None:
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        self.num_slots = num_slots
        self.conv = [
            torch.zeros(num_slots, conv_kernel - 1, conv_dim, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]
        self.recurrent = [
            torch.zeros(
                num_slots, num_v_heads, k_head_dim, v_head_dim, dtype=state_dtype, device=device
            )
            for _ in range(num_layers)
        ]
        self._free = list(range(num_slots - 1, -1, -1))

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
        for t in self.conv + self.recurrent:
            t[slot].zero_()

    def snapshot(self, slot: int) -> StateSnapshot:
        return StateSnapshot(
            tuple(t[slot].clone() for t in self.conv),
            tuple(t[slot].clone() for t in self.recurrent),
        )

    def restore(self, slot: int, snap: StateSnapshot) -> None:
        for dst, src in zip(self.conv + self.recurrent, snap.conv + snap.recurrent):
            dst[slot].copy_(src)

    def copy_slot(self, src: int, dst: int, into: StatePool | None = None) -> None:
        """Copies slot `src` to slot `dst` of `into` (this pool by default), bit for bit."""
        self.copy_slots([src], [dst], into)

    def copy_slots(self, src: list[int], dst: list[int], into: StatePool | None = None) -> None:
        """copy_slot for several slots at once: every state tensor of every slot in one
        multi-tensor copy (on a GPU a few launches, where a copy per tensor cost ~0.3 ms a
        verify pass for the demo model's 12 tensors)."""
        into = into or self
        ours, theirs = self.conv + self.recurrent, into.conv + into.recurrent
        targets = [t[j] for j in dst for t in theirs]
        sources = [t[i] for i in src for t in ours]
        torch._foreach_copy_(targets, sources)

    def like(self, num_slots: int) -> StatePool:
        """An empty pool of `num_slots` slots shaped like this one (the draft spares)."""
        pool = object.__new__(StatePool)
        pool.num_slots, pool._free = num_slots, list(range(num_slots - 1, -1, -1))
        pool.conv = [torch.zeros_like(t[:1]).repeat(num_slots, 1, 1) for t in self.conv]
        pool.recurrent = [
            torch.zeros_like(t[:1]).repeat(num_slots, 1, 1, 1) for t in self.recurrent
        ]
        return pool

    @property
    def slot_nbytes(self) -> int:
        return self.nbytes // max(1, self.num_slots)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.conv + self.recurrent)
