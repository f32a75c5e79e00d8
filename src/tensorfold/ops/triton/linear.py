"""Row-invariant products on the GPU: y[M, N] = x[M, K] · W[N, K]ᵀ, bf16 in, fp32 accumulation.

Each weight's reduction plan comes from its (N, K) alone: K is cut into segments of `segment`
columns; each segment is accumulated from zero, one tl.dot per K block in order, and the segments'
sums are added in order (s0 + s1 + s2 ...). Two launch forms realise that one arithmetic:
- whole: one program per (row tile, column tile) walks every segment, adding in registers (prompts,
  and few rows where the tile book times it faster);
- split: one program per (row tile, column tile, segment) stores its fp32 sum, and a second kernel
  adds the segments in order (a few rows: decode and verify), so a one-row product reads the
  weight with as many programs as the card has room for.
A segment's fp32 sum is the same value in both forms (stored exactly), and the additions are the
same, so a row's bits never depend on which form ran or on its company. Row and column tiles and
warps follow M: on the H200 they do not change a bit (docs/exactness.md, 'Measured on the
H200'); the registry checks it. Packed MLX affine weights are dequantized in registers:
w = scale · q + bias, rounded once to bf16.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from ..quant import QuantizedWeight

SEGMENT = 1024  # K columns per segment when K is a larger multiple of it
SPLIT_MAX_ROWS = 64  # at most this many rows use the split form


@dataclass(frozen=True)
class LinearPlan:
    segment: int  # K columns summed from zero before joining the running sum
    block_k: int  # K columns per tl.dot step

    @staticmethod
    def for_weight(n: int, k: int, group_size: int | None = None) -> "LinearPlan":
        """The reduction plan from the matrix's shape alone (and its quantization group: a K block
        never spans two scale groups, so each block's scales are one column)."""
        if k % 16:
            raise ValueError(f"GPU products need an input width divisible by 16, got K={k}")
        segment = SEGMENT if k > SEGMENT and k % SEGMENT == 0 else k
        block = next(b for b in (128, 64, 32, 16) if segment % b == 0)
        if group_size is not None:  # unpacked tiles are larger: 64 columns at most
            block = min(block, group_size, 64)
        return LinearPlan(segment=segment, block_k=block)

    def segments(self, k: int) -> int:
        return k // self.segment


@dataclass(frozen=True)
class Tiles:
    """A launch shape: never part of the arithmetic (the registry checks rows across them)."""

    block_m: int
    block_n: int
    warps: int
    stages: int
    wide: int = 1  # packed weights: plan K blocks dequantized and fed to one tl.dot per step
    whole: bool = (
        False  # few rows in the whole form too (same bits as the split form, no second kernel)
    )
    dequant: bool = (
        False  # packed weights, many rows: dequantized to bf16 once, then the dense kernel
    )

    def step_k(self, plan: "LinearPlan") -> int:
        """K columns per loop step: `wide` plan blocks when the segment holds a whole number of them.
        One tl.dot over 2 or 4 blocks issues the same MMA chain as one per block (a tile's K width
        never changes a bit on the H200: docs/exactness.md, 'Measured on the H200'); the registry
        checks it."""
        k = plan.block_k * self.wide
        return k if plan.segment % k == 0 else plan.block_k


def rows_class(m: int) -> int:
    """Row counts that share a launch shape: decode, verify, short prompt chunks, long ones (the
    tile book times each class apart: a 256-row chunk and a 4,096-row chunk favour different shapes)."""
    return 0 if m <= 16 else 1 if m <= SPLIT_MAX_ROWS else 2 if m <= 512 else 3


