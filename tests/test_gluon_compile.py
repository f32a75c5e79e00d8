"""CPU: the Gluon 4-, 5-, 6- and 8-bit few-row kernel compiled for Hopper (no card needed) keeps the properties its
bitwise equality rests on (docs/exactness.md, 'Products'): the dequantized tile reaches the MMA in
the operand layout of kWidth 2 with no shuffle or shared-memory round trip, and each 128-column
step issues its chained 16-column MMAs (eight at 4 bits, four at 5, 6 and 8). The bits themselves are checked on the card
(tests/test_gpu_products.py and the registry)."""

import re

import pytest

gluon_affine = pytest.importorskip(
    "tensorfold.ops.triton.gluon_affine", reason="needs a Triton with Gluon"
)
triton = pytest.importorskip("triton")
from hopper import assert_waits_first, compile_for_hopper, spill_bytes  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

SIGNATURE = dict(
    x_ptr="*bf16",
    w_ptr="*i32",
    s_ptr="*bf16",
    b_ptr="*bf16",
    p_ptr="*fp32",
    M="i32",
    N="i32",
    K="i32",
    stride_x="i32",
    stride_w="i32",
    stride_s="i32",
)


def _compile(
    group: int,
    mt: int,
    fault: int = 0,
    bits: int = 4,
    staged: bool = False,
    warps: int = 4,
    ring: bool = False,
    deep: bool = False,
):
    consts = gluon_affine.constants(bits, group, 1024, mt, warps, staged, ring, fault, deep=deep)
    consts["PDL"] = True  # as launched on a card with dependent launch
    sig = {**SIGNATURE, **{k: "constexpr" for k in consts}}
    aligned = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 8, 9, 10)}
    src = GluonASTSource(gluon_affine._affine_swapped, sig, consts, aligned)
    return compile_for_hopper(src, num_warps=warps)


@pytest.mark.parametrize(
    "bits,group,mt",
    [(4, 32, 16), (4, 64, 8), (4, 64, 16), (4, 128, 16), (8, 32, 8), (8, 128, 16)]
    + [(5, 32, 16), (5, 64, 8), (6, 32, 8), (6, 64, 16), (6, 128, 16)],
)
def test_tile_reaches_the_mma_without_a_shuffle(bits, group, mt):
    ck = _compile(group, mt, bits=bits)
    _assert_register_path(ck, bits, mt)
    assert_waits_first(ck.asm["ptx"])


@pytest.mark.parametrize("bits,mt", [(4, 32), (4, 64), (5, 64), (6, 32), (8, 64)])
def test_many_lanes_take_the_same_path_in_each_warpgroup(bits, mt):
    """17-64 rows (many decoding lanes), 8 warps: each warpgroup issues the one-warpgroup chain
    over its own 64 weight rows, so neither the rows' tile nor the warps change a step's MMAs."""
    _assert_register_path(_compile(64, mt, bits=bits, warps=8), bits, mt)


@pytest.mark.parametrize("bits,warps", [(4, 4), (4, 8), (8, 4), (8, 8), (5, 4), (6, 8)])
def test_many_rows_pieces_take_the_same_path_with_a_wider_narrow_side(bits, warps):
    """65-512 rows on pieces of 128 (offered to 128 rows, untried past): the ring form's weight
    tile and chain of MMAs at m64n128, the rows' ring within a block's shared memory, nothing
    spilled by ptxas (at 256 rows a tile it spills, so no shape takes that tile)."""
    ck = _compile(64, 128, bits=bits, warps=warps, ring=True)
    _assert_register_path(ck, bits, 128)
    assert ck.metadata.shared <= gluon_affine.SHARED_BYTES
    assert spill_bytes(ck) in (0, None)  # None: no ptxas for this PTX bundled


