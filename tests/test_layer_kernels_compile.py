"""CPU: the layers' fused kernels compile for Hopper in every form a pass runs (tests/hopper.py):
the GDN conv in one launch and in two, the recurrence with its gates given and computed inside,
and the key norm + rotary with and without the KV rows' write. Their bits are checked under
Triton's interpreter and on the card."""

import pytest

triton = pytest.importorskip("triton")
from hopper import compile_for_hopper  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tensorfold.ops.triton import conv, gated_delta, norm  # noqa: E402

CONV = dict(
    x_ptr="*bf16", st_ptr="*bf16", w_ptr="*bf16", y_ptr="*bf16", slots_ptr="*i64",
    writes_ptr="*i64", taps_ptr="*i64", keep_ptr="*i64", cu_ptr="*i64", C="i32",
    LANES_HIST="i32", stride_slot="i32", stride_x="i32", KS="constexpr", HIST="constexpr",
    HIST_P2="constexpr", BLOCK="constexpr",
)  # fmt: skip


@pytest.mark.parametrize("kernel", ["_conv_lane", "_conv_rows", "_conv_keep"])
def test_the_conv_compiles_for_hopper_in_one_launch_and_in_two(kernel):
    fn = getattr(conv, kernel)
    sig = {a: CONV[a] for a in fn.arg_names}
    consts = {a: v for a, v in dict(KS=4, HIST=3, HIST_P2=4, BLOCK=256).items() if a in sig}
    assert compile_for_hopper(ASTSource(fn, sig, consts), num_warps=2).asm["ptx"]


def _recurrence_ptx(raw: bool) -> str:
    fn = gated_delta._recurrence
    gate = "*bf16" if raw else "*fp32"
    pointers = dict(g_ptr=gate, beta_ptr="*bf16", alog_ptr="*fp32", dt_ptr="*bf16")
    pointers.update({a: "*bf16" for a in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")})
    pointers.update(h_ptr="*fp32", slot_ptr="*i64", out_ptr="*i64", cu_ptr="*i64", scale="fp32")
    consts = dict(HK=16, HV=32, K=128, V=128, BV=16, BLOCKS_FIRST=True, RAW=raw)
    sig = {a: "constexpr" if a in consts else pointers.get(a, "i32") for a in fn.arg_names}
    return compile_for_hopper(ASTSource(fn, sig, consts), num_warps=1).asm["ptx"]


def test_the_recurrence_compiles_for_hopper_with_its_gates_given_or_computed():
    given, inside = _recurrence_ptx(False), _recurrence_ptx(True)
    # the decay's and beta's exponentials join the state's decay in the kernel
    assert given.count("ex2.approx") < inside.count("ex2.approx")


def _key_norm_ptx(cache: bool) -> str:
    fn = norm._norm_rope_kernel
    pointers = dict(x_ptr="*bf16", w_ptr="*fp32", cos_ptr="*fp32", sin_ptr="*fp32", y_ptr="*bf16")
    pointers.update(rows_ptr="*i64", v_ptr="*bf16", vout_ptr="*bf16", eps="fp32", offset="fp32")
    consts = dict(H=4, D=256, ROT=64, CACHE=cache)
    if not cache:
        consts.update(rows_ptr=None, v_ptr=None, vout_ptr=None, stride_vrow=0)
    sig = {a: "constexpr" if a in consts else pointers.get(a, "i32") for a in fn.arg_names}
    return compile_for_hopper(ASTSource(fn, sig, consts), num_warps=4).asm["ptx"]


def test_the_key_norm_compiles_for_hopper_with_and_without_the_kv_write():
    alone, cached = _key_norm_ptx(False), _key_norm_ptx(True)
    # the values' copy and the slot's load join the keys' store
    assert alone.count("st.global") < cached.count("st.global")
    assert alone.count("ld.global") < cached.count("ld.global")
