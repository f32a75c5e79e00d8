"""Packed 4-bit products of few rows (decode and verify) in Gluon, at the prompt kernels' arithmetic.

The weights sit on the MMA's wide side (yᵀ = W · xᵀ, Hopper wgmma with the weight tile in
registers and the rows, padded to 8 or 16, in shared memory). Each thread loads the words of its
own rows and keeps, of every word, the two values its MMA fragment holds: the fragment of
m64nNk16 gives a thread the K pairs 2c, 2c+1 of every 8 columns (c = lane % 4), and a word holds
8 columns, so the dequantized tile is already in the MMA's operand layout (no shuffle, no
shared-memory round trip). The MMAs run asynchronously: while one step's MMA runs, the next
step's words are dequantized.

The arithmetic is the prompt kernels' (docs/exactness.md, 'Products' and 'Packed weights'):
each value is fma(q, scale, bias) in fp32 rounded once to bf16; each 16-column MMA chains into
the segment's fp32 accumulator from zero, in K order; one program per (weight tile, segment)
stores its segment sum, and the segments are added in order afterwards. The upper value of a
byte is taken as 16·q and multiplied by scale/16: both factors are scaled by exact powers of two,
so the fma sees the same exact product q·scale and rounds the same sum (for any scale above
2^-122, far below any checkpoint's).

Only 4-bit weights at K a multiple of 128, at most 16 rows, on Hopper; `linear.affine_matmul`
runs the Triton swapped form (the same sums) everywhere else.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# every thread's inputs stored before the MMAs read them (renamed barrier() in later Tritons)
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


@gluon.jit
def _pair(words, sel, s_lo, s_hi, bias):
    """Values 2c and 2c+1 of each word (byte c, picked by `sel`). One byte permute builds
    2^23 + lo + 16·hi as an fp32 bit pattern; clearing bits 4-7 leaves 2^23 + lo; the two
    subtractions are exact, giving lo and 16·hi, each in one fma with its matching scale."""
    both = gl.inline_asm_elementwise(
        "prmt.b32 $0, $1, $2, $3;",
        "=r,r,r,r",
        [words, gl.full_like(words, 0x4B000000), sel],
        dtype=gl.int32,
        is_pure=True,
        pack=1,
    )
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
    t = gl.join(lo, hi)  # [RT, 2, 8, 4, NG, KWG, 2]: k = 8 (NG·KWG index) + 2 c + d
    t = gl.permute(t, (0, 1, 2, 4, 5, 3, 6))
    return gl.convert_layout(gl.reshape(t, (BN, BK)), A_LAYOUT, assert_trivial=True)


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
def _affine4_swapped(
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
    GROUP: gl.constexpr,
    SEG: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    MT: gl.constexpr,
    X_LAYOUT: gl.constexpr,
    FAULT: gl.constexpr,
    num_warps: gl.constexpr,
):
    pid_n = gl.program_id(0)
    pid_s = gl.program_id(1)
    NSTEP: gl.constexpr = SEG // BK
    k_seg = pid_s * SEG
    RT: gl.constexpr = BN // 16
    KW: gl.constexpr = BK // 8  # words of a row in one step
    KWG: gl.constexpr = min(GROUP, BK) // 8  # words of one scale group in a step
    NG: gl.constexpr = KW // KWG
    # words [RT, 2, 8, 4, NG, KWG]: row n = 16 rt + 8 h + g, lane 4 g + c, warp rt % 4
    LW: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 2, 1, 1, NG, KWG],
        threads_per_warp=[1, 1, 8, 4, 1, 1],
        warps_per_cta=[num_warps, 1, 1, 1, 1, 1],
        order=[5, 4, 3, 2, 1, 0],
    )
    MMA: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, MT, 16]
    )
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)

    # index tensors of the word layout, each along one axis
    n6 = _axis(RT, 0, 6, LW) * 16 + _axis(2, 1, 6, LW) * 8 + _axis(8, 2, 6, LW) + pid_n * BN
    c6 = _axis(4, 3, 6, LW)
    ng6 = _axis(NG, 4, 6, LW)
    kw6 = _axis(KWG, 5, 6, LW)
    word = ng6 * KWG + kw6
    if FAULT == 1:  # planted for the registry: words 1 and 2 of every 4 swapped (K regrouped)
        word = _swap_bits(word, 1)
    p_w = w_ptr + n6.to(gl.int64) * stride_w + (k_seg // 8 + word) + c6 * 0
    row_ok = (n6 < N) & (c6 >= 0) & (kw6 >= 0)
    sel = 0x7650 + c6 + kw6 * 0 + ng6 * 0 + n6 * 0  # byte c of the word, then 0, 0, 0x4B
    # scales and biases, one per (row, group): [RT, 2, 8, 4, NG], widened over the group's words
    LS: gl.constexpr = gl.SliceLayout(5, LW)
    n5 = _axis(RT, 0, 5, LS) * 16 + _axis(2, 1, 5, LS) * 8 + _axis(8, 2, 5, LS) + pid_n * BN
    c5 = _axis(4, 3, 5, LS)
    ng5 = _axis(NG, 4, 5, LS)
    p_s = n5.to(gl.int64) * stride_s + (k_seg // GROUP + ng5 * (KWG * 8 // GROUP) + c5 * 0)
    s_ok = (n5 < N) & (c5 >= 0) & (ng5 >= 0)

    w0 = gl.load(p_w, mask=row_ok, other=0)  # the first words in flight before the inputs
    # the rows' inputs for the whole segment, once, into shared memory
    LX: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [NSTEP, MT, BK], X_LAYOUT)
    o_xm = gl.arange(0, MT, layout=gl.SliceLayout(1, LX))
    o_xk = gl.arange(0, BK, layout=gl.SliceLayout(0, LX))
    if FAULT == 1:  # the inputs regrouped the same way: the same products, other MMAs
        o_xk = _swap_bits(o_xk, 8)
    for i in gl.static_range(NSTEP):
        xv = gl.load(
            x_ptr + o_xm[:, None] * stride_x + (k_seg + i * BK + o_xk)[None, :],
            mask=o_xm[:, None] < M,
            other=0.0,
        )
        x_smem.index(i).store(xv)
    fence_async_shared()
    _barrier()

    # step i's MMAs run while step i+1's words are dequantized and step i+2's are loaded
    acc = gl.zeros([BN, MT], gl.float32, layout=MMA)
    first_half = gl.zeros([BN, MT], gl.float32, layout=MMA)
    LAST: gl.constexpr = NSTEP - 1
    ahead = gl.load(p_w + min(1, LAST) * KW, mask=row_ok, other=0)
    a = _tile(w0, s_ptr, b_ptr, p_s, s_ok, sel, 0, BN, BK, GROUP, A_LAYOUT)
    for i in range(LAST):
        later = gl.load(p_w + gl.minimum(i + 2, LAST) * KW, mask=row_ok, other=0)
        acc = warpgroup_mma(a, x_smem.index(i).permute((1, 0)), acc, is_async=True)
        nxt = _tile(ahead, s_ptr, b_ptr, p_s, s_ok, sel, i + 1, BN, BK, GROUP, A_LAYOUT)
        acc, a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a))  # `a` lives until then
        a = nxt
        ahead = later
        if FAULT == 2:  # planted for the registry: the segment summed as two chains, then added
            if i == NSTEP // 2 - 1:
                first_half = acc
                acc = gl.zeros([BN, MT], gl.float32, layout=MMA)
    acc = warpgroup_mma(a, x_smem.index(LAST).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    if FAULT == 2:
        acc = first_half + acc

    o_n = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, MMA))
    o_m = gl.arange(0, MT, layout=gl.SliceLayout(0, MMA))
    mask = (o_n[:, None] < N) & (o_m[None, :] < M)
    gl.store(p_ptr + (pid_s * M + o_m)[None, :].to(gl.int64) * N + o_n[:, None], acc, mask=mask)


BN = 64  # weight rows a program: one warpgroup's MMA tile
BK = 128  # K columns a step: 16 words of a row, eight 16-column MMAs


def applies(x: torch.Tensor, bits: int, k: int, segment: int) -> bool:
    """Whether this kernel can run the product: 4-bit words, bf16 rows (at most 16), whole steps
    in each segment, and a Hopper card (wgmma)."""
    return (
        bits == 4
        and x.dtype == torch.bfloat16
        and x.shape[0] <= 16
        and k % BK == 0
        and segment % BK == 0
        and x.is_cuda
        and torch.cuda.get_device_capability(x.device) == (9, 0)
    )


def partials(x, words, scales, biases, group: int, segment: int, fault: int = 0) -> torch.Tensor:
    """Segment sums [K/segment, M, N] in fp32 of x [M, K] · dequant(words [N, K/8])ᵀ (`fault`:
    the registry's planted controls, 1 regrouped K, 2 a segment in two chains)."""
    m, k = x.shape
    n = words.shape[0]
    mt = 8 if m <= 8 else 16  # the rows pad to the MMA's narrow side
    nseg = k // segment
    part = torch.empty((nseg, m, n), dtype=torch.float32, device=x.device)
    _affine4_swapped[(triton.cdiv(n, BN), nseg)](
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
        GROUP=group,
        SEG=segment,
        BN=BN,
        BK=BK,
        MT=mt,
        X_LAYOUT=_x_layout(mt),
        FAULT=fault,
        num_warps=4,
    )
    return part


@functools.cache
def _x_layout(mt: int):
    return gl.NVMMASharedLayout.get_default_for([mt, BK], gl.bfloat16)
