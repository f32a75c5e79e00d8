"""CPU: the layers' fused kernels compile for Hopper in every form a pass runs (tests/hopper.py):
the GDN conv in one launch and in two, the recurrence with its gates given and computed inside,
the gates' kernel and the gated norm (each reading the in-projection stored or as its segments'
sums), the MoE routing and weighted sum (the router's output likewise), the key norm + rotary
with and without the KV rows' write, the q and k norms in one launch, and the attention with its
gate stored or summed. Their bits are checked under Triton's interpreter and on the card."""

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from hopper import assert_waits_first, compile_for_hopper  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tensorfold.ops.triton import (  # noqa: E402
    attention,
    conv,
    gated_delta,
    gates,
    linear,
    moe_rows,
    norm,
)

CONV = dict(
    x_ptr="*bf16", st_ptr="*bf16", w_ptr="*bf16", y_ptr="*bf16", slots_ptr="*i64",
    writes_ptr="*i64", taps_ptr="*i64", keep_ptr="*i64", cu_ptr="*i64",
)  # fmt: skip


def _ptx(fn, pointers: dict, consts: dict, warps: int = 4) -> str:
    """fn's PTX for sm_90: its constexprs from `consts`, other arguments typed by `pointers`
    (i32 when not named), launched as a card with dependent launch does."""
    consts = {**consts, "PDL": True}
    sig = {a: "constexpr" if a in consts else pointers.get(a, "i32") for a in fn.arg_names}
    return compile_for_hopper(ASTSource(fn, sig, consts), num_warps=warps).asm["ptx"]


@pytest.mark.parametrize("nseg", [0, 3])
@pytest.mark.parametrize(
    "kernel,rows", [("_conv_lane", 1), ("_conv_lane", 8), ("_conv_rows", 1), ("_conv_keep", 1)]
)
def test_the_conv_compiles_for_hopper_in_one_launch_and_in_two(kernel, rows, nseg):
    """nseg 3: its input the in-projection's segment sums (fp32), added where read; the one
    launch's tile of a lane's rows for a decode pass (1) and a verify pass (8)."""
    fn = getattr(conv, kernel)
    block = conv.LANE_BLOCK if kernel == "_conv_lane" else conv.CONV_BLOCK
    consts = dict(KS=4, HIST=3, HIST_P2=4, BLOCK=block, NSEG=nseg, ROWS=rows)
    consts = {a: v for a, v in consts.items() if a in fn.arg_names}
    pointers = {**CONV, "x_ptr": "*fp32" if nseg else "*bf16"}
    assert_waits_first(_ptx(fn, pointers, consts, warps=2))


