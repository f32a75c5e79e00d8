"""The weight tiles of the Gluon few-row products (gluon_affine.py), built in registers directly
in the wgmma register operand layout: words loaded (or staged in shared memory by async copies)
per thread as its MMA fragment needs them, dequantized with byte permutes and one fma a value.

The fragment of m64nNk16 gives a thread the K pairs 2c, 2c+1 of every 8 columns (c = lane % 4).
A 4-bit word holds 8 columns (the pair is byte c); at 8 bits an 8-column block is two words (the
pair is bytes 2(c % 2) and 2(c % 2) + 1 of word c // 2); 5- and 6-bit tiles are in gluon_odd.py.
Each value is fma(q, scale, bias) in fp32 rounded once to bf16; the upper value of a byte is taken
as 16·q and multiplied by scale/16: both factors are scaled by exact powers of two, so the fma sees
the same exact product q·scale and rounds the same sum (for any scale above 2^-122, far below any
checkpoint's).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

# every thread's inputs stored before the MMAs read them (renamed barrier() in later Tritons)
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
# global -> shared copies in flight (cp.async; renamed async_load in later Tritons)
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


@gluon.jit
def _pdl_start(PDL: gl.constexpr):
    """launch.pdl_start for the Gluon kernels (which call no triton.jit function): wait for the
    kernel before, then let the next one launch."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


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
def _doubled(v):
    """A bf16 value in both halves of a 32-bit register (a bf16x2 operand)."""
    return gl.inline_asm_elementwise(
        "mov.b32 $0, {$1, $1};", "=r,h", [v], dtype=gl.int32, is_pure=True, pack=1
    )


_NIBBLES = gl.constexpr(
    "shr.u32 t, $2, 4;\nprmt.b32 u, $2, t, $3;\nlop3.b32 u, u, 0x000F000F, 0x43004300, 0xEA;\n"
)
_SINGLE = gl.constexpr("fma.rn.bf16x2 u, u, $6, $7;\nfma.rn.bf16x2 u, u, $4, $5;\n")
# planted for the registry: 128 folded into the bias first, fma(128 + q, scale, bias - 128·scale),
# a rounding at another point
_FOLDED = gl.constexpr("fma.rn.bf16x2 t, $4, $7, $5;\nfma.rn.bf16x2 u, u, $4, t;\n")


@gluon.jit
def _pair_bf16x2(words, sel2, scale2, bias2, HFMA: gl.constexpr):
    """Values 2c and 2c+1 of each word in bf16x2 arithmetic, for weights whose fp32 fma is
    exact (quant.single_rounding): one byte permute puts byte c of the word and of the word
    shifted by 4 in the two halves, one lop3 keeps their low nibbles under 0x4300 (128 + q as
    bf16, exact), one bf16x2 fma takes 128 away (exact) and one computes q·scale + bias,
    rounded once: five instructions a pair where the fp32 form takes seven. HFMA == 2 is the
    planted fold (_FOLDED)."""
    return gl.inline_asm_elementwise(
        "{ .reg .b32 t, u;\n"
        + _NIBBLES
        + (_FOLDED if HFMA == 2 else _SINGLE)
        + "mov.b32 {$0, $1}, u; }",
        "=h,=h,r,r,r,r,r,r",
        [
            words,
            sel2,
            scale2,
            bias2,
            gl.full_like(words, 0x3F803F80),
            gl.full_like(words, -1023360256),
        ],
        dtype=(gl.bfloat16, gl.bfloat16),
        is_pure=True,
        pack=1,
    )  # the last two: 1.0 and -128.0 in both halves


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
    HFMA: gl.constexpr = 0,
):
    """Step i's weight tile [BN, BK] in bf16, in the MMA's register operand layout (HFMA 1: in
    bf16x2 arithmetic, the same values for weights quant.single_rounding passes; 2: planted)."""
    gs = (i * BK) // GROUP
    if HFMA > 0:
        sel2 = (sel - 0x7650) * 0x1111 + 0x4400  # byte c of the word (0-3), then of word >> 4 (4-7)
        scale2 = _doubled(gl.load(s_ptr + p_s + gs, mask=s_ok, other=0.0))
        bias2 = _doubled(gl.load(b_ptr + p_s + gs, mask=s_ok, other=0.0))
        s2, b2 = gl.expand_dims(scale2, 5), gl.expand_dims(bias2, 5)
        lo, hi = _pair_bf16x2(words, sel2, s2, b2, HFMA)
        return _operand(lo, hi, BN, BK, A_LAYOUT)
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
