"""MLX affine quantization: bit unpacking and dequantization (docs/model.md, 'MLX affine packing').

Each row of a packed weight is one little-endian, LSB-first bitstream of `bits`-bit
unsigned values; groups of `group_size` consecutive values share a scale and a bias:
    w = scale * q + bias
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """[..., W] uint32/int32 words -> [..., W*32/bits] uint8 values q."""
    words = packed.contiguous().view(torch.int32)
    if 32 % bits == 0:
        # Values never straddle words: shift and mask each word.
        per_word = 32 // bits
        shifts = torch.arange(per_word, dtype=torch.int32, device=words.device) * bits
        q = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
        return q.reshape(*words.shape[:-1], -1).to(torch.uint8)
    # 3, 5, 6 bits: expand the byte stream to single bits, regroup `bits` at a time.
    stream = words.view(torch.uint8)
    bit_idx = torch.arange(8, dtype=torch.uint8, device=words.device)
    stream_bits = (stream.unsqueeze(-1) >> bit_idx) & 1
    stream_bits = stream_bits.reshape(*words.shape[:-1], -1, bits)
    weights = (1 << torch.arange(bits, device=words.device)).to(torch.int32)
    return (stream_bits.to(torch.int32) * weights).sum(-1).to(torch.uint8)


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of `unpack`: [..., K] values in [0, 2^bits) -> [..., K*bits/32] uint32 words."""
    if q.shape[-1] * bits % 32:
        raise ValueError(f"{q.shape[-1]} values of {bits} bits do not fill whole 32-bit words")
    # bytes throughout (a value has at most 8 bits): an lm-head's int64 bit stream took ~45 GiB
    bit_idx = torch.arange(bits, device=q.device, dtype=torch.uint8)
    stream = (q.to(torch.uint8).unsqueeze(-1) >> bit_idx).bitwise_and_(1)
    stream = stream.reshape(*q.shape[:-1], -1, 8)
    shifts = torch.arange(8, device=q.device, dtype=torch.uint8)
    byte_vals = (stream << shifts).sum(-1, dtype=torch.uint8)
    return byte_vals.contiguous().view(torch.int32).view(torch.uint32)


def dequantize(
    packed: torch.Tensor,
    scales: torch.Tensor,
    biases: torch.Tensor,
    bits: int,
    group_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """[..., K*bits/32] packed + [..., K/gs] scales/biases -> [..., K] weights in `dtype`.

    Computed in fp32 (fp64 for a float64 run) and rounded once to `dtype`.
    """
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    q = unpack(packed, bits).to(acc)
    groups = q.reshape(*q.shape[:-1], -1, group_size)
    w = groups * scales.to(acc).unsqueeze(-1) + biases.to(acc).unsqueeze(-1)
    return w.reshape(q.shape).to(dtype)


def quantize(w: torch.Tensor, bits: int, group_size: int):
    """A simple affine quantizer (min/max per group) producing MLX-layout tensors.

    Used to make random quantized checkpoints; real files come from mlx_lm.
    """
    groups = w.float().reshape(*w.shape[:-1], -1, group_size)
    lo, hi = groups.amin(-1), groups.amax(-1)
    scale = ((hi - lo) / ((1 << bits) - 1)).clamp_min(1e-7)
    q = ((groups - lo.unsqueeze(-1)) / scale.unsqueeze(-1)).round().clamp(0, (1 << bits) - 1)
    packed = pack(q.reshape(w.shape).to(torch.uint8), bits)
    return packed, scale.to(w.dtype), lo.to(w.dtype)


@dataclass(frozen=True)
class QuantizedWeight:
    """An MLX affine weight kept packed: [N, K*bits/32] words, [N, K/gs] scales and biases."""

    packed: torch.Tensor
    scales: torch.Tensor
    biases: torch.Tensor
    bits: int
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.packed.shape[1] * 32 // self.bits

    def rows(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(
            self.packed[start:stop],
            self.scales[start:stop],
            self.biases[start:stop],
            self.bits,
            self.group_size,
            dtype,
        )

    def take(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        words = self.packed.view(torch.int32)  # CUDA cannot index uint32 tensors
        return dequantize(
            words[ids], self.scales[ids], self.biases[ids], self.bits, self.group_size, dtype
        )

    @property
    def device(self) -> torch.device:
        return self.packed.device

    # the held values are a cache beside the frozen fields (as single_rounding's below): kept in
    # the instance's __dict__, outside equality and the dataclass's fields
    def unpacked(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The whole weight dequantized to `dtype`, when it is held so (`hold_unpacked`)."""
        held = self.__dict__.get("held_unpacked")
        return held if held is not None and held.dtype == dtype else None

    def hold_unpacked(self, values: torch.Tensor) -> None:
        """Keeps `values` (this weight's dequantized values, as the products' own dequantization
        makes them) beside the packed form: products that dequantize the whole weight first
        read them instead (the same values: the same bits, fewer passes over the weight)."""
        if tuple(values.shape) != self.shape:
            raise ValueError(f"unpacked values {tuple(values.shape)} for a weight of {self.shape}")
        self.__dict__["held_unpacked"] = values

    def release_unpacked(self) -> None:
        self.__dict__.pop("held_unpacked", None)

    @property
    def unpacked_nbytes(self) -> int:
        held = self.__dict__.get("held_unpacked")
        return 0 if held is None else held.numel() * held.element_size()

    @functools.cached_property
    def single_rounding(self) -> bool:
        """Whether bf16x2 dequantization gives this weight's values (see `single_rounding`);
        computed once, on first use."""
        return single_rounding(self.scales, self.biases, self.bits)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales, self.biases))

    def to(self, device: torch.device) -> "QuantizedWeight":
        return QuantizedWeight(
            self.packed.to(device),
            self.scales.to(device),
            self.biases.to(device),
            self.bits,
            self.group_size,
        )


def single_rounding(scales: torch.Tensor, biases: torch.Tensor, bits: int) -> bool:
    """Whether every value `scale · q + bias` of these groups (q any `bits`-bit value) is exact
    in fp32, so that the fp32 fma rounded to bf16 (the GPU's dequantization) equals the same
    fma rounded once to bf16 (bf16x2 arithmetic). bf16 scales and biases carry 8 significant
    bits: q · scale lies in [2^(Es-7), 2^(Es+1+bits)), the bias in [2^(Eb-7), 2^(Eb+1)), and the
    sum fits fp32's 24 bits when max(Es + bits, Eb) - min(Es, Eb) <= 15. The lowest bit stays
    at or above 2^-126 (no subnormal result) and the highest below 2^127."""
    if scales.dtype != torch.bfloat16 or biases.dtype != torch.bfloat16 or bits > 8:
        return False
    ok = True
    for s, b in zip(scales.reshape(-1).split(1 << 24), biases.reshape(-1).split(1 << 24)):
        s, b = s.float(), b.float()
        if not bool(torch.isfinite(s).all() & torch.isfinite(b).all()):
            return False
        es = torch.frexp(s).exponent - 1  # floor(log2 |s|) for s != 0
        eb = torch.where(b == 0, es, torch.frexp(b).exponent - 1)
        low, high = torch.minimum(es, eb), torch.maximum(es + bits, eb)
        fits = (high - low <= 15) & (low >= -119) & (high <= 124)
        ok &= bool((fits | (s == 0)).all())  # s == 0: every value is the bias itself
        if not ok:
            return False
    return ok