def _recurrence_ptx(raw: bool, nseg: int = 0) -> str:
    fn = gated_delta._recurrence
    gate = "*fp32" if nseg or not raw else "*bf16"
    pointers = dict(g_ptr=gate, beta_ptr="*fp32" if nseg else "*bf16")
    pointers.update(alog_ptr="*fp32", dt_ptr="*bf16")
    pointers.update({a: "*bf16" for a in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")})
    pointers.update(h_ptr="*fp32", slot_ptr="*i64", out_ptr="*i64", cu_ptr="*i64", scale="fp32")
    consts = dict(HK=16, HV=32, K=128, V=128, BV=16, BLOCKS_FIRST=True, RAW=raw, NSEG=nseg)
    return _ptx(fn, pointers, consts, warps=1)


def test_the_recurrence_compiles_for_hopper_with_its_gates_given_or_computed():
    given, inside, summed = _recurrence_ptx(False), _recurrence_ptx(True), _recurrence_ptx(True, 3)
    assert_waits_first(given) and assert_waits_first(inside) and assert_waits_first(summed)
    # the decay's and beta's exponentials join the state's decay in the kernel
    assert given.count("ex2.approx") < inside.count("ex2.approx")
    # the gates' inputs read as three segments' sums: more loads than as stored
    assert inside.count("ld.global") < summed.count("ld.global")


@pytest.mark.parametrize("nseg", [0, 3])
def test_the_gates_and_the_gated_norm_compile_for_hopper_stored_or_summed(nseg):
    read = "*fp32" if nseg else "*bf16"
    pointers = dict(a_ptr=read, b_ptr=read, alog_ptr="*fp32", dt_ptr="*bf16", g_ptr="*fp32")
    pointers.update(beta_ptr="*bf16")
    assert_waits_first(_ptx(gates._gates, pointers, dict(H=32, NSEG=nseg, BLOCK=32), warps=1))
    pointers = dict(x_ptr="*bf16", z_ptr=read, w_ptr="*fp32", y_ptr="*bf16", eps="fp32")
    assert_waits_first(_ptx(norm._gated_kernel, pointers, dict(W=128, NSEG=nseg, BLOCK=128)))


@pytest.mark.parametrize("nseg", [0, 3])
def test_the_moe_routing_and_sum_compile_for_hopper_stored_or_summed(nseg):
    read = "*fp32" if nseg else "*bf16"
    pointers = dict(logits_ptr=read, ids_ptr="*i64", w_ptr="*fp32")
    consts = dict(TOP_K=8, LAST=-1, BLOCK_E=256, PRECISE=True, NSEG=nseg, OUT=tl.bfloat16)
    assert_waits_first(_ptx(moe_rows._route_kernel, pointers, consts))
    pointers = dict(routed_ptr="*bf16", w_ptr="*fp32", shared_ptr="*bf16", logit_ptr=read)
    pointers.update(out_ptr="*bf16")
    consts = dict(TOP_K=8, BLOCK=1024, PRECISE=True, NSEG=nseg)
    assert_waits_first(_ptx(moe_rows._combine_kernel, pointers, consts))


def _key_norm_ptx(cache: bool, nseg: int = 0) -> str:
    fn = norm._norm_rope_kernel
    read = "*fp32" if nseg else "*bf16"
    pointers = dict(x_ptr=read, w_ptr="*fp32", cos_ptr="*fp32", sin_ptr="*fp32", y_ptr="*bf16")
    pointers.update(rows_ptr="*i64", v_ptr=read, vout_ptr="*bf16", eps="fp32", offset="fp32")
    consts = dict(H=4, D=256, ROT=64, CACHE=cache, NSEG=nseg)
    if not cache:
        consts.update(rows_ptr=None, v_ptr=None, vout_ptr=None, stride_vrow=0)
    return _ptx(fn, pointers, consts)


@pytest.mark.parametrize("nseg", [0, 3])
def test_the_key_norm_compiles_for_hopper_with_and_without_the_kv_write(nseg):
    """nseg 3: q, k and v read as their product's segment sums."""
    alone, cached = _key_norm_ptx(False, nseg), _key_norm_ptx(True, nseg)
    assert_waits_first(alone) and assert_waits_first(cached)
    # the values' copy and the slot's load join the keys' store
    assert alone.count("st.global") < cached.count("st.global")
    assert alone.count("ld.global") < cached.count("ld.global")
    if nseg:  # three segments' loads where one load was
        assert _key_norm_ptx(True).count("ld.global") < cached.count("ld.global")


@pytest.mark.parametrize("nseg", [0, 3])
def test_the_q_and_k_norms_compile_for_hopper_in_one_launch(nseg):
    read = "*fp32" if nseg else "*bf16"
    pointers = dict(q_ptr=read, k_ptr=read, v_ptr=read, rows_ptr="*i64", eps="fp32", offset="fp32")
    pointers.update({a: "*fp32" for a in ("wq_ptr", "wk_ptr", "cos_ptr", "sin_ptr")})
    pointers.update({a: "*bf16" for a in ("yq_ptr", "kc_ptr", "vc_ptr")})
    consts = dict(HQ=16, HKV=4, D=256, ROT=64, NSEG=nseg)
    one = _ptx(norm._qk_rope_kernel, pointers, consts)
    assert_waits_first(one)
    assert one.count("st.global") > _key_norm_ptx(True, nseg).count("st.global")


@pytest.mark.parametrize("gseg", [0, 3])
@pytest.mark.parametrize("kernel", ["_serial_kernel", "_split_kernel", "_fold_kernel"])
def test_the_attention_compiles_for_hopper_its_gate_stored_or_summed(kernel, gseg):
    fn = getattr(attention, kernel)
    pointers = {a: "*bf16" for a in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")}
    pointers.update(g_ptr="*fp32" if gseg else "*bf16", part_ptr="*fp32", ml_ptr="*fp32")
    pointers.update({a: "*i32" for a in ("row0_ptr", "rows_ptr", "pos0_ptr", "base_ptr")})
    pointers.update(table_ptr="*i32", scale="fp32")
    consts = dict(GROUP=4, D=256, BLOCK_M=16, BLOCK_N=64, COLS=64, SUPER=256, GATED=True)
    consts.update(FAULT=0, CHUNK=4, GSEG=gseg)
    consts = {a: v for a, v in consts.items() if a in fn.arg_names}
    assert_waits_first(_ptx(fn, pointers, consts))


@pytest.mark.parametrize("split", [True, False])
def test_the_one_row_product_waits_before_it_reads(split):
    """The packed product a decode step runs most (the swapped form, pipelined over its K steps)
    and the segments' sum: the dependent-launch wait comes before any load, the pipeline's
    prologue included."""
    pointers = dict(x_ptr="*bf16", w_ptr="*i32", s_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16")
    pointers.update(p_ptr="*fp32")
    consts = dict(BITS=4, GROUP=64, GROUPS=64, SEG=1024, NSEG=4, SPLIT=split)
    consts.update(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128)
    assert_waits_first(_ptx(linear._affine_swapped_kernel, pointers, consts))
    sums = dict(p_ptr="*fp32", y_ptr="*bf16")
    assert_waits_first(_ptx(linear._sum_segments, sums, dict(NSEG=4, BLOCK=1024)))
