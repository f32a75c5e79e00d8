"""The Triton interpreter's tl.dot with one fixed order of sums: the products of each K column
added to the accumulator in K order, element by element (the MMA chain's order on the card).

The interpreter's own dot is numpy's matmul, whose BLAS may sum in an order that follows the
matrix's shape on some CPUs, so two launch shapes of one product could differ in their last bits
on the CPU alone. The interpreted checks compare launch shapes bitwise; this keeps that
comparison about the kernels' own sums. Products of fp16 values are exact in fp32."""

import numpy as np
from triton.runtime import interpreter

_NUMPY_DOT = interpreter.InterpreterBuilder.create_dot


def _dot_in_k_order(self, a, b, d, input_precision, max_num_imprecise_acc):
    if not all(np.issubdtype(t.data.dtype, np.floating) for t in (a, b, d)):
        return _NUMPY_DOT(self, a, b, d, input_precision, max_num_imprecise_acc)
    x, y = a.data.astype(np.float32), b.data.astype(np.float32)
    terms = x[..., :, :, None] * y[..., None, :, :]  # [.., M, K, N], each product exact
    chain = np.concatenate([d.data.astype(np.float32)[..., :, None, :], terms], axis=-2)
    acc = np.add.accumulate(chain, axis=-2)[..., -1, :]  # one add at a time, in K order
    return interpreter.TensorHandle(acc.astype(d.data.dtype), d.dtype.scalar)


def install() -> None:
    """Every later interpreted tl.dot of float operands sums in K order."""
    interpreter.InterpreterBuilder.create_dot = _dot_in_k_order
