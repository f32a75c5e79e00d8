"""Linear layers and embeddings over dense or MLX-affine packed weights.

A product's reduction plan follows the weight's own (N, K) alone, on the CPU (fixed row tiles,
fixed dequantization chunks) and on the GPU (fixed K segments): any number of rows, in any
order, gets the same bits per row (docs/exactness.md, 'Products').
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..ops import dispatch as op
from ..ops.linear import Partial, col_tile
from ..ops.quant import QuantizedWeight

Weight = torch.Tensor | QuantizedWeight


class Linear:
    """y = x Wᵀ (no bias anywhere in Qwen3.5)."""

    def __init__(
        self, weight: Weight, dtype: torch.dtype, book=None, whole_rows: int | None = None
    ) -> None:
        self.weight = weight
        self.dtype = dtype
        self.book = book  # ops.triton.linear.TileBook shared by the model's layers (GPU)
        self.out_features, self.in_features = weight.shape
        # The CPU's column tile follows the whole weight's rows, also on a rank holding a part.
        self.tile = col_tile(whole_rows or self.out_features)

    def __call__(self, x: torch.Tensor, partial: bool = False) -> torch.Tensor | Partial:
        """`partial`: the GPU's split form may leave its segment sums to the op that reads the
        output (`rms_norm`'s residual add, `silu_mul`), which adds them in order."""
        return op.linear(x, self.weight, self.book, self.tile, partial)


class Embedding:
    """Token ids -> rows of the table; a packed table is dequantized row by row on lookup."""

    def __init__(self, weight: Weight, dtype: torch.dtype) -> None:
        self.weight = weight
        self.dtype = dtype

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.weight, torch.Tensor):
            return F.embedding(ids, self.weight)
        return self.weight.take(ids, self.dtype)

    def as_linear(self, book=None) -> Linear:
        """The tied output head: the same table, used as a projection."""
        return Linear(self.weight, self.dtype, book)


@dataclass(frozen=True)
class Joined:
    """Projections of one input. Called, returns their outputs in order: from one product per
    `products` entry (a product over the concatenated weights of the parts it names, or a part
    alone), else, with no products, from each projection."""

    parts: tuple[Linear, ...]
    products: tuple[tuple[Linear, tuple[int, ...]], ...] = ()

    @property
    def merged(self) -> Linear | None:
        """The one product of all the parts, when they were merged into one."""
        if len(self.products) == 1 and len(self.products[0][1]) == len(self.parts) > 1:
            return self.products[0][0]
        return None

    def __call__(self, x: torch.Tensor, partial: bool = False) -> tuple:
        if not self.products:
            return tuple(lin(x, partial) for lin in self.parts)
        out: list = [None] * len(self.parts)
        for lin, held in self.products:
            y = lin(x, partial)
            sizes = [self.parts[i].out_features for i in held]
            ys = y.split(sizes) if isinstance(y, Partial) else y.split(sizes, dim=-1)
            for i, y in zip(held, ys):
                out[i] = y
        return tuple(out)


def join(linears: list[Linear], merge: bool | None = None) -> Joined:
    """Several projections of the same input as few products (by default on the GPU only, where a
    launch costs more than the CPU's per-tile products): the weights of each format are
    concatenated along N, in order, and each projection's weight becomes a view of its rows, so
    nothing is held twice. A mixed-bit file's projections of one width are one product, those of
    another width another. A column's bits do not change: the reduction plan depends on K and the
    format alone."""
    if merge is None:
        merge = linears[0].weight.device.type == "cuda"
    if not merge or len({lin.in_features for lin in linears}) != 1:
        return Joined(tuple(linears))
    groups: dict[tuple, list[int]] = {}
    for i, lin in enumerate(linears):  # a split's gathered projection (a subclass) stays alone
        key = _format(lin.weight) if type(lin) is Linear else ("alone", i)
        groups.setdefault(key, []).append(i)
    products = []
    for held in groups.values():
        parts = [linears[i] for i in held]
        products.append((_merge(parts) if len(parts) > 1 else parts[0], tuple(held)))
    return Joined(tuple(linears), tuple(products))


def _format(w) -> tuple:
    """What two weights must share to be one product: their kind, dtype and packing."""
    if isinstance(w, QuantizedWeight):
        return ("packed", w.bits, w.group_size, w.packed.dtype, w.scales.dtype, w.biases.dtype)
    return ("dense", w.dtype)


def _merge(linears: list[Linear]) -> Linear:
    """One projection over the concatenated weights of `linears` (one format); each keeps a view of
    its rows."""
    ws = [lin.weight for lin in linears]
    first = ws[0]
    if isinstance(first, QuantizedWeight):
        packed, scales, biases = (
            torch.cat([getattr(w, f) for w in ws]) for f in ("packed", "scales", "biases")
        )
        merged = QuantizedWeight(packed, scales, biases, first.bits, first.group_size)
        parts = [
            QuantizedWeight(packed[a:b], scales[a:b], biases[a:b], first.bits, first.group_size)
            for a, b in _bounds(ws)
        ]
    else:
        merged = torch.cat(ws)
        parts = [merged[a:b] for a, b in _bounds(ws)]
    for lin, part in zip(linears, parts):
        lin.weight = part
    return Linear(merged, linears[0].dtype, linears[0].book)


def _bounds(ws) -> list[tuple[int, int]]:
    out, start = [], 0
    for w in ws:
        out.append((start, start + w.shape[0]))
        start += w.shape[0]
    return out


def product_linears(owner) -> list[Linear]:
    """The projections of `owner` (a layer's mixer or MLP) that its passes multiply by: a joined
    product in place of the parts it holds, every other projection as it is."""
    joined = [v for v in vars(owner).values() if isinstance(v, Joined)]
    held = {id(j.parts[i]) for j in joined for _, ids in j.products for i in ids}
    out = [lin for j in joined for lin, _ in j.products]
    return out + [v for v in vars(owner).values() if isinstance(v, Linear) and id(v) not in held]
