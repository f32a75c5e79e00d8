"""Row-invariant matrix products.

On the CPU, BLAS picks its kernel (and so its summation order) from the shape of the call:
the same row multiplied alone or beside 6 others can round differently. Every product here
is therefore made of calls of one fixed shape: rows are cut into tiles of `ROW_TILE` (the
last tile zero-padded), so a row's bits never depend on how many rows share the pass or
where it sits among them. Measured: a fixed tile shape is position-invariant, varying M is not.
"""

from __future__ import annotations

import torch

from .quant import QuantizedWeight

ROW_TILE = 16
DEQUANT_CHUNK_ELEMENTS = 1 << 22  # dequantize at most ~4M weights at a time


def pad_rows(x: torch.Tensor, tile: int = ROW_TILE) -> torch.Tensor:
    """[M, ...] -> [ceil(M/tile)*tile, ...] with zero rows appended."""
    extra = (-x.shape[0]) % tile
    if extra == 0:
        return x
    return torch.cat([x, x.new_zeros((extra, *x.shape[1:]))])


def matmul_rows(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w[N, K]ᵀ -> [M, N], one fixed-shape call per tile of rows."""
    m = x.shape[0]
    xp = pad_rows(x)
    wt = w.t()
    if out is None:
        out = x.new_empty((m, w.shape[0]))
    for start in range(0, m, ROW_TILE):
        stop = min(start + ROW_TILE, m)
        out[start:stop] = torch.mm(xp[start : start + ROW_TILE], wt)[: stop - start]
    return out


def matmul_packed_rows(x: torch.Tensor, w: QuantizedWeight) -> torch.Tensor:
    """x [M, K] @ dequantize(w)ᵀ: the weight dequantized to x's dtype in chunks of output rows
    (the chunk depends on (N, K) alone), each chunk through `matmul_rows`."""
    n, k = w.shape
    chunk = max(1, min(n, DEQUANT_CHUNK_ELEMENTS // k))
    out = x.new_empty((x.shape[0], n))
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        out[:, start:stop] = matmul_rows(x, w.rows(start, stop, x.dtype))
    return out