def candidates(m: int, packed: bool) -> list[Tiles]:
    """Launch shapes worth timing for m rows; the first is the untimed default. (Measured on the
    H200 and dropped: each 4-bit value gathered from its word, scaling in the words' own layout,
    few packed rows in the whole form, four blocks a step.)"""
    cls = rows_class(m)
    if cls == 0:
        shapes = [Tiles(16, n, 4, 4) for n in (32, 64, 128)]
        more = (
            [Tiles(16, 64, 4, 4, wide=2), Tiles(16, 128, 4, 4, wide=2)]
            if packed
            else [Tiles(16, n, 4, 4, whole=True) for n in (16, 32)]
        )
    elif cls == 1:
        shapes = [Tiles(64, n, 4, 3) for n in (64, 32, 128)]
        more = [Tiles(64, 64, 4, 3, wide=2)] if packed else []
    else:
        shapes = [Tiles(128, 128, 8, 3), Tiles(128, 64, 4, 3), Tiles(64, 128, 4, 3)]
        # many rows: the wider step, or each weight unpacked once to bf16 rather than once per row tile
        more = (
            [
                Tiles(128, 128, 8, 3, wide=2),
                Tiles(128, 128, 8, 3, dequant=True),
                Tiles(64, 128, 4, 3, dequant=True),
            ]
            if packed
            else []
        )
    return shapes + more


