"""MLX affine packing: hand-computed words for every bit width, including values that straddle
32-bit words, and agreement with mlx's own dequantize."""

import pytest
import torch

from tensorfold.config import SUPPORTED_BITS
from tensorfold.ops.quant import dequantize, pack, quantize, single_rounding, unpack


def _hand_pack(values: list[int], bits: int) -> list[int]:
    """The row as one LSB-first bitstream, cut into little-endian 32-bit words (by hand)."""
    stream = 0
    for i, v in enumerate(values):
        stream |= v << (i * bits)
    n_words = len(values) * bits // 32
    return [(stream >> (32 * w)) & 0xFFFFFFFF for w in range(n_words)]


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_unpack_matches_hand_packed_stream(bits):
    g = torch.Generator().manual_seed(bits)
    values = torch.randint(0, 1 << bits, (2, 64), generator=g)
    words = torch.tensor([_hand_pack(row.tolist(), bits) for row in values], dtype=torch.int64)
    packed = (
        words.to(torch.int64).apply_(lambda w: w - (1 << 32) if w >= 1 << 31 else w).to(torch.int32)
    )
    assert torch.equal(unpack(packed, bits).long(), values)
    assert torch.equal(pack(values.to(torch.uint8), bits).view(torch.int32), packed)


def test_three_bit_value_straddles_words():
    # Value 10 (bits 30..32 of the stream) takes its low 2 bits from word 0 and its top bit from word 1.
    values = [0] * 32
    values[10] = 0b101
    words = _hand_pack(values, 3)
    assert words[0] == 0b01 << 30 and words[1] == 0b1
    packed = torch.tensor(
        [[w - (1 << 32) if w >= 1 << 31 else w for w in words]], dtype=torch.int32
    )
    assert unpack(packed, 3)[0].tolist() == values


def test_five_and_six_bit_values_straddle_words():
    for bits, idx in (
        (5, 6),
        (6, 5),
    ):  # 5-bit value 6 spans bits 30..34, 6-bit value 5 spans 30..35
        values = [0] * 32
        values[idx] = (1 << bits) - 1
        words = _hand_pack(values, bits)
        assert (
            words[0] >> 30 == 0b11 and words[1] & ((1 << (bits - 2)) - 1) == (1 << (bits - 2)) - 1
        )
        packed = torch.tensor(
            [[w - (1 << 32) if w >= 1 << 31 else w for w in words]], dtype=torch.int32
        )
        assert unpack(packed, bits)[0].tolist() == values


def test_dequantize_negative_scales_by_hand():
    q = torch.tensor([[0, 1, 2, 3] * 8])  # 32 two-bit values, one group of 32
    packed = pack(q.to(torch.uint8), 2)
    scales = torch.tensor([[-0.5]], dtype=torch.bfloat16)
    biases = torch.tensor([[1.0]], dtype=torch.bfloat16)
    w = dequantize(packed, scales, biases, 2, 32, torch.float32)
    assert w[0, :4].tolist() == [1.0, 0.5, 0.0, -0.5]


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("group_size", (32, 64, 128))
def test_dequantize_matches_mlx(bits, group_size):
    mx = pytest.importorskip("mlx.core")
    import numpy as np

    g = torch.Generator().manual_seed(bits * 1000 + group_size)
    w = torch.randn(8, 256, generator=g)
    wq, scales, biases = mx.quantize(mx.array(w.numpy()), group_size=group_size, bits=bits)
    ref = np.array(mx.dequantize(wq, scales, biases, group_size=group_size, bits=bits))
    ours = dequantize(
        torch.from_numpy(np.array(wq).view(np.int32)),
        torch.from_numpy(np.array(scales)),
        torch.from_numpy(np.array(biases)),
        bits,
        group_size,
        torch.float32,
    )
    assert torch.equal(ours, torch.from_numpy(ref))


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_quantize_roundtrip_error_is_within_half_a_step(bits):
    w = torch.randn(4, 128, generator=torch.Generator().manual_seed(0))
    packed, scales, biases = quantize(w, bits, 64)
    back = dequantize(packed, scales, biases, bits, 64, torch.float32)
    step = scales.float().repeat_interleave(64, dim=1)
    assert ((back - w).abs() <= step * 0.5 + 1e-6).all()


def _packed(n: int, k: int, bits: int, gs: int):
    from tensorfold.layers.linear import QuantizedWeight

    return QuantizedWeight(*quantize(torch.randn(n, k), bits, gs), bits, gs)


