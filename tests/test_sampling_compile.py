"""CPU: the batched sampling kernels compile for Hopper (no card needed): their fp64 sums and
the values carried through the branches keep their types. Their tokens are checked in the Triton
interpreter (tests/triton_interpret_check.py) and on the card by the GPU tests' sampled
requests."""

import pytest

triton = pytest.importorskip("triton")
sampling = pytest.importorskip("tensorfold.ops.triton.sampling")
from hopper import compile_for_hopper  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

FIGURES = dict(
    keys_ptr="*fp32", rule_ptr="*fp64", runs_ptr="*fp64", fig_ptr="*fp64", B="i32", V="i32", C="i32"
)
CHOOSE = dict(
    keys_ptr="*fp32",
    idx_ptr="*i64",
    runs_ptr="*fp64",
    fig_ptr="*fp64",
    rule_ptr="*fp64",
    out_ptr="*i64",
    B="i32",
    V="i32",
    C="i32",
)


@pytest.mark.parametrize(
    "kernel, signature, constexprs",
    [
        (sampling._chunk_figures, FIGURES, {"CHUNK": sampling.CHUNK}),
        (sampling._choose, CHOOSE, {"CHUNK": sampling.CHUNK, "CP": 64}),
    ],
    ids=["chunk_figures", "choose"],
)
def test_the_sampling_kernels_compile_for_hopper(kernel, signature, constexprs):
    signature = dict(signature, **{name: "constexpr" for name in constexprs})
    src = ASTSource(kernel, signature, constexprs=constexprs, attrs={})
    ptx = compile_for_hopper(src, num_warps=sampling.WARPS).asm["ptx"]
    assert f".entry {kernel.fn.__name__}" in ptx and "ld.global" in ptx and "st.global" in ptx
