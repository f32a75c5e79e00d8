"""CPU: the grid form's one-launch kernel (ops/triton/gated_delta_grid.py), and the rows form's
(ops/triton/gated_delta_rows.py), compile for Hopper at
the 9B's layer shape in bf16, plain (one value block a program, or all four) and with each
planted control (tests/hopper.py; its bits are
checked under Triton's interpreter and on the card)."""

import pytest

triton = pytest.importorskip("triton")
from hopper import compile_for_hopper  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tensorfold.ops.triton import gated_delta_grid as grid  # noqa: E402
from tensorfold.ops.triton import gated_delta_rows as rows  # noqa: E402


@pytest.mark.parametrize(
    "fault, sub", [(0, 1), (0, 4), (grid.FAULT_TAIL_SOLVED, 1), (grid.FAULT_EARLY_STATE, 1)]
)
def test_grid_kernel_compiles_for_hopper(fault, sub):
    sig = dict(
        x_ptr="*bf16", g_ptr="*fp32", b_ptr="*bf16", tail_ptr="*bf16", tg_ptr="*fp32",
        rec_ptr="*fp32", o_ptr="*bf16", slots_ptr="*i64", tails_ptr="*i64", bounds_ptr="*i64",
        arrivals_ptr="*i32",
        eps="fp32", scale="fp32", HK="constexpr", HV="constexpr", DK="constexpr",
        DV="constexpr", BV="constexpr", SUB="constexpr", FAULT="constexpr",
    )  # fmt: skip
    consts = dict(HK=16, HV=32, DK=128, DV=128, BV=grid.BLOCK_V, SUB=sub, FAULT=fault)
    compiled = compile_for_hopper(ASTSource(grid._grid_chunks, sig, consts), grid.NUM_WARPS)
    assert "mma" in compiled.asm["ptx"]  # the chunk's products run on the tensor cores


@pytest.mark.parametrize("fault", [0, rows.FAULT_TAIL_SKIPPED, rows.FAULT_EARLY_STATE])
def test_rows_kernel_compiles_for_hopper(fault):
    sig = dict(
        x_ptr="*bf16", g_ptr="*fp32", b_ptr="*bf16", tail_ptr="*bf16", tg_ptr="*fp32",
        rec_ptr="*fp32", o_ptr="*bf16", slots_ptr="*i64", tails_ptr="*i64", bounds_ptr="*i64",
        arrivals_ptr="*i32",
        eps="fp32", scale="fp32", HK="constexpr", HV="constexpr", DK="constexpr",
        DV="constexpr", BV="constexpr", FAULT="constexpr",
    )  # fmt: skip
    consts = dict(HK=16, HV=32, DK=128, DV=128, BV=rows.BLOCK_V, FAULT=fault)
    compiled = compile_for_hopper(ASTSource(rows._row_chunks, sig, consts), rows.NUM_WARPS)
    assert "mma" in compiled.asm["ptx"]  # the 16-row tiles' products run on the tensor cores
