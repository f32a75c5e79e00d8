"""Run under TRITON_INTERPRET=1 (by test_triton_interpret.py): the Triton kernels on tiny shapes on the
CPU against their torch references. The interpreter has no bf16, so values are fp16 here."""
import torch

from tensorfold.ops import attention as ref_attention
from tensorfold.ops import norm as ref_norm
from tensorfold.ops.quant import dequantize, quantize
from tensorfold.ops.triton import attention, linear, norm
from tensorfold.runner.batch import Segment


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 128).half()
    w = torch.randn(48, 128).half()
    assert rel(linear.dense_matmul(x, w, linear.LinearPlan.for_weight(48, 128)), x.float() @ w.float().t()) < 2e-3
    for bits in (3, 4, 8):
        packed, s, b = quantize(torch.randn(32, 128), bits, 64)
        s, b = s.half(), b.half()
        y = linear.affine_matmul(x, packed, s, b, bits, 64, linear.LinearPlan.for_weight(32, 128, 64))
        assert rel(y, x.float() @ dequantize(packed, s, b, bits, 64, torch.float16).float().t()) < 2e-3, bits
    kc, vc = torch.randn(64, 2, 32).half(), torch.randn(64, 2, 32).half()
    slots = torch.randperm(64)[:20]
    q = torch.randn(20, 4, 32).half()
    tiles = attention.AttentionTiles.build((Segment(0, 0, 0, 20, slots),), "cpu")
    out = attention.paged_attention(q, kc, vc, tiles, 32 ** -0.5)
    ref = ref_attention.paged_attention(q.float(), kc.float(), vc.float(), slots, torch.arange(20), 32 ** -0.5)
    assert rel(out, ref) < 2e-3
    h = torch.randn(6, 64).half()
    wt = torch.randn(64) * 0.1
    assert rel(norm.rms_norm(h, wt, 1e-6, 1.0), ref_norm.rms_norm(h.float(), wt, 1e-6, 1.0)) < 2e-3
    print("interpreted kernels match their references")


if __name__ == "__main__":
    main()
