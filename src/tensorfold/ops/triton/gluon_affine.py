"""Packed 4- and 8-bit products of few rows (decode and verify) in Gluon, at the prompt kernels'
arithmetic.

The weights sit on the MMA's wide side (yᵀ = W · xᵀ, Hopper wgmma with the weight tile in
registers and the rows, padded to 8 or 16, in shared memory). Each thread loads the words of its
own rows and keeps, of every word, the two values its MMA fragment holds: the fragment of
m64nNk16 gives a thread the K pairs 2c, 2c+1 of every 8 columns (c = lane % 4). A 4-bit word
holds 8 columns (the pair is byte c); at 8 bits an 8-column block is two words (the pair is
bytes 2(c % 2) and 2(c % 2) + 1 of word c // 2). Either way the dequantized tile is already in
the MMA's operand layout (no shuffle, no shared-memory round trip). The MMAs run asynchronously:
while one step's MMA runs, the next step's words are dequantized.

The arithmetic is the prompt kernels' (docs/exactness.md, 'Products' and 'Packed weights'):
each value is fma(q, scale, bias) in fp32 rounded once to bf16; each 16-column MMA chains into
the segment's fp32 accumulator from zero, in K order; one program per (weight tile, segment)
stores its segment sum, and the segments are added in order afterwards. The upper value of a
byte is taken as 16·q and multiplied by scale/16: both factors are scaled by exact powers of two,
so the fma sees the same exact product q·scale and rounds the same sum (for any scale above
2^-122, far below any checkpoint's).

Only 4-bit weights at K a multiple of 128 and 8-bit ones at K a multiple of 64, at most 16 rows,
on Hopper; `linear.affine_matmul` runs the Triton swapped form (the same sums) everywhere else.
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

# every thread's inputs stored before the MMAs read them (renamed barrier() in later Tritons)
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
# global -> shared copies in flight (cp.async; renamed async_load in later Tritons)
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


@gluon.jit
def _biased(words, sel):
    """One byte permute: the byte of each word that `sel` picks, then 0, 0, 0x4B, which is
    2^23 + the byte as an fp32 bit pattern."""
    return gl.inline_asm_elementwise(
        "prmt.b32 $0, $1, $2, $3;",
        "=r,r,r,r",
        [words, gl.full_like(words, 0x4B000000), sel],
        dtype=gl.int32,
        is_pure=True,
        pack=1,
    )


@gluon.jit
def _operand(v0, v1, BN: gl.constexpr, BK: gl.constexpr, A_LAYOUT: gl.constexpr):
    """Each thread's pairs (v0, v1) [RT, 2, 8, 4, NG, KB] of columns 8·(NG·KB index) + 2c + d
    as the tile [BN, BK] in the MMA's register operand layout (a regrouping of registers only)."""
    t = gl.permute(gl.join(v0, v1), (0, 1, 2, 4, 5, 3, 6))
    return gl.convert_layout(gl.reshape(t, (BN, BK)), A_LAYOUT, assert_trivial=True)


@gluon.jit
def _pair(words, sel, s_lo, s_hi, bias):
    """Values 2c and 2c+1 of each word (byte c, picked by `sel`). One byte permute builds
    2^23 + lo + 16·hi as an fp32 bit pattern; clearing bits 4-7 leaves 2^23 + lo; the two
    subtractions are exact, giving lo and 16·hi, each in one fma with its matching scale."""
    both = _biased(words, sel)
    low = both & -241  # 0xFFFFFF0F: bits 4-7 cleared
    f_both = both.to(gl.float32, bitcast=True)
    f_low = low.to(gl.float32, bitcast=True)
    lo = f_low - 8388608.0
    hi = f_both - f_low
    return gl.fma(lo, s_lo, bias).to(gl.bfloat16), gl.fma(hi, s_hi, bias).to(gl.bfloat16)


@gluon.jit
def _tile(
    words,
    s_ptr,
    b_ptr,
    p_s,
    s_ok,
    sel,
    i,
    BN: gl.constexpr,
    BK: gl.constexpr,
    GROUP: gl.constexpr,
    A_LAYOUT: gl.constexpr,
):
    """Step i's weight tile [BN, BK] in bf16, in the MMA's register operand layout."""
    gs = (i * BK) // GROUP
    scale = gl.load(s_ptr + p_s + gs, mask=s_ok, other=0.0).to(gl.float32)
    bias = gl.expand_dims(gl.load(b_ptr + p_s + gs, mask=s_ok, other=0.0).to(gl.float32), 5)
    lo, hi = _pair(words, sel, gl.expand_dims(scale, 5), gl.expand_dims(scale * 0.0625, 5), bias)
    return _operand(lo, hi, BN, BK, A_LAYOUT)