def _assert_register_path(ck, bits: int, mt: int) -> None:
    ttgir, ptx = ck.asm["ttgir"], ck.asm["ptx"]
    operands = re.findall(r"dot_op<\{opIdx = 0, parent = #mma, kWidth = (\d+)\}>", ttgir)
    assert operands and set(operands) == {"2"}, "the register operand must have kWidth 2"
    assert "ld.shared" not in ptx, "the weight tile went through shared memory"
    assert "shfl" not in ptx, "the weight tile was shuffled between lanes"
    # two copies of the step (the loop and the last step), BK / 16 MMAs each
    assert len(re.findall(r"wgmma\.mma_async", ptx)) == 2 * gluon_affine.STEP_K[bits] // 16
    assert f"m64n{mt}k16" in ptx


@pytest.mark.parametrize("bits", [4, 5, 6, 8])
def test_planted_regrouping_changes_only_the_data_order(bits):
    plain, regrouped = _compile(64, 8, bits=bits), _compile(64, 8, fault=1, bits=bits)
    for ck in (plain, regrouped):
        mmas = len(re.findall(r"wgmma\.mma_async", ck.asm["ptx"]))
        assert mmas == 2 * gluon_affine.STEP_K[bits] // 16
        assert "ld.shared" not in ck.asm["ptx"]


@pytest.mark.parametrize("bits,group,mt", [(4, 32, 16), (4, 64, 8), (4, 128, 16), (8, 64, 16)])
def test_staged_words_arrive_by_16_byte_copies(bits, group, mt):
    """The staged form: a segment's words reach shared memory by 16-byte async copies only, and
    the dequantized tile still reaches the MMA in kWidth 2 with no shuffle; the segment's steps
    are unrolled, each with its BK / 16 chained MMAs."""
    ck = _compile(group, mt, bits=bits, staged=True)
    ttgir, ptx = ck.asm["ttgir"], ck.asm["ptx"]
    copies = re.findall(r"cp\.async\.c[ag]\.shared\.global[^;]*, (0x[0-9a-f]+)", ptx)
    assert copies and set(copies) == {"0x10"}, "the words must arrive by 16-byte copies"
    operands = re.findall(r"dot_op<\{opIdx = 0, parent = #mma, kWidth = (\d+)\}>", ttgir)
    assert operands and set(operands) == {"2"}, "the register operand must have kWidth 2"
    assert "shfl" not in ptx, "the weight tile was shuffled between lanes"
    assert len(re.findall(r"wgmma\.mma_async", ptx)) == 1024 // 16  # SEG / 16, every step
    assert f"m64n{mt}k16" in ptx


@pytest.mark.parametrize(
    "bits,mt,warps,fault",
    [(4, 64, 4, 0), (4, 16, 4, 0), (4, 64, 8, 0), (8, 64, 4, 0), (5, 32, 4, 0), (6, 64, 4, 0)]
    + [(4, 64, 4, 1), (6, 64, 4, 1), (4, 64, 4, 2)],
)
def test_ring_inputs_arrive_by_16_byte_copies_and_keep_the_mmas(bits, mt, warps, fault):
    """The ring form: the rows' inputs reach shared memory by 16-byte async copies only (the
    planted regrouping's by loads and stores: a card's Triton 3.6 refused its permuted columns
    as copies), into a ring of RING steps, and the weight tile and the chain of MMAs are the
    registers form's: kWidth 2, no shuffle, no shared-memory round trip."""
    ring = _compile(64, mt, fault=fault, bits=bits, warps=warps, ring=True)
    ptx = ring.asm["ptx"]
    copies = re.findall(r"cp\.async\.c[ag]\.shared\.global[^;]*, (0x[0-9a-f]+)", ptx)
    if fault == 1:
        assert not copies and "st.shared" in ptx, "the planted regrouping loads and stores"
    else:
        assert copies and set(copies) == {"0x10"}, "the inputs must arrive by 16-byte copies"
    assert ring.metadata.shared < _compile(64, mt, bits=bits, warps=warps).metadata.shared
    _assert_register_path(ring, bits, mt)


