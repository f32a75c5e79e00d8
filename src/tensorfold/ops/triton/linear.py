"""Row-invariant products on the GPU: y[M, N] = x[M, K] · W[N, K]ᵀ, bf16 in, fp32 accumulation.

One program owns a tile of rows and output columns and walks K in order, BLOCK_K at a time, with
one tl.dot per step. The K block is the weight's reduction plan, fixed from its (N, K) alone; the
row and column tiles follow M (measured on the H200: they do not change a bit, a split of K would).
Packed MLX affine weights are unpacked and dequantized in registers: w = scale · q + bias, rounded
once to bf16, as the CPU reference does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class LinearPlan:
    block_k: int

    @staticmethod
    def for_weight(n: int, k: int, group_size: int | None = None) -> "LinearPlan":
        """The reduction plan from the matrix's shape alone (and its quantization group)."""
        block = 64 if k % 128 else 128
        if group_size is not None:
            block = min(block, group_size)      # a K block never spans two scale groups
        return LinearPlan(block_k=block)


def _tiles(m: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, warps) by the number of rows: narrow column tiles when rows are few."""
    if m <= 16:
        return 16, 32, 4
    if m <= 64:
        return 64, 64, 4
    return 128, 128, 8


@triton.jit
def _dense_kernel(x_ptr, w_ptr, y_ptr, M, N, K: tl.constexpr, stride_x, stride_w, stride_y,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    o_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        b_x = tl.load(x_ptr + o_m[:, None] * stride_x + (k0 + o_k)[None, :], mask=o_m[:, None] < M, other=0.0)
        b_w = tl.load(w_ptr + o_n[None, :] * stride_w + (k0 + o_k)[:, None], mask=o_n[None, :] < N, other=0.0)
        acc = tl.dot(b_x, b_w, acc)
    mask = (o_m[:, None] < M) & (o_n[None, :] < N)
    tl.store(y_ptr + o_m[:, None] * stride_y + o_n[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _affine_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K: tl.constexpr, stride_x, stride_w, stride_s, stride_y,
                   BITS: tl.constexpr, GROUP: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    o_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    n_mask = o_n[None, :] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        b_x = tl.load(x_ptr + o_m[:, None] * stride_x + (k0 + o_k)[None, :], mask=o_m[:, None] < M, other=0.0)
        if 32 % BITS == 0:
            # Whole values per word: load the words row-major (coalesced), then unpack in registers.
            PER: tl.constexpr = 32 // BITS
            o_w = tl.arange(0, BLOCK_K // PER)
            p_w = w_ptr + o_n[:, None] * stride_w + (k0 // PER + o_w)[None, :]
            words = tl.load(p_w, mask=o_n[:, None] < N, other=0).to(tl.uint32, bitcast=True)
            shifts = (tl.arange(0, PER) * BITS).to(tl.uint32)
            val = tl.reshape(words[:, :, None] >> shifts[None, None, :], (BLOCK_N, BLOCK_K))
            val = tl.trans(val)
        else:
            bit = (k0 + o_k) * BITS                           # each value's place in the row's bitstream
            word, shift = bit // 32, (bit % 32).to(tl.uint32)
            p_w = w_ptr + o_n[None, :] * stride_w + word[:, None]
            lo = tl.load(p_w, mask=n_mask, other=0).to(tl.uint32, bitcast=True)
            val = lo >> shift[:, None]
            # 3, 5, 6 bits: a value may straddle two words
            hi = tl.load(p_w + 1, mask=n_mask & ((shift[:, None] + BITS) > 32), other=0).to(tl.uint32, bitcast=True)
            val = val | tl.where(shift[:, None] > 0, hi << (32 - shift[:, None]), 0)
        q = (val & ((1 << BITS) - 1)).to(tl.float32)
        g = (k0 // GROUP)
        scale = tl.load(s_ptr + o_n * stride_s + g, mask=o_n < N, other=0.0).to(tl.float32)
        bias = tl.load(b_ptr + o_n * stride_s + g, mask=o_n < N, other=0.0).to(tl.float32)
        b_w = (q * scale[None, :] + bias[None, :]).to(x_ptr.dtype.element_ty)
        acc = tl.dot(b_x, b_w, acc)
    mask = (o_m[:, None] < M) & n_mask
    tl.store(y_ptr + o_m[:, None] * stride_y + o_n[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


def dense_matmul(x: torch.Tensor, w: torch.Tensor, plan: LinearPlan, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] bf16 · w [N, K]ᵀ -> [M, N] in x's dtype."""
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    bm, bn, warps = _tiles(m)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _dense_kernel[grid](x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
                        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=plan.block_k, num_warps=warps)
    return y


def affine_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
                  bits: int, group_size: int, plan: LinearPlan, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] · dequant(packed [N, K*bits/32], scales/biases [N, K/gs])ᵀ -> [M, N]."""
    m, k = x.shape
    n = packed.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    bm, bn, warps = _tiles(m)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    words = packed.view(torch.int32)
    _affine_kernel[grid](x, words, scales, biases, y, m, n, k, x.stride(0), words.stride(0), scales.stride(0),
                         y.stride(0), BITS=bits, GROUP=group_size, BLOCK_M=bm, BLOCK_N=bn,
                         BLOCK_K=plan.block_k, num_warps=warps)
    return y
