"""Packed 4-, 5-, 6- and 8-bit products of few rows (decode and verify) in Gluon, at the prompt
kernels' arithmetic.

The weights sit on the MMA's wide side (yᵀ = W · xᵀ, Hopper wgmma with the weight tile in
registers and the rows, padded to 8 or 16, in shared memory). Each thread loads the words of its
own rows and keeps, of every word, the two values its MMA fragment holds, so the dequantized tile
is already in the MMA's operand layout (gluon_tiles.py: no shuffle, no shared-memory round
trip). The MMAs run asynchronously: while one step's MMA runs, the next step's words are
dequantized.

The arithmetic is the prompt kernels' (docs/exactness.md, 'Products' and 'Packed weights'):
each value is fma(q, scale, bias) in fp32 rounded once to bf16; each 16-column MMA chains into
the segment's fp32 accumulator from zero, in K order; one program per (weight tile, segment)
stores its segment sum, and the segments are added in order afterwards.

Only 4-bit weights at K a multiple of 128 and 5-, 6- and 8-bit ones at K a multiple of 64, at most
128 rows (padded to 8, 16, 32, 64 or 128: the MMA's narrow side), on Hopper, where a segment's inputs
(and its staged words) fit in shared memory; `linear.affine_matmul` runs the Triton swapped form
(the same sums) everywhere else. Four warps take 64 weight rows a program, eight take 128: each
warpgroup's MMA is the same m64nMTk16 chain over its own rows, so the warps change no bit.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .gluon_odd import _operand_odd, _tile_odd, unit_columns
from .gluon_tiles import (
    _async_load,
    _barrier,
    _operand4,
    _operand8,
    _pdl_start,
    _scale_offsets,
    _stage_words,
    _staged,
    _swap_bits,
    _tile,
    _tile8,
)
from .launch import pdl


@gluon.jit
def _step_tile(words, s_ptr, b_ptr, p_s, s_ok, c_lo, sel, i, BITS: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP: gl.constexpr, LP: gl.constexpr, LS: gl.constexpr, A_LAYOUT: gl.constexpr, HFMA: gl.constexpr = 0):  # fmt: skip
    """Step i's weight tile [BN, BK] in bf16 in the MMA's register operand layout, by width
    (HFMA: 4-bit values in bf16x2 arithmetic, for weights whose fp32 fma is exact)."""
    if BITS == 4:
        return _tile(words, s_ptr, b_ptr, p_s, s_ok, sel, i, BN, BK, GROUP, A_LAYOUT, HFMA)
    elif BITS == 8:
        return _tile8(words, s_ptr, b_ptr, p_s, s_ok, c_lo, sel, i, BN, BK, GROUP, LP, LS, A_LAYOUT)
    else:  # 5 or 6 bits: `sel` holds the lanes
        return _tile_odd(words, s_ptr, b_ptr, p_s, s_ok, sel, i, BITS, BN, BK, GROUP, LS, A_LAYOUT)


@gluon.jit
def _x_copy(x_smem, slot, p_x, live, step, NSTEP: gl.constexpr, BK: gl.constexpr, FAULT: gl.constexpr):  # fmt: skip
    """Step `step`'s inputs into ring slot `slot` by async copies, one commit group (steps past
    the segment copy nothing: the group stays, so every step waits on the same count). The
    planted regrouping (FAULT 1) loads and stores them instead: its permuted columns are runs of
    8, which one Triton's async copies took for single values; _x_ready's fence and barrier
    publish the stores as they publish the copies."""
    mask = live[:, None] & (step < NSTEP)
    if FAULT == 1:
        x_smem.index(slot).store(gl.load(p_x + step * BK, mask=mask, other=0.0))
    else:
        _async_load(x_smem.index(slot), p_x + step * BK, mask=mask)
    async_copy.commit_group()


@gluon.jit
def _x_ready(RING: gl.constexpr):
    """The oldest copy group in flight has landed, for every thread, and is visible to wgmma."""
    async_copy.wait_group(RING - 2)
    fence_async_shared()
    _barrier()


@gluon.jit
def _affine_swapped(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    p_ptr,
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_s,
    BITS: gl.constexpr,
    GROUP: gl.constexpr,
    SEG: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    MT: gl.constexpr,
    X_LAYOUT: gl.constexpr,
    FAULT: gl.constexpr,
    STAGED: gl.constexpr,
    RING: gl.constexpr,
    HFMA: gl.constexpr,
    num_warps: gl.constexpr,
    DEEP: gl.constexpr = 0,
    PDL: gl.constexpr = False,
):
    """Program (weight tile, segment): the segment's fp32 sums of rows 0..M-1 at [segment, row]."""
    _pdl_start(PDL)
    pid_n, pid_s = gl.program_id(0), gl.program_id(1)
    _swapped_body(
        x_ptr, x_ptr, 0, M, w_ptr, s_ptr, b_ptr, p_ptr, pid_s * M, N, N, stride_x, stride_w,
        stride_s, pid_n, pid_s, 1, False, BITS, GROUP, SEG, BN, BK, MT, X_LAYOUT, FAULT, STAGED,
        num_warps, RING, HFMA, DEEP,
    )  # fmt: skip


