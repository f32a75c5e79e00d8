"""Row-invariant matrix products.

On the CPU, BLAS picks its kernel (and so its summation order) from the shape of the call:
the same row multiplied alone or beside 6 others can round differently. Every product here
is therefore made of calls of one fixed shape: rows are cut into tiles of `ROW_TILE` and the
weight's output rows into tiles of `col_tile(its rows)` (each last tile zero-padded), so a row's bits never
depend on how many rows share the pass or where it sits among them, and an output column's bits
never depend on how many columns the weight has or where the column sits among them: a rank of a
tensor split that holds a slice of the output rows computes each of its columns as the whole
weight does. Measured (fp32, bf16, fp16): a fixed call shape is position-invariant in rows and in
columns; varying M, or N below ~32, is not. float64 products are not column-position invariant
(MKL's dgemm), so a float64 model is not split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .quant import QuantizedWeight

ROW_TILE = 16
COL_TILE = 256  # the widest column tile; a weight of fewer rows takes the next power of two
MIN_COL_TILE = 32  # narrower calls are not column-invariant (measured: N below ~32)
DEQUANT_CHUNK_ELEMENTS = 1 << 22  # dequantize at most ~4M weights at a time


def pad_rows(x: torch.Tensor, tile: int = ROW_TILE) -> torch.Tensor:
    """[M, ...] -> [ceil(M/tile)*tile, ...] with zero rows appended."""
    extra = (-x.shape[0]) % tile
    if extra == 0:
        return x
    return torch.cat([x, x.new_zeros((extra, *x.shape[1:]))])


def col_tile(rows: int) -> int:
    """The column tile of a weight of `rows` output rows (of the whole weight, on a split rank:
    every rank then makes the whole model's calls)."""
    return min(COL_TILE, max(MIN_COL_TILE, 1 << max(0, rows - 1).bit_length()))


def matmul_rows(
    x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, tile: int = COL_TILE
) -> torch.Tensor:
    """x [M, K] @ w[N, K]ᵀ -> [M, N], one fixed-shape call per tile of rows and tile of columns."""
    m, n = x.shape[0], w.shape[0]
    xp = pad_rows(x)
    if out is None:
        out = x.new_empty((m, n))
    for c0 in range(0, n, tile):
        c1 = min(c0 + tile, n)
        wt = pad_rows(w[c0:c1], tile).t()
        for start in range(0, m, ROW_TILE):
            stop = min(start + ROW_TILE, m)
            out[start:stop, c0:c1] = torch.mm(xp[start : start + ROW_TILE], wt)[
                : stop - start, : c1 - c0
            ]
    return out


def matmul_packed_rows(x: torch.Tensor, w: QuantizedWeight, tile: int = COL_TILE) -> torch.Tensor:
    """x [M, K] @ dequantize(w)ᵀ: the weight dequantized to x's dtype in chunks of output rows
    (the chunk depends on (N, K) alone), each chunk through `matmul_rows`."""
    n, k = w.shape
    chunk = max(1, min(n, DEQUANT_CHUNK_ELEMENTS // k))
    out = x.new_empty((x.shape[0], n))
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        out[:, start:stop] = matmul_rows(x, w.rows(start, stop, x.dtype), tile=tile)
    return out


@dataclass(frozen=True)
class Partial:
    """A product's output left as its K segments' fp32 sums [S, M, N] (the GPU's split form):
    the op that reads it adds them in segment order and rounds once to `dtype`, as the product's
    own sum would, so the sum costs no launch of its own (docs/exactness.md, 'Products')."""

    sums: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.sums.shape[1:])

    def view(self, *shape: int) -> Partial:
        """The output's rows seen as `shape`, as Tensor.view would (the segments kept apart)."""
        return Partial(self.sums.view(self.sums.shape[0], *shape), self.dtype)

    def split(self, sizes: list[int], dim: int = -1) -> tuple[Partial, ...]:
        """Column ranges of the output, as Tensor.split(sizes, dim=-1) cuts a product's."""
        if dim != -1:
            raise ValueError("a Partial splits along its last dimension only")
        return tuple(Partial(part, self.dtype) for part in self.sums.split(sizes, dim=-1))
