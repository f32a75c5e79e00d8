"""Packed MLX affine weights on the GPU: the one unpacking sequence every product and the
dequantize kernel share (value = scale * q + bias, one explicit fma, rounded once to bf16)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _as_float(val, BITS: tl.constexpr):
    """The low BITS of each word as fp32 without an int-to-float conversion (a slow instruction):
    2^23 + q has q in its mantissa, and subtracting 2^23 is exact, so the value is the same."""
    return ((val & ((1 << BITS) - 1)) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _words4(words, BLOCK_N: tl.constexpr, C: tl.constexpr):
    """The four words of [BLOCK_N, C, 4] as four tensors [BLOCK_N, C]."""
    even, odd = tl.split(tl.reshape(words, (BLOCK_N, C, 2, 2)))
    w0, w2 = tl.split(even)
    w1, w3 = tl.split(odd)
    return w0, w1, w2, w3


@triton.jit
def _pick(idx, w0, w1, w2, w3, w4, W: tl.constexpr):
    """Word idx of a chunk (idx < W), per value: a chain of selects over the chunk's words."""
    out = tl.where(idx == 1, w1, w0)
    out = tl.where(idx == 2, w2, out)
    if W > 3:
        out = tl.where(idx == 3, w3, out)
        out = tl.where(idx == 4, w4, out)
    return out