@gluon.jit
def _byte(words, sel):
    """The byte `sel` picks, as fp32: 2^23 + byte read as a float, minus 2^23 (exact)."""
    return _biased(words, sel).to(gl.float32, bitcast=True) - 8388608.0


@gluon.jit
def _tile8(
    words,
    s_ptr,
    b_ptr,
    p_s,
    s_ok,
    c_lo,
    sel,
    i,
    BN: gl.constexpr,
    BK: gl.constexpr,
    GROUP: gl.constexpr,
    LP: gl.constexpr,
    LS: gl.constexpr,
    A_LAYOUT: gl.constexpr,
):
    """Step i's 8-bit weight tile [BN, BK] in the MMA's operand layout. An 8-column block is two
    words; lane c's values 2c and 2c+1 are bytes 2(c%2) and 2(c%2)+1 of word c // 2."""
    gs = (i * BK) // GROUP
    scale = gl.expand_dims(gl.load(s_ptr + p_s + gs, mask=s_ok, other=0.0).to(gl.float32), 5)
    bias = gl.expand_dims(gl.load(b_ptr + p_s + gs, mask=s_ok, other=0.0).to(gl.float32), 5)
    RT: gl.constexpr = BN // 16
    KBG: gl.constexpr = min(GROUP, BK) // 8
    NG: gl.constexpr = BK // 8 // KBG
    pairs = gl.convert_layout(
        gl.reshape(words, (RT, 2, 8, 4, NG, KBG, 2)), LP, assert_trivial=True
    )  # a thread's own registers, regrouped
    w_lo, w_hi = gl.split(pairs)
    word = gl.where(
        c_lo,
        gl.convert_layout(w_lo, LS, assert_trivial=True),
        gl.convert_layout(w_hi, LS, assert_trivial=True),
    )
    v0 = gl.fma(_byte(word, sel), scale, bias).to(gl.bfloat16)
    v1 = gl.fma(_byte(word, sel + 1), scale, bias).to(gl.bfloat16)
    return _operand(v0, v1, BN, BK, A_LAYOUT)


