"""Paged K/V for the full-attention layers: fixed-size pages, one free list for all layers.

A page index names the same rows in every attention layer; a lane's page table maps its
positions to cache rows: row = page * page_size + position % page_size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .lazy import zeros


@dataclass(frozen=True)
class KVShape:
    """A pool's layers and row width: what a page costs before the pool is made."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def page_bytes(self, page_size: int) -> int:
        """K and V of one page in every layer."""
        item = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.layers * page_size * self.kv_heads * self.head_dim * item

    def pool(self, num_pages: int, page_size: int, device: torch.device) -> KVPool:
        return KVPool(
            self.layers, num_pages, page_size, self.kv_heads, self.head_dim, self.dtype, device
        )


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_pages, self.page_size = num_pages, page_size
        rows = num_pages * page_size
        # Zeroed so a row read before it is written is finite (it is masked, and 0 * finite = 0).
        self.k = [
            zeros(rows, num_kv_heads, head_dim, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]
        self.v = [
            zeros(rows, num_kv_heads, head_dim, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]
        self._free = list(range(num_pages - 1, -1, -1))
        self._refs = [0] * num_pages  # lanes and prompt-cache entries holding each page

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"KV pool exhausted: {n} pages asked, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._refs[p] = 1
        return pages

    def share(self, pages: list[int]) -> list[int]:
        """Another holder of these pages (read-only for it): they stay until every holder releases."""
        for p in pages:
            self._refs[p] += 1
        return list(pages)

    def release(self, pages: list[int]) -> None:
        for p in reversed(pages):
            self._refs[p] -= 1
            if self._refs[p] == 0:
                self._free.append(p)

    def copy_page(self, src: int, dst: int) -> None:
        rows_src = slice(src * self.page_size, (src + 1) * self.page_size)
        rows_dst = slice(dst * self.page_size, (dst + 1) * self.page_size)
        for t in self.k + self.v:
            t[rows_dst] = t[rows_src]

    @property
    def page_bytes(self) -> int:
        """Bytes of one page across every attention layer, K and V."""
        return sum(t[: self.page_size].numel() * t.element_size() for t in self.k + self.v)

    def rows(self, pages: list[int], length: int) -> torch.Tensor:
        """Cache rows of positions 0..length-1 of a lane with this page table."""
        device = self.k[0].device if self.k else torch.device("cpu")
        pos = torch.arange(length, device=device)
        table = torch.tensor(pages, dtype=torch.long).to(device, non_blocking=True)  # no wait
        return table[pos // self.page_size] * self.page_size + pos % self.page_size

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