@triton.jit
def _dense_segment(
    x_ptr,
    w_ptr,
    o_m,
    o_n,
    M,
    N,
    k_begin,
    stride_x,
    stride_w,
    SEG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    o_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(SEG // BLOCK_K):
        k0 = k_begin + i * BLOCK_K
        b_x = tl.load(
            x_ptr + o_m[:, None] * stride_x + (k0 + o_k)[None, :], mask=o_m[:, None] < M, other=0.0
        )
        b_w = tl.load(
            w_ptr + o_n[:, None] * stride_w + (k0 + o_k)[None, :], mask=o_n[:, None] < N, other=0.0
        )
        acc = tl.dot(b_x, tl.trans(b_w), acc)
    return acc


@triton.jit
def _as_float(val, BITS: tl.constexpr):
    """The low BITS of each word as fp32 without an int-to-float conversion (a slow instruction):
    2^23 + q has q in its mantissa, and subtracting 2^23 is exact, so the value is the same."""
    return ((val & ((1 << BITS) - 1)) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


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
    else:
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
def _affine_segment(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    o_m,
    o_n,
    M,
    N,
    k_begin,
    stride_x,
    stride_w,
    stride_s,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
    SEG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    o_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(SEG // BLOCK_K):
        k0 = k_begin + i * BLOCK_K
        b_x = tl.load(
            x_ptr + o_m[:, None] * stride_x + (k0 + o_k)[None, :], mask=o_m[:, None] < M, other=0.0
        )
        b_w = _unpacked(
            w_ptr,
            s_ptr,
            b_ptr,
            o_n,
            N,
            k0,
            stride_w,
            stride_s,
            BITS,
            GROUP,
            GROUPS,
            BLOCK_N,
            BLOCK_K,
        )
        acc = tl.dot(b_x, b_w.to(x_ptr.dtype.element_ty), acc)
    return acc


@triton.jit
def _store(acc, y_ptr, p_ptr, o_m, o_n, M, N, stride_y, pid_s, SPLIT: tl.constexpr):
    mask = (o_m[:, None] < M) & (o_n[None, :] < N)
    if SPLIT:  # this segment's exact fp32 sum, added to the others by _sum_segments
        tl.store(p_ptr + (pid_s * M + o_m)[:, None].to(tl.int64) * N + o_n[None, :], acc, mask=mask)
    else:
        tl.store(
            y_ptr + o_m[:, None] * stride_y + o_n[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=mask,
        )


@triton.jit
def _dense_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    p_ptr,
    M,
    N,
    stride_x,
    stride_w,
    stride_y,
    SEG: tl.constexpr,
    NSEG: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if SPLIT:
        acc = _dense_segment(
            x_ptr,
            w_ptr,
            o_m,
            o_n,
            M,
            N,
            pid_s * SEG,
            stride_x,
            stride_w,
            SEG,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
    else:
        acc = _dense_segment(
            x_ptr, w_ptr, o_m, o_n, M, N, 0, stride_x, stride_w, SEG, BLOCK_M, BLOCK_N, BLOCK_K
        )
        for s in range(1, NSEG):
            acc += _dense_segment(
                x_ptr,
                w_ptr,
                o_m,
                o_n,
                M,
                N,
                s * SEG,
                stride_x,
                stride_w,
                SEG,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
            )
    _store(acc, y_ptr, p_ptr, o_m, o_n, M, N, stride_y, pid_s, SPLIT)


@triton.jit
def _affine_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    y_ptr,
    p_ptr,
    M,
    N,
    stride_x,
    stride_w,
    stride_s,
    stride_y,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
    SEG: tl.constexpr,
    NSEG: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if SPLIT:
        acc = _affine_segment(
            x_ptr,
            w_ptr,
            s_ptr,
            b_ptr,
            o_m,
            o_n,
            M,
            N,
            pid_s * SEG,
            stride_x,
            stride_w,
            stride_s,
            BITS,
            GROUP,
            GROUPS,
            SEG,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
    else:
        acc = _affine_segment(
            x_ptr,
            w_ptr,
            s_ptr,
            b_ptr,
            o_m,
            o_n,
            M,
            N,
            0,
            stride_x,
            stride_w,
            stride_s,
            BITS,
            GROUP,
            GROUPS,
            SEG,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
        for s in range(1, NSEG):
            acc += _affine_segment(
                x_ptr,
                w_ptr,
                s_ptr,
                b_ptr,
                o_m,
                o_n,
                M,
                N,
                s * SEG,
                stride_x,
                stride_w,
                stride_s,
                BITS,
                GROUP,
                GROUPS,
                SEG,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
            )
    _store(acc, y_ptr, p_ptr, o_m, o_n, M, N, stride_y, pid_s, SPLIT)


@triton.jit
def _sum_segments(p_ptr, y_ptr, M, N, stride_y, NSEG: tl.constexpr, BLOCK: tl.constexpr):
    m = tl.program_id(0)
    o_n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = o_n < N
    acc = tl.load(p_ptr + m.to(tl.int64) * N + o_n, mask=mask, other=0.0)
    for s in range(1, NSEG):  # in segment order, as the whole form adds them
        acc += tl.load(p_ptr + (s * M + m).to(tl.int64) * N + o_n, mask=mask, other=0.0)
    tl.store(y_ptr + m * stride_y + o_n, acc.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(
    kernel,
    x: torch.Tensor,
    weights: tuple,
    weight_strides: tuple,
    n: int,
    out: torch.Tensor | None,
    plan: LinearPlan,
    t: Tiles,
    **consts,
) -> torch.Tensor:
    """Runs the whole or the split form of `kernel` (then the in-order sum of the segments)."""
    m, k = x.shape
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    nseg = plan.segments(k)
    split = nseg > 1 and m <= SPLIT_MAX_ROWS and not t.whole
    partial = torch.empty((nseg, m, n), dtype=torch.float32, device=x.device) if split else y
    grid = (triton.cdiv(m, t.block_m), triton.cdiv(n, t.block_n), nseg if split else 1)
    kernel[grid](
        x,
        *weights,
        y,
        partial,
        m,
        n,
        x.stride(0),
        *weight_strides,
        y.stride(0),
        **consts,
        SEG=plan.segment,
        NSEG=nseg,
        SPLIT=split,
        BLOCK_M=t.block_m,
        BLOCK_N=t.block_n,
        BLOCK_K=t.step_k(plan),
        num_warps=t.warps,
        num_stages=t.stages,
    )
    if split:
        _sum_segments[(m, triton.cdiv(n, 1024))](
            partial, y, m, n, y.stride(0), NSEG=nseg, BLOCK=1024
        )
    return y


def dense_matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    plan: LinearPlan,
    out: torch.Tensor | None = None,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """x [M, K] bf16 · w [N, K]ᵀ -> [M, N] in x's dtype."""
    t = tiles or candidates(x.shape[0], packed=False)[0]
    return _launch(_dense_kernel, x, (w,), (w.stride(0),), w.shape[0], out, plan, t)


def affine_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    biases: torch.Tensor,
    bits: int,
    group_size: int,
    plan: LinearPlan,
    out: torch.Tensor | None = None,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """x [M, K] · dequant(packed [N, K*bits/32], scales/biases [N, K/gs])ᵀ -> [M, N]."""
    t = tiles or candidates(x.shape[0], packed=True)[0]
    words = packed.view(torch.int32)
    if t.dequant:
        # The same bf16 values (one fma, one rounding) and the same segments (they follow K alone);
        # the K block may differ, which never changes a bit (the registry checks this shape too).
        w = dequantize(words, scales, biases, bits, group_size, x.dtype)
        return _launch(
            _dense_kernel,
            x,
            (w,),
            (w.stride(0),),
            w.shape[0],
            out,
            LinearPlan.for_weight(*w.shape),
            replace(t, dequant=False),
        )
    return _launch(
        _affine_kernel,
        x,
        (words, scales, biases),
        (words.stride(0), scales.stride(0)),
        packed.shape[0],
        out,
        plan,
        t,
        BITS=bits,
        GROUP=group_size,
        GROUPS=max(t.step_k(plan) // group_size, 1),
    )


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


def gpu_seconds(fn, reps: int) -> float:
    """Device time per call of fn (already run once): `reps` calls captured in a CUDA graph and
    replayed, so Python's launch cost is not counted (decode passes replay from a graph too)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()  # the first replay uploads the graph
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / reps / 1e3


class TileBook:
    """Launch shapes chosen once per (product, rows class, N, K, format) by timing the candidates on
    the card, shared by every layer of a model. Only speed follows the choice: a row's bits are the
    same under every candidate (registry and tests/test_gpu.py)."""

    def __init__(self, reps: int = 10) -> None:
        self.chosen: dict[tuple, Tiles] = {}
        self.reps = reps

    def pick(self, key: tuple, m: int, packed: bool, run) -> Tiles:
        """The launch shape for a product of m rows; `key` names the product and its rows class."""
        if key in self.chosen:
            return self.chosen[key]
        options = candidates(m, packed)
        if len(options) == 1 or torch.cuda.is_current_stream_capturing():
            return options[0]
        times = {}
        for t in options:
            try:
                run(t)  # compiles, and warms the caches
            except Exception:  # noqa: BLE001 - a shape the card cannot launch is not a choice
                if t is options[0]:
                    raise
                continue
            times[t] = gpu_seconds(lambda: run(t), self.reps)  # noqa: B023
        self.chosen[key] = min(times, key=times.get) if times else options[0]
        return self.chosen[key]


def matmul(
    x: torch.Tensor, w: "torch.Tensor | QuantizedWeight", book: TileBook | None = None
) -> torch.Tensor:
    """x [M, K] · wᵀ for a dense or packed weight, in the launch shape the tile book picked for
    this product and rows class (the default shape without a book). The plan follows (N, K) alone."""
    n, k = w.shape
    packed = isinstance(w, QuantizedWeight)
    plan = LinearPlan.for_weight(n, k, w.group_size if packed else None)
    x = x.contiguous()
    if packed:
        run = lambda t: affine_matmul(
            x,
            w.packed,
            w.scales,
            w.biases,
            w.bits,
            w.group_size,  # noqa: E731
            plan,
            tiles=t,
        )
        fmt = (w.bits, w.group_size)
    else:
        run = lambda t: dense_matmul(x, w, plan, tiles=t)  # noqa: E731
        fmt = (str(w.dtype),)
    m = x.shape[0]
    if book is None:
        return run(candidates(m, packed)[0])
    return run(book.pick((rows_class(m), n, k, *fmt), m, packed, run))