@triton.jit
def _chunked(
    w_ptr,
    o_n,
    N,
    k0,
    stride_w,
    BITS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """3, 5 and 6 bits [BLOCK_N, BLOCK_K]: the row's bitstream read a chunk at a time, a chunk
    being the fewest whole words that end on a value (16 values in 3 words at 6 bits, 32 in 3 or
    5 words at 3 or 5 bits). Each value takes its bits from one or two of its chunk's words, picked
    in registers: one load per word, where reading each value from its place costs two a value."""
    V: tl.constexpr = 16 if BITS == 6 else 32  # values a chunk
    W: tl.constexpr = V * BITS // 32  # its words: 3 or 5
    P: tl.constexpr = 4 if W < 4 else 8  # loaded as a power of two, the extra words masked
    C: tl.constexpr = BLOCK_K // V
    o_t = tl.arange(0, P)
    p_w = (
        w_ptr
        + o_n[:, None, None] * stride_w
        + (k0 * BITS // 32 + tl.arange(0, C) * W)[None, :, None]
        + o_t[None, None, :]
    )
    ok = (o_n[:, None, None] < N) & (o_t[None, None, :] < W)
    words = tl.load(p_w, mask=ok, other=0).to(tl.uint32, bitcast=True)  # [BLOCK_N, C, P]
    if P == 4:
        w0, w1, w2, w3 = _words4(words, BLOCK_N, C)
        w4 = w3
    else:  # words 0-3 and 4-7 apart
        low, high = tl.split(tl.permute(tl.reshape(words, (BLOCK_N, C, 2, 4)), (0, 1, 3, 2)))
        w0, w1, w2, w3 = _words4(low, BLOCK_N, C)
        w4, _, _, _ = _words4(high, BLOCK_N, C)
    bit = tl.arange(0, V) * BITS  # value j's first bit in its chunk
    idx = (bit // 32)[None, None, :]
    shift = (bit % 32).to(tl.uint32)[None, None, :]
    w0, w1, w2, w3, w4 = (
        w0[:, :, None],
        w1[:, :, None],
        w2[:, :, None],
        w3[:, :, None],
        w4[:, :, None],
    )
    lo = _pick(idx, w0, w1, w2, w3, w4, W) >> shift
    hi = _pick(idx + 1, w0, w1, w2, w3, w4, W) << ((32 - shift) & 31)
    val = tl.where(shift > 32 - BITS, lo | hi, lo)  # the value runs into the next word
    return tl.reshape(val, (BLOCK_N, BLOCK_K))


@triton.jit
def _unpacked(
    w_ptr,
    s_ptr,
    b_ptr,
    o_n,
    N,
    k0,
    stride_w,
    stride_s,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """The weight tile [BLOCK_K, BLOCK_N] dequantized: fma(q, scale, bias) in fp32, rounded once to
    bf16 by the caller; the products and `dequantize` both take it from here. Whole values per word
    are unpacked from row-major words, then transposed; 3, 5 and 6 bits are read from their place in
    the row's bitstream (a value may straddle two words). A tile spans GROUPS whole scale groups
    (or lies in one)."""
    o_k = tl.arange(0, BLOCK_K)
    if 32 % BITS == 0:
        PER: tl.constexpr = 32 // BITS
        o_w = tl.arange(0, BLOCK_K // PER)
        words = tl.load(
            w_ptr + o_n[:, None] * stride_w + (k0 // PER + o_w)[None, :],
            mask=o_n[:, None] < N,
            other=0,
        ).to(tl.uint32, bitcast=True)
        shifts = (tl.arange(0, PER) * BITS).to(tl.uint32)
        val = tl.trans(tl.reshape(words[:, :, None] >> shifts[None, None, :], (BLOCK_N, BLOCK_K)))
    elif BLOCK_K % (16 if BITS == 6 else 32) == 0:
        val = tl.trans(_chunked(w_ptr, o_n, N, k0, stride_w, BITS, BLOCK_N, BLOCK_K))
    else:  # a step narrower than one chunk: each value read from its place (slow, never chosen)
        n_mask = o_n[None, :] < N
        bit = (k0 + o_k) * BITS
        word, shift = bit // 32, (bit % 32).to(tl.uint32)
        p_w = w_ptr + o_n[None, :] * stride_w + word[:, None]
        val = tl.load(p_w, mask=n_mask, other=0).to(tl.uint32, bitcast=True) >> shift[:, None]
        hi = tl.load(p_w + 1, mask=n_mask & ((shift[:, None] + BITS) > 32), other=0).to(
            tl.uint32, bitcast=True
        )
        val = val | tl.where(shift[:, None] > 0, hi << (32 - shift[:, None]), 0)
    q = _as_float(val, BITS)
    g = k0 // GROUP
    if GROUPS == 1:  # the tile lies in one scale group
        scale = tl.load(s_ptr + o_n * stride_s + g, mask=o_n < N, other=0.0).to(tl.float32)[None, :]
        bias = tl.load(b_ptr + o_n * stride_s + g, mask=o_n < N, other=0.0).to(tl.float32)[None, :]
    else:  # one load per group, widened to its columns
        p_s = o_n[None, :] * stride_s + (g + tl.arange(0, GROUPS))[:, None]
        scale = tl.load(s_ptr + p_s, mask=o_n[None, :] < N, other=0.0).to(tl.float32)
        bias = tl.load(b_ptr + p_s, mask=o_n[None, :] < N, other=0.0).to(tl.float32)
        scale = tl.reshape(
            tl.broadcast_to(scale[:, None, :], (GROUPS, BLOCK_K // GROUPS, BLOCK_N)),
            (BLOCK_K, BLOCK_N),
        )
        bias = tl.reshape(
            tl.broadcast_to(bias[:, None, :], (GROUPS, BLOCK_K // GROUPS, BLOCK_N)),
            (BLOCK_K, BLOCK_N),
        )
    shape: tl.constexpr = (BLOCK_K, BLOCK_N)
    return tl.fma(q, tl.broadcast_to(scale, shape), tl.broadcast_to(bias, shape))


@triton.jit
def _dequant_kernel(
    w_ptr,
    s_ptr,
    b_ptr,
    out_ptr,
    N,
    K,
    stride_w,
    stride_s,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    o_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    w = _unpacked(
        w_ptr, s_ptr, b_ptr, o_n, N, k0, stride_w, stride_s, BITS, GROUP, 1, BLOCK_N, BLOCK_K
    )
    o_k = k0 + tl.arange(0, BLOCK_K)
    tl.store(
        out_ptr + o_n[None, :].to(tl.int64) * K + o_k[:, None],
        w.to(out_ptr.dtype.element_ty),
        mask=o_n[None, :] < N,
    )


def dequantize(
    words: torch.Tensor,
    scales: torch.Tensor,
    biases: torch.Tensor,
    bits: int,
    group_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Packed MLX affine words [N, K*bits/32] -> [N, K] in dtype, each value as the products make it."""
    n, k = words.shape[0], words.shape[1] * 32 // bits
    out = torch.empty((n, k), dtype=dtype, device=words.device)
    block_k = min(64, group_size)  # inside one scale group
    _dequant_kernel[(triton.cdiv(n, 64), k // block_k)](
        words,
        scales,
        biases,
        out,
        n,
        k,
        words.stride(0),
        scales.stride(0),
        BITS=bits,
        GROUP=group_size,
        BLOCK_N=64,
        BLOCK_K=block_k,
    )
    return out
