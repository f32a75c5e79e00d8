"""Linear layers and embeddings over dense or MLX-affine packed weights.

Every weight carries its reduction plan, chosen from its own (N, K) alone: the output rows
are produced in fixed chunks (the dequantization unit for packed weights) and every chunk
goes through `matmul_rows`, whose calls have one fixed shape. So any number of rows, in any
order, gets the same bits per row.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..ops.linear import matmul_rows
from ..ops.quant import dequantize

DEQUANT_CHUNK_ELEMENTS = 1 << 22   # dequantize at most ~4M weights at a time


@dataclass(frozen=True)
class QuantizedWeight:
    """An MLX affine weight kept packed: [N, K*bits/32] words, [N, K/gs] scales and biases."""

    packed: torch.Tensor
    scales: torch.Tensor
    biases: torch.Tensor
    bits: int
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.packed.shape[1] * 32 // self.bits

    def rows(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(self.packed[start:stop], self.scales[start:stop], self.biases[start:stop],
                          self.bits, self.group_size, dtype)

    def take(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        words = self.packed.view(torch.int32)       # CUDA cannot index uint32 tensors
        return dequantize(words[ids], self.scales[ids], self.biases[ids], self.bits, self.group_size, dtype)

    @property
    def device(self) -> torch.device:
        return self.packed.device

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales, self.biases))

    def to(self, device: torch.device) -> "QuantizedWeight":
        return QuantizedWeight(self.packed.to(device), self.scales.to(device), self.biases.to(device),
                               self.bits, self.group_size)


Weight = torch.Tensor | QuantizedWeight


class Linear:
    """y = x Wᵀ (no bias anywhere in Qwen3.5)."""

    def __init__(self, weight: Weight, dtype: torch.dtype, book=None) -> None:
        self.weight = weight
        self.dtype = dtype
        self.book = book          # ops.triton.linear.TileBook shared by the model's layers (GPU)
        self.inexact = False      # benchmarks only: cuBLAS for bf16 weights (its small-M path splits K)
        n, k = weight.shape
        self.out_features, self.in_features = n, k
        self.chunk = n if isinstance(weight, torch.Tensor) else max(1, min(n, DEQUANT_CHUNK_ELEMENTS // k))
        self.plan = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            return self._gpu(x)
        if isinstance(self.weight, torch.Tensor):
            return matmul_rows(x, self.weight)
        out = x.new_empty((x.shape[0], self.out_features))
        for start in range(0, self.out_features, self.chunk):
            stop = min(start + self.chunk, self.out_features)
            out[:, start:stop] = matmul_rows(x, self.weight.rows(start, stop, self.dtype))
        return out

    def _gpu(self, x: torch.Tensor) -> torch.Tensor:
        from ..ops.triton.linear import LinearPlan, affine_matmul, candidates, dense_matmul, rows_class
        w = self.weight
        packed = isinstance(w, QuantizedWeight)
        if self.plan is None:
            self.plan = LinearPlan.for_weight(self.out_features, self.in_features, w.group_size if packed else None)
        x = x.contiguous()
        if self.inexact and not packed:
            return F.linear(x, w)
        if packed:
            run = lambda t: affine_matmul(x, w.packed, w.scales, w.biases, w.bits, w.group_size, self.plan, tiles=t)  # noqa: E731
            fmt = (w.bits, w.group_size)
        else:
            run = lambda t: dense_matmul(x, w, self.plan, tiles=t)  # noqa: E731
            fmt = (str(w.dtype),)
        m = x.shape[0]
        if self.book is None:
            return run(candidates(m, packed)[0])
        key = (rows_class(m), self.out_features, self.in_features, *fmt)
        return run(self.book.pick(key, m, packed, run))

    @property
    def nbytes(self) -> int:
        w = self.weight
        return w.nbytes if isinstance(w, QuantizedWeight) else w.numel() * w.element_size()


class Embedding:
    """Token ids -> rows of the table; a packed table is dequantized row by row on lookup."""

    def __init__(self, weight: Weight, dtype: torch.dtype, book=None) -> None:
        self.weight = weight
        self.dtype = dtype
        self.book = book          # ops.triton.linear.TileBook shared by the model's layers (GPU)
        self.inexact = False      # benchmarks only: cuBLAS for bf16 weights (its small-M path splits K)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.weight, torch.Tensor):
            return F.embedding(ids, self.weight)
        return self.weight.take(ids, self.dtype)

    def as_linear(self, book=None) -> Linear:
        """The tied output head: the same table, used as a projection."""
        return Linear(self.weight, self.dtype, book)


@dataclass(frozen=True)
class Joined:
    """Projections of one input. Called, returns their outputs: from one product over the
    concatenated weights when they could be merged (`whole`), else from each projection."""

    parts: tuple[Linear, ...]
    whole: Linear | None = None

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.whole is None:
            return tuple(lin(x) for lin in self.parts)
        return self.whole(x).split([lin.out_features for lin in self.parts], dim=-1)


def join(linears: list[Linear], merge: bool | None = None) -> Joined:
    """Several projections of the same input as one product (by default on the GPU only, where a
    launch costs more than the CPU's per-tile products): their weights are concatenated along N and
    each projection's weight becomes a view of its rows, so nothing is held twice. A column's bits
    do not change: the reduction plan depends on K alone. Weights of different formats (a mixed-bit
    file) stay separate products."""
    ws = [lin.weight for lin in linears]
    first = ws[0]
    if merge is None:
        merge = first.device.type == "cuda"
    if not merge or len({lin.in_features for lin in linears}) != 1:
        return Joined(tuple(linears))
    if all(isinstance(w, torch.Tensor) for w in ws):
        whole = torch.cat(ws)
        parts = [whole[a:b] for a, b in _bounds(ws)]
    elif all(isinstance(w, QuantizedWeight) and (w.bits, w.group_size) == (first.bits, first.group_size)
             for w in ws):
        packed, scales, biases = (torch.cat([getattr(w, f) for w in ws]) for f in ("packed", "scales", "biases"))
        whole = QuantizedWeight(packed, scales, biases, first.bits, first.group_size)
        parts = [QuantizedWeight(packed[a:b], scales[a:b], biases[a:b], first.bits, first.group_size)
                 for a, b in _bounds(ws)]
    else:
        return Joined(tuple(linears))
    for lin, part in zip(linears, parts):
        lin.weight = part
    return Joined(tuple(linears), Linear(whole, linears[0].dtype, linears[0].book))


def _bounds(ws) -> list[tuple[int, int]]:
    out, start = [], 0
    for w in ws:
        out.append((start, start + w.shape[0]))
        start += w.shape[0]
    return out
