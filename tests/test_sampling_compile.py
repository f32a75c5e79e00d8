"""CPU: the batched sampling kernel compiles for Hopper (no card needed): its fp64 sums and the
loop-carried values keep their types. Its tokens are checked in the Triton interpreter
(tests/triton_interpret_check.py) and on the card by the GPU tests' sampled requests."""

import pytest

triton = pytest.importorskip("triton")
sampling = pytest.importorskip("tensorfold.ops.triton.sampling")
from hopper import compile_for_hopper  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

SIGNATURE = dict(
    vals_ptr="*fp64",
    idx_ptr="*i64",
    n_ptr="*i32",
    top_p_ptr="*fp64",
    min_p_ptr="*fp64",
    u_ptr="*fp64",
    out_ptr="*i64",
    V="i32",
    BLOCK="constexpr",
)


def test_the_sampling_kernel_compiles_for_hopper():
    src = ASTSource(sampling._choose, SIGNATURE, constexprs={"BLOCK": sampling.BLOCK}, attrs={})
    ptx = compile_for_hopper(src).asm["ptx"]
    assert ".entry _choose" in ptx and "ld.global" in ptx and "st.global" in ptx