@pytest.mark.parametrize(
    "bits,mt,fault", [(4, 64, 0), (4, 32, 0), (8, 64, 0), (5, 64, 0), (4, 64, 1), (4, 64, 2)]
)
def test_deep_ring_queues_each_mma_behind_the_last(bits, mt, fault):
    """The ring's deep form (4 warps): each step's MMA is issued before the step before it is
    waited for (a wait that leaves one MMA in flight), with the registers form's tile and chain
    of MMAs; the ring without it waits for every MMA before the next."""
    deep = _compile(64, mt, fault=fault, bits=bits, ring=True, deep=True)
    ptx = deep.asm["ptx"]
    assert "wgmma.wait_group.sync.aligned 1;" in ptx
    plain = _compile(64, mt, fault=fault, bits=bits, ring=True).asm["ptx"]
    assert "wgmma.wait_group.sync.aligned 1;" not in plain
    _assert_register_path(deep, bits, mt)


def test_deep_ring_is_one_warpgroup_only():
    """Eight warps (two warpgroups reading one ring) take the ring without the deep wait: one
    warpgroup's wait would not free a slot the other's MMA may still read."""
    consts = gluon_affine.constants(4, 64, 1024, 64, 8, ring=True, deep=True)
    assert (
        consts["DEEP"] == 0
        and gluon_affine.constants(4, 64, 1024, 64, 4, ring=True, deep=True)["DEEP"] == 1
    )


GROUPED = dict(
    x_ptr="*bf16",
    w_ptr="*i32",
    s_ptr="*bf16",
    b_ptr="*bf16",
    w2_ptr="*i32",
    s2_ptr="*bf16",
    b2_ptr="*bf16",
    p_ptr="*fp32",
    order_ptr="*i64",
    tile_e="*i32",
    tile_lo="*i32",
    tile_hi="*i32",
    PAIRS="i32",
    N="i32",
    stride_x="i32",
    stride_we="i32",
    stride_w="i32",
    stride_se="i32",
    stride_s="i32",
)


@pytest.mark.parametrize("bits,up,gather", [(4, True, True), (4, False, False), (8, True, True)])
def test_grouped_experts_take_the_same_tile_and_mmas(bits, up, gather):
    """The grouped launch (gluon_grouped.py): each product it holds (gate and up, or one) is the
    few-row kernel's body, its tile in kWidth 2 reaching the MMA with no shuffle or shared-memory
    round trip."""
    grouped = pytest.importorskip("tensorfold.ops.triton.gluon_grouped")
    bk = gluon_affine.STEP_K[bits]
    consts = dict(
        TOP_K=8, GATHER=gather, UP=up, BITS=bits, GROUP=64, SEG=1024, BN=gluon_affine.BN, BK=bk,
        MT=16, X_LAYOUT=gluon_affine._x_layout(16, bk), FAULT=0, STAGED=False, num_warps=4,
        PDL=True,
    )  # fmt: skip
    sig = {**GROUPED, **{k: "constexpr" for k in consts}}
    aligned = {(i,): [["tt.divisibility", 16]] for i in (*range(9), 13, 14, 15, 16, 17, 18)}
    ck = compile_for_hopper(GluonASTSource(grouped._grouped_swapped, sig, consts, aligned))
    ttgir, ptx = ck.asm["ttgir"], ck.asm["ptx"]
    assert_waits_first(ptx)
    operands = re.findall(r"dot_op<\{opIdx = 0, parent = #mma, kWidth = (\d+)\}>", ttgir)
    assert operands and set(operands) == {"2"}
    assert "ld.shared" not in ptx and "shfl" not in ptx
    # a step's dot in the loop and the last step's, for each product (the compiler may merge the
    # two products' last steps in the PTX, BK / 16 MMAs each)
    assert len(re.findall(r"warp_group_dot ", ttgir)) == 2 * (2 if up else 1)
    assert len(re.findall(r"wgmma\.mma_async", ptx)) % (bk // 16) == 0