@gluon.jit
def _swap_bits(v, LOW: gl.constexpr):
    """v with its bits LOW and 2·LOW exchanged (a planted regrouping for the registry)."""
    keep = v & ~(3 * LOW)
    return keep | ((v & LOW) * 2) | ((v & (2 * LOW)) // 2)


@triton.constexpr_function
def _sliced(axis, rank, layout):
    """The 1-D layout of `axis` of a distributed layout of `rank` (every other axis sliced off)."""
    for dim in reversed(range(rank)):
        if dim != axis:
            layout = gl.SliceLayout(dim, layout)
    return layout


@gluon.jit
def _axis(SIZE: gl.constexpr, AXIS: gl.constexpr, RANK: gl.constexpr, LAYOUT: gl.constexpr):
    """arange(SIZE) along AXIS of a tensor of RANK in LAYOUT (size 1 on the other axes)."""
    t = gl.arange(0, SIZE, layout=_sliced(AXIS, RANK, LAYOUT))
    for dim in gl.static_range(RANK):
        if dim != AXIS:
            t = gl.expand_dims(t, dim)
    return t


@gluon.jit
def _rows(n_base, RT: gl.constexpr, RANK: gl.constexpr, L: gl.constexpr):
    """Row n = n_base + 16 rt + 8 h + g of axes (rt, h, g) = (0, 1, 2): lane 4 g + c, warp rt."""
    return _axis(RT, 0, RANK, L) * 16 + _axis(2, 1, RANK, L) * 8 + _axis(8, 2, RANK, L) + n_base


@gluon.jit
def _scale_offsets(n_base, k_seg, N, stride_s, L5: gl.constexpr, RT: gl.constexpr, NG: gl.constexpr, KBG: gl.constexpr, GROUP: gl.constexpr):  # fmt: skip
    """Offsets [RT, 2, 8, 4, NG] of the first step's scales (one per row and group) and their mask."""
    n5 = _rows(n_base, RT, 5, L5)
    c5 = _axis(4, 3, 5, L5)
    ng5 = _axis(NG, 4, 5, L5)
    p_s = n5.to(gl.int64) * stride_s + (k_seg // GROUP + ng5 * (KBG * 8 // GROUP) + c5 * 0)
    return p_s, (n5 < N) & (c5 >= 0) & (ng5 >= 0)


@gluon.jit
def _word_fault(word, BITS: gl.constexpr, FAULT: gl.constexpr):
    """The word index as planted for the registry (FAULT == 1): 8-column blocks 1 and 2 of every
    4 swapped, so K is regrouped across MMAs; unchanged otherwise."""
    if FAULT == 1:
        if BITS == 4:  # a word is one block
            word = _swap_bits(word, 1)
        else:  # two words a block
            word = 2 * _swap_bits(word // 2, 1) + word % 2
    return word


@gluon.jit
def _operand4(w_ptr, n_base, k_seg, N, stride_w, LW: gl.constexpr, RT: gl.constexpr, NG: gl.constexpr, KWG: gl.constexpr, FAULT: gl.constexpr):  # fmt: skip
    """4-bit words [RT, 2, 8, 4, NG, KWG] of a program's first step, every lane of a byte group
    loading the same words, and the byte selectors."""
    n6 = _rows(n_base, RT, 6, LW)
    c6 = _axis(4, 3, 6, LW)
    ng6 = _axis(NG, 4, 6, LW)
    kw6 = _axis(KWG, 5, 6, LW)
    word = _word_fault(ng6 * KWG + kw6, 4, FAULT)
    p_w = w_ptr + n6.to(gl.int64) * stride_w + (k_seg // 8 + word) + c6 * 0
    row_ok = (n6 < N) & (c6 >= 0) & (kw6 >= 0)
    sel = 0x7650 + c6 + kw6 * 0 + ng6 * 0 + n6 * 0  # byte c of the word, then 0, 0, 0x4B
    return p_w, row_ok, sel


@gluon.jit
def _operand8(w_ptr, n_base, k_seg, N, stride_w, LW: gl.constexpr, LS: gl.constexpr, RT: gl.constexpr, NG: gl.constexpr, KBG: gl.constexpr, FAULT: gl.constexpr):  # fmt: skip
    """8-bit words [RT, 2, 8, 4, NG, 2·KBG] (an 8-column block is two words), each lane's words
    of a group contiguous (16-byte loads); the lane tests and byte selectors in LS, the layout of
    the words' halves [RT, 2, 8, 4, NG, KBG]."""
    n6 = _rows(n_base, RT, 6, LW)
    c6 = _axis(4, 3, 6, LW)
    ng6 = _axis(NG, 4, 6, LW)
    kw6 = _axis(2 * KBG, 5, 6, LW)
    word = _word_fault(ng6 * (2 * KBG) + kw6, 8, FAULT)  # contiguity plain to the compiler
    p_w = w_ptr + n6.to(gl.int64) * stride_w + (k_seg // 4 + word) + c6 * 0
    row_ok = (n6 < N) & (c6 >= 0) & (kw6 >= 0)
    lane = _axis(4, 3, 6, LS) + _axis(RT, 0, 6, LS) * 0 + _axis(NG, 4, 6, LS) * 0
    lane = lane + _axis(KBG, 5, 6, LS) * 0
    c_lo = lane < 2  # values 2c, 2c+1 are in the block's first word for lanes 0 and 1
    sel = 0x7650 + 2 * (lane % 2)  # byte 2 (c % 2) of the word, then 0, 0, 0x4B
    return p_w, row_ok, c_lo, sel


@gluon.jit
def _stage_words(w_ptr, w_smem, n_base, k_seg, N, stride_w, BITS: gl.constexpr, RT: gl.constexpr, NG: gl.constexpr, KWN: gl.constexpr, KW: gl.constexpr, NSTEP: gl.constexpr, FAULT: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    """Every step's words [RT, 2, 8, NG, KWN] of the program's segment copied to shared memory
    by async copies of 16 bytes, one commit group a step, all in flight at once."""
    TW: gl.constexpr = min(4, KWN // 4)  # threads along a row's words of one group, 4 words each
    LC: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 1, 1, 1, 4],
        threads_per_warp=[1, 1, 8, 4 // TW, TW],
        warps_per_cta=[num_warps, 1, 1, 1, 1],
        order=[4, 3, 2, 1, 0],
    )
    n5 = _rows(n_base, RT, 5, LC)
    word = _word_fault(_axis(NG, 3, 5, LC) * KWN + _axis(KWN, 4, 5, LC), BITS, FAULT)
    p_c = w_ptr + n5.to(gl.int64) * stride_w + (k_seg * BITS // 32 + word)
    ok = (n5 < N) & (word >= 0)
    for i in gl.static_range(NSTEP):
        _async_load(w_smem.index(i), p_c + i * KW, mask=ok)
        async_copy.commit_group()


@gluon.jit
def _staged(w_smem, i: gl.constexpr, NSTEP: gl.constexpr, zeros, L5: gl.constexpr):
    """Step i's words from shared memory, once its copies landed, broadcast over the 4 lanes of
    each byte group (zeros: the words' full shape and layout)."""
    async_copy.wait_group(NSTEP - 1 - i)
    _barrier()  # every thread's copies of the step, not only this thread's
    return gl.expand_dims(w_smem.index(i).load(L5), 3) + zeros


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
    num_warps: gl.constexpr,
):
    """Program (weight tile, segment): the segment's fp32 sums of rows 0..M-1 at [segment, row]."""
    pid_n, pid_s = gl.program_id(0), gl.program_id(1)
    _swapped_body(
        x_ptr, x_ptr, 0, M, w_ptr, s_ptr, b_ptr, p_ptr, pid_s * M, N, N, stride_x, stride_w,
        stride_s, pid_n, pid_s, 1, False, BITS, GROUP, SEG, BN, BK, MT, X_LAYOUT, FAULT, STAGED,
        num_warps,
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
):
    """Weight tile pid_n, segment pid_s against rows row0 .. row0 + m_live - 1 of x (GATHER: row
    order[row0 + i] // TOP_K, an expert's pairs), their fp32 segment sums stored at rows p_row..
    of p (a row every ldp values)."""
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
    else:  # two words an 8-column block
        LW5: gl.constexpr = gl.SliceLayout(3, LW)
        p_w, row_ok, c_lo, sel = _operand8(
            w_ptr, pid_n * BN, k_seg, N, stride_w, LW, LS, RT, NG, KBG, FAULT
        )
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
    # the rows' inputs for the whole segment, once, into shared memory
    LX: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [NSTEP, MT, BK], X_LAYOUT)
    o_xm = gl.arange(0, MT, layout=gl.SliceLayout(1, LX))
    o_xk = gl.arange(0, BK, layout=gl.SliceLayout(0, LX))
    if FAULT == 1:  # the inputs regrouped the same way: the same products, other MMAs
        o_xk = _swap_bits(o_xk, 8)
    live = o_xm < m_live
    if GATHER:
        x_rows = gl.load(order_ptr + row0 + o_xm, mask=live, other=0).to(gl.int64) // TOP_K
    else:
        x_rows = (row0 + o_xm).to(gl.int64)
    for i in gl.static_range(NSTEP):
        xv = gl.load(
            x_ptr + x_rows[:, None] * stride_x + (k_seg + i * BK + o_xk)[None, :],
            mask=live[:, None],
            other=0.0,
        )
        x_smem.index(i).store(xv)
    fence_async_shared()
    _barrier()

    # step i's MMAs run while step i+1's words are dequantized and step i+2's are loaded
    acc = gl.zeros([BN, MT], gl.float32, layout=MMA)
    first_half = gl.zeros([BN, MT], gl.float32, layout=MMA)
    LAST: gl.constexpr = NSTEP - 1
    if STAGED:
        w0 = _staged(w_smem, 0, NSTEP, zeros, LW5)
    a = _step_tile(w0, s_ptr, b_ptr, p_s, s_ok, c_lo, sel, 0, BITS, BN, BK, GROUP, LP, LS, A_LAYOUT)
    if STAGED:  # unrolled: each step waits for its own copies
        for i in gl.static_range(LAST):
            acc = warpgroup_mma(a, x_smem.index(i).permute((1, 0)), acc, is_async=True)
            nxt = _step_tile(
                _staged(w_smem, i + 1, NSTEP, zeros, LW5), s_ptr, b_ptr, p_s, s_ok, c_lo, sel,
                i + 1, BITS, BN, BK, GROUP, LP, LS, A_LAYOUT,
            )  # fmt: skip
            acc, a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a))
            a = nxt
            if FAULT == 2:
                if i == NSTEP // 2 - 1:
                    first_half = acc
                    acc = gl.zeros([BN, MT], gl.float32, layout=MMA)
    else:
        ahead = gl.load(p_w + min(1, LAST) * KW, mask=row_ok, other=0)
        for i in range(LAST):
            later = gl.load(p_w + gl.minimum(i + 2, LAST) * KW, mask=row_ok, other=0)
            acc = warpgroup_mma(a, x_smem.index(i).permute((1, 0)), acc, is_async=True)
            nxt = _step_tile(
                ahead, s_ptr, b_ptr, p_s, s_ok, c_lo, sel, i + 1, BITS, BN, BK, GROUP, LP, LS,
                A_LAYOUT,
            )  # fmt: skip
            acc, a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a))  # `a` lives until then
            a = nxt
            ahead = later
            if FAULT == 2:  # planted: the segment summed as two chains, then added
                if i == NSTEP // 2 - 1:
                    first_half = acc
                    acc = gl.zeros([BN, MT], gl.float32, layout=MMA)
    acc = warpgroup_mma(a, x_smem.index(LAST).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    if FAULT == 2:
        acc = first_half + acc

    o_n = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, MMA))
    o_m = gl.arange(0, MT, layout=gl.SliceLayout(0, MMA))
    mask = (o_n[:, None] < N) & (o_m[None, :] < m_live)
    gl.store(p_ptr + (p_row + o_m)[None, :].to(gl.int64) * ldp + o_n[:, None], acc, mask=mask)