def test_joined_projections_give_each_projection_its_own_product():
    """The merged product the GPU uses, forced here: each part's columns equal its own product,
    the parts become views of the merged weight, and mixed formats stay separate."""
    from tensorfold.layers.linear import Linear, join

    torch.manual_seed(0)
    x = torch.randn(5, 128)
    dense = [Linear(torch.randn(n, 128), torch.float32) for n in (48, 16, 32)]
    alone = [lin(x) for lin in dense]
    joined = join(dense, merge=True)
    assert joined.merged is not None
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(joined(x), alone))
    assert all(lin.weight.data_ptr() >= joined.merged.weight.data_ptr() for lin in dense)
    packed = [Linear(_packed(n, 128, 4, 64), torch.float32) for n in (32, 64)]
    alone = [lin(x) for lin in packed]
    joined = join(packed, merge=True)
    assert joined.merged is not None and torch.equal(joined(x)[1], alone[1])
    mixed = [
        Linear(_packed(32, 128, 4, 64), torch.float32),
        Linear(_packed(32, 128, 6, 64), torch.float32),
    ]
    assert join(mixed, merge=True).merged is None
    assert join(dense).merged is None  # on the CPU products stay separate by default


def test_joined_mixed_formats_make_one_product_a_format():
    """A mixed-bit file's projections of one input: the parts of each width are one product (a
    lone part its own), the outputs come back in the parts' order, each equal to its own
    product's bits."""
    from tensorfold.layers.linear import Linear, join

    torch.manual_seed(1)
    x = torch.randn(3, 128)
    fmt = [(48, 4), (16, 5), (32, 4), (8, 5), (24, 6)]
    lins = [Linear(_packed(n, 128, b, 64), torch.float32) for n, b in fmt]
    alone = [lin(x) for lin in lins]
    joined = join(lins, merge=True)
    assert [held for _, held in joined.products] == [(0, 2), (1, 3), (4,)]
    assert joined.merged is None and joined.products[2][0] is lins[4]
    out = joined(x)
    assert [y.shape[-1] for y in out] == [n for n, _ in fmt]
    assert all(torch.equal(a, b) for a, b in zip(out, alone))
    four = joined.products[0][0].weight.packed
    assert lins[2].weight.packed.data_ptr() == four[48:].data_ptr()  # a view, not a copy


def _round_bf16_once(v: torch.Tensor) -> torch.Tensor:
    """v (float64, normal) rounded once to bf16's 8 significant bits, half to even."""
    m, e = torch.frexp(v)
    return torch.ldexp(torch.round(m * 256) / 256, e)


def _values_both_ways(scales, biases, bits):
    """Every (group, q) value as the GPU's fp32 fma rounded to bf16, and rounded once."""
    q = torch.arange(1 << bits, dtype=torch.float64)
    exact = q[None, :] * scales.double()[:, None] + biases.double()[:, None]  # exact in fp64 here
    twice = exact.to(torch.float32).to(torch.bfloat16).double()
    return twice, _round_bf16_once(exact)


def test_single_rounding_guard_admits_only_groups_whose_values_do_not_move():
    """The bf16x2 dequantization rounds q·scale + bias once; the fp32 fma rounds it to fp32
    first. Wherever the guard admits a group, both give the same bf16 for every q; a group
    whose fp32 sum rounds onto a bf16 midpoint (scale 1 + 2^-7, q = 3, bias -2^-30) moves
    and is refused."""
    g = torch.Generator().manual_seed(0)
    n = 20000
    s = torch.ldexp(1 + torch.rand(n, generator=g), torch.randint(-20, 5, (n,), generator=g))
    b = torch.ldexp(torch.rand(n, generator=g) * 2 - 1, torch.randint(-32, 8, (n,), generator=g))
    s, b = s.to(torch.bfloat16), b.to(torch.bfloat16)
    s[0], b[0] = 1 + 2**-7, -(2**-30)
    for bits in (4, 8):
        twice, once = _values_both_ways(s, b, bits)
        moved = (twice != once).any(-1)
        admitted = torch.tensor(
            [single_rounding(s[i : i + 1], b[i : i + 1], bits) for i in range(n)]
        )
        assert not (admitted & moved).any()
        assert moved[0] and not admitted[0]
        assert admitted.float().mean() > 0.2  # the guard is not refusing everything
    assert not single_rounding(s, b, 4)  # one refused group refuses the weight


def test_single_rounding_holds_for_quantized_weights():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 512, generator=g)
    for bits in (4, 8):
        _, scales, biases = quantize(w, bits, 64)
        scales, biases = scales.to(torch.bfloat16), biases.to(torch.bfloat16)
        assert single_rounding(scales, biases, bits)
        assert not single_rounding(scales.float(), biases.float(), bits)  # bf16 only
