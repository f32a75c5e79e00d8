"""CPU: the kernels that add a product's segment sums inside the op that reads them (the
residual add + norm, silu · up) compile for Hopper in every form the registry runs: stored
inputs, segment sums, and both planted controls (tests/hopper.py; the bits are checked under
Triton's interpreter and on the card)."""

import pytest

triton = pytest.importorskip("triton")
from hopper import assert_waits_first, compile_for_hopper  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tensorfold.ops.triton import gates, norm  # noqa: E402


@pytest.mark.parametrize("fault", [0, 1, 2])
@pytest.mark.parametrize("nseg", [0, 4])
def test_fused_sum_readers_compile_for_hopper(nseg, fault):
    sums = "*fp32" if nseg else "*bf16"
    add_rms = dict(
        h_ptr="*bf16", d_ptr=sums, w_ptr="*fp32", hout_ptr="*bf16", y_ptr="*bf16",
        W="constexpr", eps="fp32", offset="fp32", stride_ds="i32", stride_dm="i32",
        NSEG="constexpr", BLOCK="constexpr", FAULT="constexpr", PDL="constexpr",
    )  # fmt: skip
    consts = dict(W=4096, NSEG=nseg, BLOCK=4096, FAULT=fault, PDL=True)
    assert_waits_first(
        compile_for_hopper(ASTSource(norm._add_rms_kernel, add_rms, consts)).asm["ptx"]
    )
    silu = dict(
        g_ptr=sums, u_ptr=sums, y_ptr="*bf16", W="i32", stride_g="i32", stride_u="i32",
        stride_sg="i32", stride_su="i32", NSEG="constexpr", BLOCK="constexpr", FAULT="constexpr",
        PDL="constexpr",
    )  # fmt: skip
    consts = dict(NSEG=nseg, BLOCK=2048, FAULT=fault, PDL=True)
    assert_waits_first(compile_for_hopper(ASTSource(gates._silu_mul, silu, consts)).asm["ptx"])
