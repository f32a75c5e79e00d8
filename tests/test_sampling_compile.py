"""CPU: the batched sampling kernel compiles for Hopper (no card needed): its fp64 sums and the
loop-carried values keep their types. Its tokens are checked in the Triton interpreter
(tests/triton_interpret_check.py) and on the card by the GPU tests' sampled requests."""

import pytest

triton = pytest.importorskip("triton")
sampling = pytest.importorskip("tensorfold.ops.triton.sampling")
from triton.backends.compiler import GPUTarget  # noqa: E402
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
    try:
        ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    except FileNotFoundError as e:  # a Triton wheel without its bundled ptxas
        pytest.skip(f"no ptxas: {e}")
    ptx = ck.asm["ptx"]
    assert ".entry _choose" in ptx and "ld.global" in ptx and "st.global" in ptx
