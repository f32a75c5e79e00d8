"""The 5- and 6-bit weight tiles of the Gluon few-row products (gluon_affine.py), in the wgmma
register operand layout like gluon_tiles.py's 4- and 8-bit ones.

At these widths a value's bits do not sit in one byte. A unit is the fewest whole words that hold
whole 8-column blocks: three words for two blocks at 6 bits, five for four at 5. The MMA fragment
gives lane c of a byte group the pair of columns 2c, 2c+1 of each block, 2·BITS bits from bit
8·BITS·b + 2·BITS·c of its unit: one funnel shift of the (one or two) words the pair lies in,
picked by lane with a select. A row's words of a 64-column step (12 at 6 bits, 10 at 5) are
loaded as one vector of 16, the words past the step masked off, and regrouped in registers. The
pair's low value is its low BITS bits; the high one stays in place as 2^BITS·q and is multiplied by
scale/2^BITS, so the fma sees the same exact product q·scale (as the 4-bit tile's 16·q) and each
value is the file's fma(q, scale, bias) rounded once to bf16.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .gluon_tiles import _axis, _operand, _rows


@gluon.jit
def _funnel(lo, hi, shift):
    """The 32 bits of hi:lo from bit `shift` up (0 <= shift < 32): one funnel shift."""
    return gl.inline_asm_elementwise(
        "shf.r.clamp.b32 $0, $1, $2, $3;",
        "=r,r,r,r",
        [lo, hi, shift],
        dtype=gl.int32,
        is_pure=True,
        pack=1,
    )


@gluon.jit
def _field(lo0, lo1, hi0, hi1, c, FIRST: gl.constexpr, BITS: gl.constexpr):
    """Lane c's pair in the 8-column block from bit FIRST of its unit: its first bit is FIRST +
    2·BITS·c, in word lo0 (lo1 for the lanes past that word's end), its last bits in hi0 (hi1)."""
    first = FIRST + 2 * BITS * c
    past = first >= (FIRST // 32 + 1) * 32
    return _funnel(gl.where(past, lo1, lo0), gl.where(past, hi1, hi0), first & 31)


@gluon.jit
def _four(x, L: gl.constexpr):
    """x [..., 2, 2] (in-thread) as its four [...] tensors, index 2a + b, each in L."""
    even, odd = gl.split(x)
    w0, w2 = gl.split(even)
    w1, w3 = gl.split(odd)
    return (
        gl.convert_layout(w0, L, assert_trivial=True),
        gl.convert_layout(w1, L, assert_trivial=True),
        gl.convert_layout(w2, L, assert_trivial=True),
        gl.convert_layout(w3, L, assert_trivial=True),
    )


@gluon.jit
def _unit6(w0, w1, w2, c):
    """Lane c's pairs of a 6-bit unit's two blocks (three words), [..., 2]."""
    return gl.join(_field(w0, w1, w1, w2, c, 0, 6), _field(w1, w2, w2, w2, c, 48, 6))


@gluon.jit
def _unit5(w0, w1, w2, w3, w4, c):
    """Lane c's pairs of a 5-bit unit's four blocks (five words), [..., 2, 2]: block 2h + b at
    [b, h]."""
    b0 = _field(w0, w1, w1, w2, c, 0, 5)
    b1 = _field(w1, w2, w2, w3, c, 40, 5)
    b2 = _field(w2, w3, w3, w4, c, 80, 5)
    b3 = _field(w3, w4, w4, w4, c, 120, 5)
    return gl.join(gl.join(b0, b1), gl.join(b2, b3))


@gluon.jit
def _fields(words, c, BITS: gl.constexpr, RT: gl.constexpr, LS: gl.constexpr):
    """Lane c's pairs of the step's 8 blocks [RT, 2, 8, 4, 8] (block 4u + 2h + b at [b, h, u]
    before the last permute), from the row's words [RT, 2, 8, 4, 4, 4] (word 4q + j)."""
    L5: gl.constexpr = _word_layout(LS, [2, 2])
    L4: gl.constexpr = _word_layout(LS, [])
    q = gl.reshape(words, (RT, 2, 8, 4, 4, 2, 2))
    # word j of every quad [..., 4], then quad by quad: w[j][q] is word 4q + j
    j0, j1, j2, j3 = _four(gl.convert_layout(q, _word_layout(LS, [4, 2, 2]), assert_trivial=True), _word_layout(LS, [4]))  # fmt: skip
    a0, a4, a8, _ = _four(gl.convert_layout(gl.reshape(j0, (RT, 2, 8, 4, 2, 2)), L5, assert_trivial=True), L4)  # fmt: skip
    a1, a5, a9, _ = _four(gl.convert_layout(gl.reshape(j1, (RT, 2, 8, 4, 2, 2)), L5, assert_trivial=True), L4)  # fmt: skip
    a2, a6, a10, _ = _four(gl.convert_layout(gl.reshape(j2, (RT, 2, 8, 4, 2, 2)), L5, assert_trivial=True), L4)  # fmt: skip
    a3, a7, a11, _ = _four(gl.convert_layout(gl.reshape(j3, (RT, 2, 8, 4, 2, 2)), L5, assert_trivial=True), L4)  # fmt: skip
    if BITS == 6:  # units of words 0-2, 3-5, 6-8, 9-11: [b, l, h] is block 4h + 2l + b
        f = gl.join(
            gl.join(_unit6(a0, a1, a2, c), _unit6(a3, a4, a5, c)),
            gl.join(_unit6(a6, a7, a8, c), _unit6(a9, a10, a11, c)),
        )
    else:  # units of words 0-4, 5-9: [b, h, u] is block 4u + 2h + b
        f = gl.join(_unit5(a0, a1, a2, a3, a4, c), _unit5(a5, a6, a7, a8, a9, c))
    return gl.reshape(gl.permute(f, (0, 1, 2, 3, 6, 5, 4)), (RT, 2, 8, 4, 8))


@gluon.jit
def _tile_odd(
    words,
    s_ptr,
    b_ptr,
    p_s,
    s_ok,
    c,
    i,
    BITS: gl.constexpr,
    BN: gl.constexpr,
    BK: gl.constexpr,
    GROUP: gl.constexpr,
    LS: gl.constexpr,
    A_LAYOUT: gl.constexpr,
):
    """Step i's 5- or 6-bit weight tile [BN, BK = 64] in the MMA's operand layout."""
    RT: gl.constexpr = BN // 16
    KBG: gl.constexpr = min(GROUP, BK) // 8
    NG: gl.constexpr = BK // 8 // KBG
    gs = (i * BK) // GROUP
    scale = gl.expand_dims(gl.load(s_ptr + p_s + gs, mask=s_ok, other=0.0).to(gl.float32), 5)
    bias = gl.expand_dims(gl.load(b_ptr + p_s + gs, mask=s_ok, other=0.0).to(gl.float32), 5)
    f = gl.reshape(_fields(words, c, BITS, RT, LS), (RT, 2, 8, 4, NG, KBG))
    f = gl.convert_layout(f, LS, assert_trivial=True)
    MASK: gl.constexpr = (1 << BITS) - 1
    lo = ((f & MASK) | 0x4B000000).to(gl.float32, bitcast=True) - 8388608.0
    hi = ((f & (MASK << BITS)) | 0x4B000000).to(gl.float32, bitcast=True) - 8388608.0  # 2^B · q
    v0 = gl.fma(lo, scale, bias).to(gl.bfloat16)
    v1 = gl.fma(hi, scale * (1.0 / (1 << BITS)), bias).to(gl.bfloat16)
    return _operand(v0, v1, BN, BK, A_LAYOUT)


@triton.constexpr_function
def unit_columns(bits):
    """Columns of a unit at 5 or 6 bits: the fewest whole words holding whole 8-column blocks."""
    return {6: 16, 5: 32}[bits]


@triton.constexpr_function
def _word_layout(ls, inner):
    """A layout of [RT, 2, 8, 4] + inner, every inner axis in one thread's registers, the lanes
    and warps as in LS (the tile's values)."""
    rank = 4 + len(inner)
    return gl.BlockedLayout(
        size_per_thread=[1, 2, 1, 1] + list(inner),
        threads_per_warp=[1, 1, 8, 4] + [1] * len(inner),
        warps_per_cta=[ls.warps_per_cta[0]] + [1] * (rank - 1),
        order=list(reversed(range(rank))),
    )


@gluon.jit
def _operand_odd(w_ptr, n_base, k_seg, N, stride_w, LS: gl.constexpr, RT: gl.constexpr, BITS: gl.constexpr, FAULT: gl.constexpr):  # fmt: skip
    """5- or 6-bit words [RT, 2, 8, 4, 4, 4] of a program's first step: the row's 10 or 12 words
    of the step as one vector (the rest masked off), every lane of a byte group loading the same
    words; and the lanes c [RT, 2, 8, 4]. FAULT == 1 (planted): the units swapped in pairs, so K
    is regrouped across MMAs."""
    LW: gl.constexpr = _word_layout(LS, [4, 4])
    UNIT: gl.constexpr = unit_columns(BITS) * BITS // 32  # words of a unit
    n6 = _rows(n_base, RT, 6, LW)
    c6 = _axis(4, 3, 6, LW)
    word = _axis(4, 4, 6, LW) * 4 + _axis(4, 5, 6, LW)
    ok = word < 2 * BITS  # the step's 64 columns: 2·BITS words
    if FAULT == 1:
        word = word + UNIT - 2 * UNIT * ((word // UNIT) % 2)
    p_w = w_ptr + n6.to(gl.int64) * stride_w + (k_seg * BITS // 32 + word) + c6 * 0
    row_ok = (n6 < N) & (c6 >= 0) & ok
    L4: gl.constexpr = _word_layout(LS, [])
    return p_w, row_ok, _axis(4, 3, 4, L4) + _rows(0, RT, 4, L4) * 0
