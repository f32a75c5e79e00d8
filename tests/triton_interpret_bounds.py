"""Run under TRITON_INTERPRET=1 (by test_triton_interpret.py): the interpreter's bounds check
(interpreter_bounds.py) passes a kernel that stays inside its tensors and names, by
OutOfBounds, a load one element past its input, a store past its output, a masked-off stray
address left alone."""

import interpreter_bounds
import torch
import triton
import triton.language as tl


@triton.jit
def _shifted_copy(x_ptr, y_ptr, LOAD: tl.constexpr, STORE: tl.constexpr, MASK_LAST: tl.constexpr):
    r = tl.arange(0, 16)
    v = tl.load(x_ptr + r + LOAD, mask=r < 16 - MASK_LAST, other=0.0)
    tl.store(y_ptr + r + STORE, v)


def raises(load: int, store: int, mask_last: int = 0) -> str:
    x, y = torch.arange(16.0), torch.zeros(32)[:16]  # y: a view with room behind it
    try:
        _shifted_copy[(1,)](x, y, load, store, mask_last)
    except Exception as e:  # the interpreter wraps what the kernel raised
        return "OutOfBounds" if "OutOfBounds" in repr(e) else repr(e)
    return "none"


def main() -> None:
    interpreter_bounds.install()
    assert raises(0, 0) == "none"
    assert raises(1, 0) == "OutOfBounds"  # its last lane reads x[16]
    assert raises(0, 1) == "OutOfBounds"  # y[16] lies inside the storage, outside the view
    assert raises(1, 0, mask_last=1) == "none"  # the stray lane masked off
    print("bounds checked")


if __name__ == "__main__":
    main()
