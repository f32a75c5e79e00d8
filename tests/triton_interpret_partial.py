"""Run under TRITON_INTERPRET=1 (by test_triton_interpret.py): a product's segment sums left to
the op that reads them (a Partial) give that op's bits exactly as the product's own sum launch
does, for the residual add + norm and for silu · up; the planted sums (reversed, unrounded) do
not. fp16, as the interpreter has no bf16."""

import torch

from tensorfold.ops import dispatch
from tensorfold.ops.linear import Partial
from tensorfold.ops.quant import quantize
from tensorfold.ops.triton import gates, linear, norm


def main() -> None:
    torch.manual_seed(0)
    x = (torch.randn(3, 4096) * 0.5).half()
    h = torch.randn(3, 48).half()
    wt = torch.randn(48) * 0.1
    plan = linear.LinearPlan.for_weight(96, 4096)
    assert plan.segments(4096) >= 3  # so a reversed sum can round differently
    dense = torch.randn(96, 4096).half() * 0.05
    packed, s, b = quantize(torch.randn(96, 4096) * 0.05, 4, 64)
    products = {
        "dense": lambda keep: linear.dense_matmul(x, dense, plan, keep=keep),
        "packed": lambda keep: linear.affine_matmul(
            x, packed, s.half(), b.half(), 4, 64, linear.LinearPlan.for_weight(96, 4096, 64),
            keep=keep,
        ),
    }  # fmt: skip
    for name, product in products.items():
        stored, kept = product(False), product(True)
        assert isinstance(kept, Partial) and kept.shape == (3, 96), name
        assert torch.equal(dispatch.total(kept), stored), name
        gate, up = kept.split([48, 48])
        want = gates.silu_mul(stored[:, :48], stored[:, 48:])
        assert torch.equal(gates.silu_mul(gate, up), want), name
        assert torch.equal(dispatch.silu_mul(gate, up), want), name
        assert torch.equal(dispatch.silu_mul(gate, stored[:, 48:]), want), name  # one stored
        want_h, want_y = norm.add_rms_norm(h, stored[:, :48], wt, 1e-6, 1.0)
        got_h, got_y = dispatch.rms_norm(gate, wt, 1e-6, 1.0, residual=h)
        assert torch.equal(got_h, want_h) and torch.equal(got_y, want_y), name
    # segments whose order shows at any width ((2^24 + 1) + 1 - 2^24 = 0 in order, 2 reversed)
    sums = torch.randn(4, 3, 96) * 0.3
    sums[:, :, 0] = sums[:, :, 48] = torch.tensor([2.0**24, 1.0, 1.0, -(2.0**24)])[:, None]
    kept = Partial(sums, torch.float16)
    stored = dispatch.total(kept)
    assert stored[:, 0].tolist() == [0.0] * 3
    gate, up = kept.split([48, 48])
    want = gates.silu_mul(stored[:, :48], stored[:, 48:])
    want_h, want_y = norm.add_rms_norm(h, stored[:, :48], wt, 1e-6, 1.0)
    assert torch.equal(gates.silu_mul(gate, up), want)
    assert all(map(torch.equal, norm.add_rms_norm(h, gate, wt, 1e-6, 1.0), (want_h, want_y)))
    for fault in (1, 2):  # reversed segments; the sum unrounded: both must move a bit
        moved = norm.add_rms_norm(h, gate, wt, 1e-6, 1.0, fault=fault)[0]
        assert not torch.equal(moved, want_h), fault
        assert not torch.equal(gates.silu_mul(gate, up, fault=fault), want), fault
    print("partial sums match the products' own sums")


if __name__ == "__main__":
    main()