@gluon.jit
def _swapped_body(
    x_ptr,
    order_ptr,
    row0,
    m_live,
    w_ptr,
    s_ptr,
    b_ptr,
    p_ptr,
    p_row,
    ldp,
    N,
    stride_x,
    stride_w,
    stride_s,
    pid_n,
    pid_s,
    TOP_K: gl.constexpr,
    GATHER: gl.constexpr,
    BITS: gl.constexpr,
    GROUP: gl.constexpr,
    SEG: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    MT: gl.constexpr,
    X_LAYOUT: gl.constexpr,
    FAULT: gl.constexpr,
    STAGED: gl.constexpr,
    num_warps: gl.constexpr,
    RING: gl.constexpr = 0,
    HFMA: gl.constexpr = 0,
    DEEP: gl.constexpr = 0,
):
    """Weight tile pid_n, segment pid_s against rows row0 .. row0 + m_live - 1 of x (GATHER: row
    order[row0 + i] // TOP_K, an expert's pairs), their fp32 segment sums stored at rows p_row..
    of p (a row every ldp values). RING > 0: the inputs pass through a ring of RING steps in
    shared memory, copied RING - 1 steps ahead, rather than the whole segment's at once (less
    shared memory a program, so more programs share a multiprocessor; the same MMAs). HFMA: 4-bit
    values dequantized in bf16x2 arithmetic, the same values where quant.single_rounding holds.
    DEEP (with a ring): step i's MMA is issued before step i-1's is waited for, so the next MMA
    is queued when one ends; the same MMAs into the same accumulator, in the same order."""
    NSTEP: gl.constexpr = SEG // BK
    k_seg = pid_s * SEG
    RT: gl.constexpr = BN // 16
    KW: gl.constexpr = BK * BITS // 32  # words of a row in one step
    KBG: gl.constexpr = min(GROUP, BK) // 8  # 8-column blocks of one scale group in a step
    NG: gl.constexpr = BK // 8 // KBG
    MMA: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, MT, 16]
    )
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    # 4-bit words, the 8-bit words' halves; the 8-bit words regrouped as (block, half) pairs
    LS: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 2, 1, 1, NG, KBG],
        threads_per_warp=[1, 1, 8, 4, 1, 1],
        warps_per_cta=[num_warps, 1, 1, 1, 1, 1],
        order=[5, 4, 3, 2, 1, 0],
    )
    LP: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 2, 1, 1, NG, KBG, 2],
        threads_per_warp=[1, 1, 8, 4, 1, 1, 1],
        warps_per_cta=[num_warps, 1, 1, 1, 1, 1, 1],
        order=[6, 5, 4, 3, 2, 1, 0],
    )
    LW: gl.constexpr = gl.BlockedLayout(  # the 8-bit words (two an 8-column block)
        size_per_thread=[1, 2, 1, 1, NG, 2 * KBG],
        threads_per_warp=[1, 1, 8, 4, 1, 1],
        warps_per_cta=[num_warps, 1, 1, 1, 1, 1],
        order=[5, 4, 3, 2, 1, 0],
    )
    if BITS == 4:  # a word is one 8-column block
        p_w, row_ok, sel = _operand4(w_ptr, pid_n * BN, k_seg, N, stride_w, LS, RT, NG, KBG, FAULT)
        c_lo = sel  # a placeholder: only the 8-bit tile picks a word by lane
        LW5: gl.constexpr = gl.SliceLayout(3, LS)  # a staged step's words, before the lanes
    elif BITS == 8:  # two words an 8-column block
        LW5: gl.constexpr = gl.SliceLayout(3, LW)
        p_w, row_ok, c_lo, sel = _operand8(
            w_ptr, pid_n * BN, k_seg, N, stride_w, LW, LS, RT, NG, KBG, FAULT
        )
    else:  # 5 or 6 bits: whole words of whole blocks a unit (gluon_odd.py); `sel` holds the lanes
        gl.static_assert(not STAGED, "5- and 6-bit words are loaded in registers only")
        LW5: gl.constexpr = gl.SliceLayout(3, LS)  # unused: no staged form
        p_w, row_ok, sel = _operand_odd(w_ptr, pid_n * BN, k_seg, N, stride_w, LS, RT, BITS, FAULT)
        c_lo = sel  # a placeholder
    L5: gl.constexpr = gl.SliceLayout(5, LS)  # one scale per (row, group)
    p_s, s_ok = _scale_offsets(pid_n * BN, k_seg, N, stride_s, L5, RT, NG, KBG, GROUP)
    KWN: gl.constexpr = KW // NG  # words of a row in one scale group of a step
    if STAGED:  # the whole segment's words in flight at once, in shared memory
        W_SMEM: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[4, 3, 2, 1, 0])
        w_smem = gl.allocate_shared_memory(gl.int32, [NSTEP, RT, 2, 8, NG, KWN], W_SMEM)
        _stage_words(
            w_ptr, w_smem, pid_n * BN, k_seg, N, stride_w, BITS, RT, NG, KWN, KW, NSTEP, FAULT,
            num_warps,
        )  # fmt: skip
        zeros = row_ok.to(gl.int32) * 0  # the words' full shape and layout
        w0 = zeros
    else:
        w0 = gl.load(p_w, mask=row_ok, other=0)  # the first words in flight before the inputs
    # the rows' inputs for the whole segment once (or a ring of RING steps) in shared memory
    gl.static_assert(RING == 0 or (RING >= 2 and not STAGED), "a ring needs 2 slots, no staging")
    LX: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    XS: gl.constexpr = RING if RING > 0 else NSTEP  # steps of inputs held at once
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [XS, MT, BK], X_LAYOUT)
    o_xm = gl.arange(0, MT, layout=gl.SliceLayout(1, LX))
    o_xk = gl.arange(0, BK, layout=gl.SliceLayout(0, LX))
    if FAULT == 1:  # the inputs regrouped the same way: the same products, other MMAs
        if BITS == 6 or BITS == 5:  # units swapped in pairs, as their words
            o_xk = o_xk ^ unit_columns(BITS)
        else:
            o_xk = _swap_bits(o_xk, 8)
        o_xk = gl.max_contiguous(gl.multiple_of(o_xk, 8), 8)  # still 8 columns a 16-byte copy
    live = o_xm < m_live
    if GATHER:
        x_rows = gl.load(order_ptr + row0 + o_xm, mask=live, other=0).to(gl.int64) // TOP_K
    else:
        x_rows = (row0 + o_xm).to(gl.int64)
    p_x = x_ptr + x_rows[:, None] * stride_x + (k_seg + o_xk)[None, :]
    if RING:  # the first RING - 1 steps' copies in flight, one commit group a step
        for j in gl.static_range(RING - 1):
            _x_copy(x_smem, j, p_x, live, j, NSTEP, BK, FAULT)
    else:
        for i in gl.static_range(NSTEP):
            x_smem.index(i).store(gl.load(p_x + i * BK, mask=live[:, None], other=0.0))
        fence_async_shared()
        _barrier()

    # step i's MMAs run while step i+1's words are dequantized and step i+2's are loaded
    acc = gl.zeros([BN, MT], gl.float32, layout=MMA)
    first_half = gl.zeros([BN, MT], gl.float32, layout=MMA)
    LAST: gl.constexpr = NSTEP - 1
    if STAGED:
        w0 = _staged(w_smem, 0, NSTEP, zeros, LW5)
    a = _step_tile(
        w0, s_ptr, b_ptr, p_s, s_ok, c_lo, sel, 0, BITS, BN, BK, GROUP, LP, LS, A_LAYOUT, HFMA
    )
    if STAGED:  # unrolled: each step waits for its own copies
        for i in gl.static_range(LAST):
            acc = warpgroup_mma(a, x_smem.index(i).permute((1, 0)), acc, is_async=True)
            nxt = _step_tile(
                _staged(w_smem, i + 1, NSTEP, zeros, LW5), s_ptr, b_ptr, p_s, s_ok, c_lo, sel,
                i + 1, BITS, BN, BK, GROUP, LP, LS, A_LAYOUT, HFMA,
            )  # fmt: skip
            acc, a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a))
            a = nxt
            if FAULT == 2:
                if i == NSTEP // 2 - 1:
                    first_half = acc
                    acc = gl.zeros([BN, MT], gl.float32, layout=MMA)
    else:
        # DEEP: step i's MMAs issued while step i-1's may run; the wait that leaves one group in
        # flight frees step i-1's tile (`prev`) and ring slot. One warpgroup: its wait frees the
        # slot for every copier (with two, the other's MMAs could still read it)
        gl.static_assert(not DEEP or (RING > 0 and num_warps == 4), "deep: a ring, 4 warps")
        prev = a
        ahead = gl.load(p_w + min(1, LAST) * KW, mask=row_ok, other=0)
        for i in range(LAST):
            later = gl.load(p_w + gl.minimum(i + 2, LAST) * KW, mask=row_ok, other=0)
            if RING:  # step i's inputs landed; the slot step i - 1 read takes step i + RING - 1
                _x_ready(RING)
                acc = warpgroup_mma(a, x_smem.index(i % RING).permute((1, 0)), acc, is_async=True)
                if DEEP:
                    acc, prev = warpgroup_mma_wait(num_outstanding=1, deps=(acc, prev))
                _x_copy(x_smem, (i + RING - 1) % RING, p_x, live, i + RING - 1, NSTEP, BK, FAULT)
            else:
                acc = warpgroup_mma(a, x_smem.index(i).permute((1, 0)), acc, is_async=True)
            nxt = _step_tile(
                ahead, s_ptr, b_ptr, p_s, s_ok, c_lo, sel, i + 1, BITS, BN, BK, GROUP, LP, LS,
                A_LAYOUT, HFMA,
            )  # fmt: skip
            if DEEP:  # step i's MMAs still read `a`
                prev = a
            else:
                acc, a = warpgroup_mma_wait(
                    num_outstanding=0, deps=(acc, a)
                )  # `a` lives until then
            a = nxt
            ahead = later
            if FAULT == 2:  # planted: the segment summed as two chains, then added
                if i == NSTEP // 2 - 1:
                    if DEEP:
                        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                    first_half = acc
                    acc = gl.zeros([BN, MT], gl.float32, layout=MMA)
    if RING:
        _x_ready(RING)
    acc = warpgroup_mma(a, x_smem.index(LAST % XS).permute((1, 0)), acc, is_async=True)
    if DEEP:
        acc, prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc, prev))
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    if FAULT == 2:
        acc = first_half + acc

    o_n = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, MMA))
    o_m = gl.arange(0, MT, layout=gl.SliceLayout(0, MMA))
    mask = (o_n[:, None] < N) & (o_m[None, :] < m_live)
    gl.store(p_ptr + (p_row + o_m)[None, :].to(gl.int64) * ldp + o_n[:, None], acc, mask=mask)


