"""A projection split by output rows across the ranks of a tensor split."""

from __future__ import annotations

import torch

from ..ops.collective import Group
from .linear import Linear, Weight


class RowSplit(Linear):
    """This rank's output rows of a projection, the whole K on each rank: y = gather(x Wᵣᵀ).

    With `gather_input`, the input arrives as this rank's columns of a split activation (heads,
    the MLP's inner width) and is gathered first, so every rank multiplies the whole K. The
    output columns are gathered in rank order: every rank then holds the whole output, each
    value computed by one rank alone with the whole model's arithmetic (ops/linear.py)."""

    def __init__(
        self,
        weight: Weight,
        dtype: torch.dtype,
        group: Group,
        gather_input: bool,
        book=None,
        widths: tuple[int, ...] | None = None,
        input_widths: tuple[int, ...] | None = None,
    ) -> None:
        """`widths`: every rank's output rows (None: this rank's on each); `input_widths`: every
        rank's columns of a gathered input (None: equal)."""
        whole = sum(widths) if widths is not None else weight.shape[0] * group.world
        super().__init__(weight, dtype, book, whole)
        self.group, self.gather_input = group, gather_input
        self.widths, self.input_widths = widths, input_widths

    def __call__(self, x: torch.Tensor, partial: bool = False) -> torch.Tensor:
        """The whole output on every rank (never a Partial: the gather needs the values)."""
        if self.gather_input:
            x = self.group.gather_cols(x, self.input_widths)
        return self.group.gather_cols(super().__call__(x), self.widths)
