"""GPU (skipped without CUDA): the packed products at the 9B shapes keep a row's fp32 sums whatever
company it has and whichever launch shape the tile book picks, for every width and group size."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from tensorfold.ops.quant import quantize, single_rounding  # noqa: E402
from tensorfold.ops.triton import linear  # noqa: E402

SHAPES = [(4096, 12288)]  # the 9B's MLP down product: twelve K segments
# every width at the common group, and 4-bit at every group (the registry covers the rest smaller)
FORMATS = [(b, 64) for b in (2, 3, 4, 5, 6, 8)] + [(4, 32), (4, 128)]
ROWS = (1, 2, 7, 16, 64, 600, 4000)


def _fp32(x, w, tiles=None):
    """The product's fp32 results: the kernels store their sums in the output's dtype (the
    bf16x2 shapes take their form where the weight admits it, as serving's do)."""
    out = torch.empty(x.shape[0], w[0].shape[0], device="cuda", dtype=torch.float32)
    plan = linear.LinearPlan.for_weight(out.shape[1], x.shape[1], w[4])
    once = single_rounding(w[1], w[2], w[3])
    return linear.affine_matmul(x, *w, plan, out=out, tiles=tiles, single_rounding=once)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("bits,group", FORMATS)
def test_packed_rows_keep_their_fp32_sums(n, k, bits, group):
    torch.manual_seed(bits * 1000 + group)
    packed, scales, biases = quantize(torch.randn(n, k) * 0.02, bits, group)
    w = (
        packed.cuda(),
        scales.to("cuda", torch.bfloat16),
        biases.to("cuda", torch.bfloat16),
        bits,
        group,
    )
    x = torch.randn(max(ROWS), k, device="cuda").to(torch.bfloat16)
    whole = _fp32(x, w)  # 4,000 rows: the prompt form
    for m in ROWS:
        for pos in sorted({0, m // 2, m - 1}):
            rows = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            rows[pos] = x[pos]
            got = _fp32(rows, w)[pos]
            assert torch.equal(got, whole[pos]), f"row {pos} of {m} differs from the prompt row"
    for m in (1, 16, 64):  # the rows classes with the most launch shapes (64: many lanes)
        for t in linear.candidates(m, packed=True) + linear.untried(m):  # offered or not yet
            try:
                got = _fp32(x[:m], w, tiles=t)
            except Exception as e:  # a shape the card cannot launch is never chosen
                if "OutOfResources" in type(e).__name__:
                    continue
                raise
            assert torch.equal(got, whole[:m]), f"{m} rows under {t} differ"