BN = 64  # weight rows of one warpgroup's MMA tile (a program of 4 warps)
# the rows pad to the MMA's narrow side; 128: a many-lane verify pass or step, in pieces of 128
# rows past that (tiles.PIECE_ROWS); at 256 ptxas spills
ROW_TILES = (8, 16, 32, 64, 128)
SHARED_BYTES = 227 * 1024  # a Hopper block's shared memory
# K columns a step: 16 words of a row at 4 and 8 bits (eight or four 16-column MMAs), 10 or 12
# at 5 and 6 (four MMAs)
STEP_K = {4: 128, 5: 64, 6: 64, 8: 64}
STAGED_BITS = (4, 8)  # widths with a staged form (5- and 6-bit words wait in registers only)
RING = 3  # steps of inputs a ring holds: the step the MMA reads and two copies in flight
FAULT_FOLDED = 3  # planted (bf16x2 forms): 128 folded into the bias before the fma


def applies(
    x: torch.Tensor,
    bits: int,
    k: int,
    segment: int,
    staged: bool = False,
    warps: int = 4,
    ring: bool = False,
) -> bool:
    """Whether this kernel can run the product: at most 128 rows, a segment's inputs (or the
    ring's), and its staged words, in shared memory, and `fits` (no ring with staged words)."""
    m = x.shape[0]
    if m > ROW_TILES[-1] or (ring and staged) or not fits(x, bits, k, segment, staged):
        return False  # `fits` first: the ring's size needs a width the kernel has
    return shared_bytes(bits, segment, row_tile(m), BN * warps // 4, staged, ring) <= SHARED_BYTES


def row_tile(m: int) -> int:
    """The MMA's narrow side for m rows."""
    return next(t for t in ROW_TILES if m <= t)


def shared_bytes(
    bits: int, segment: int, mt: int, bn: int, staged: bool, ring: bool = False
) -> int:
    """A program's shared memory: the segment's inputs of mt rows (or RING steps of them), and
    its staged words."""
    inputs = min(segment, RING * STEP_K[bits]) if ring else segment
    return inputs * mt * 2 + (segment * bn * bits // 8 if staged else 0)


def fits(x: torch.Tensor, bits: int, k: int, segment: int, staged: bool = False) -> bool:
    """4-, 5-, 6- or 8-bit words (5- and 6-bit ones in registers, not staged), bf16 rows, whole
    steps in each segment, and a Hopper card (wgmma)."""
    return (
        bits in STEP_K
        and (not staged or bits in STAGED_BITS)
        and x.dtype == torch.bfloat16
        and k % STEP_K[bits] == 0
        and segment % STEP_K[bits] == 0
        and x.is_cuda
        and torch.cuda.get_device_capability(x.device) == (9, 0)
    )


def partials(
    x,
    words,
    scales,
    biases,
    bits: int,
    group: int,
    segment: int,
    fault: int = 0,
    staged: bool = False,
    warps: int = 4,
    ring: bool = False,
    hfma: bool = False,
    deep: bool = False,
) -> torch.Tensor:
    """Segment sums [K/segment, M, N] in fp32 of x [M, K] · dequant(words [N, K·bits/32])ᵀ
    (`fault`: the registry's planted controls, 1 regrouped K, 2 a segment in two chains, 3 the
    bf16x2 dequantization rounding at another point;
    `staged`: a segment's words copied to shared memory all at once rather than two steps
    ahead in registers, the same values and MMAs; `warps`: 4 or 8, 64 or 128 weight rows a
    program; `ring`: the inputs through a ring of RING steps, the same values and MMAs;
    `hfma`: 4-bit values in bf16x2 arithmetic, only for weights quant.single_rounding passes,
    where it gives the same values; `deep`, with a ring: each MMA issued before the one before
    it is waited for, the same MMAs in the same order)."""
    m, k = x.shape
    n = words.shape[0]
    mt, bn = row_tile(m), BN * warps // 4
    nseg = k // segment
    part = torch.empty((nseg, m, n), dtype=torch.float32, device=x.device)
    _affine_swapped[(triton.cdiv(n, bn), nseg)](
        x, words, scales, biases, part, m, n, k, x.stride(0), words.stride(0), scales.stride(0),
        **constants(bits, group, segment, mt, warps, staged, ring, fault, hfma, deep),
        **pdl(x.device),
    )  # fmt: skip
    return part


def constants(
    bits: int,
    group: int,
    segment: int,
    mt: int,
    warps: int = 4,
    staged: bool = False,
    ring: bool = False,
    fault: int = 0,
    hfma: bool = False,
    deep: bool = False,
) -> dict:
    """The kernel's compile-time constants for one form and row tile `mt` (what `partials`
    launches with; the CPU compile tests and benchmarks/sass_report.py compile the same)."""
    bk = STEP_K[bits]
    return dict(
        BITS=bits, GROUP=group, SEG=segment, BN=BN * warps // 4, BK=bk, MT=mt,
        X_LAYOUT=_x_layout(mt, bk), FAULT=fault, STAGED=staged,
        RING=_ring_slots(ring, segment // bk), HFMA=_hfma(hfma, bits, fault), num_warps=warps,
        DEEP=int(deep and warps == 4 and _ring_slots(ring, segment // bk) > 0),
    )  # fmt: skip


def _hfma(hfma: bool, bits: int, fault: int) -> int:
    """The kernel's HFMA: 0 the fp32 dequantization, 1 bf16x2 (4-bit only), 2 its planted fold
    (the registry's fault 3)."""
    if not hfma or bits != 4:
        return 0
    return 2 if fault == FAULT_FOLDED else 1


def _ring_slots(ring: bool, steps: int) -> int:
    """Slots of the inputs' ring (0: the whole segment at once, as for a one-step segment)."""
    return min(RING, steps) if ring and steps >= 2 else 0


@functools.cache
def _x_layout(mt: int, bk: int):
    return gl.NVMMASharedLayout.get_default_for([mt, bk], gl.bfloat16)