@gluon.jit
def _step_tile(words, s_ptr, b_ptr, p_s, s_ok, c_lo, sel, i, BITS: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, GROUP: gl.constexpr, LP: gl.constexpr, LS: gl.constexpr, A_LAYOUT: gl.constexpr):  # fmt: skip
    if BITS == 4:
        return _tile(words, s_ptr, b_ptr, p_s, s_ok, sel, i, BN, BK, GROUP, A_LAYOUT)
    else:
        return _tile8(words, s_ptr, b_ptr, p_s, s_ok, c_lo, sel, i, BN, BK, GROUP, LP, LS, A_LAYOUT)


BN = 64  # weight rows a program: one warpgroup's MMA tile
STEP_K = {4: 128, 8: 64}  # K columns a step: 16 words of a row (eight or four 16-column MMAs)


def applies(x: torch.Tensor, bits: int, k: int, segment: int) -> bool:
    """Whether this kernel can run the product: at most 16 rows, and `fits`."""
    return x.shape[0] <= 16 and fits(x, bits, k, segment)


def fits(x: torch.Tensor, bits: int, k: int, segment: int) -> bool:
    """4- or 8-bit words, bf16 rows, whole steps in each segment, and a Hopper card (wgmma)."""
    return (
        bits in STEP_K
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
) -> torch.Tensor:
    """Segment sums [K/segment, M, N] in fp32 of x [M, K] · dequant(words [N, K·bits/32])ᵀ
    (`fault`: the registry's planted controls, 1 regrouped K, 2 a segment in two chains;
    `staged`: a segment's words copied to shared memory all at once rather than two steps
    ahead in registers, the same values and MMAs)."""
    m, k = x.shape
    n = words.shape[0]
    mt = 8 if m <= 8 else 16  # the rows pad to the MMA's narrow side
    nseg = k // segment
    part = torch.empty((nseg, m, n), dtype=torch.float32, device=x.device)
    _affine_swapped[(triton.cdiv(n, BN), nseg)](
        x,
        words,
        scales,
        biases,
        part,
        m,
        n,
        k,
        x.stride(0),
        words.stride(0),
        scales.stride(0),
        BITS=bits,
        GROUP=group,
        SEG=segment,
        BN=BN,
        BK=STEP_K[bits],
        MT=mt,
        X_LAYOUT=_x_layout(mt, STEP_K[bits]),
        FAULT=fault,
        STAGED=staged,
        num_warps=4,
    )
    return part


@functools.cache
def _x_layout(mt: int, bk: int):
    return gl.NVMMASharedLayout.get_default_for([mt, bk], gl.bfloat16)
