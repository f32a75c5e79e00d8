"""The Triton interpreter with bounds: every load, store and atomic a kernel makes (its masked-off
lanes aside) must land inside one of the tensors passed to that launch, as a whole element.

On the CPU an interpreted kernel reads host memory through raw pointers, so an address past a
tensor reads a neighbour's bytes or nothing at all and the run goes on; on a card the same
address is an illegal memory access. With this installed the interpreted checks raise
OutOfBounds at the first such address, naming it and the tensors the launch had."""

import numpy as np
from triton.runtime import interpreter


class OutOfBounds(AssertionError):
    """A kernel touched memory outside every tensor of its launch."""


def _extent(t) -> tuple[int, int]:
    """[first byte, last byte + 1) of a tensor view's elements."""
    if t.numel() == 0:
        return (t.data_ptr(), t.data_ptr())
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return (t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size())


def install() -> None:
    """Every later interpreted launch checks its addresses against its own tensors."""
    ranges: list[tuple[int, int]] = []
    init = interpreter.GridExecutor._init_args_hst

    def init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = init(self, args_dev, kwargs)
        ranges.clear()
        flat = list(args_hst) + list(kwargs_hst.values())
        while flat:
            a = flat.pop()
            if isinstance(a, tuple):
                flat.extend(a)
            elif hasattr(a, "data_ptr"):
                ranges.append(_extent(a))
        return args_hst, kwargs_hst

    def check(ptrs, mask, what: str) -> None:
        addr = np.asarray(ptrs.data, dtype=np.uint64)
        if mask is not None:
            addr = addr[np.broadcast_to(np.asarray(mask.data, dtype=bool), addr.shape)]
        size = np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize
        ok = np.zeros(addr.shape, dtype=bool)
        for lo, hi in ranges:
            ok |= (addr >= lo) & (addr + size <= hi)
        if not ok.all():
            bad = int(addr[~ok].ravel()[0])
            near = ", ".join(f"[{lo:#x}, {hi:#x})" for lo, hi in sorted(ranges))
            raise OutOfBounds(
                f"{what} of {int((~ok).sum())} elements outside the launch's "
                f"tensors, first at {bad:#x}; tensors: {near}"
            )

    builder = interpreter.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store
    rmw, cas = builder.create_atomic_rmw, builder.create_atomic_cas

    def masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        check(ptrs, mask, "load")
        return load(self, ptrs, mask, other, cache_policy, is_volatile)

    def masked_store(self, ptrs, value, mask, cache_policy):
        check(ptrs, mask, "store")
        return store(self, ptrs, value, mask, cache_policy)

    def atomic_rmw(self, op, ptr, val, mask, sem, scope):
        check(ptr, mask, "atomic")
        return rmw(self, op, ptr, val, mask, sem, scope)

    def atomic_cas(self, ptr, cmp, val, sem, scope):
        check(ptr, None, "atomic cas")
        return cas(self, ptr, cmp, val, sem, scope)

    interpreter.GridExecutor._init_args_hst = init_args
    builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
    builder.create_atomic_rmw, builder.create_atomic_cas = atomic_rmw, atomic_cas
