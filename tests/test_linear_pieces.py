"""CPU: a packed product of 65-512 rows may run the Gluon swapped kernel on pieces of 64 or 128
rows (serving's tile book times those shapes beside the many-row forms to 128 rows, where the
registry passed them on a card and they won; a benchmark's book times them to 512). The kernel
itself needs a card; here its segment sums are the plain-torch reference, so what is checked is
the plumbing: pieces of at most the shape's tile rows in order, each piece's sums added into its
own rows, `out` honoured, and which rows classes time the shapes. Their bits against the default
shape are the registry's (`_tiles_invariant` at 100 and 300 rows, untried shapes included) on a
card."""

import pytest
import torch

from tensorfold.ops.quant import dequantize, quantize

lin = pytest.importorskip("tensorfold.ops.triton.linear")
if lin.gluon_affine is None:
    pytest.skip("needs a Triton with Gluon", allow_module_level=True)

N, K, BITS, GROUP = 96, 2048, 4, 64


def _fake_kernel(monkeypatch, pieces: list[int]) -> None:
    """The Gluon kernel's segment sums and the in-order segment sum, in torch."""

    def partials(x, words, scales, biases, bits, group, segment, **_):
        pieces.append(x.shape[0])
        w = dequantize(words.view(torch.uint32), scales, biases, bits, group, torch.bfloat16)
        cut = range(0, x.shape[1], segment)
        return torch.stack(
            [x[:, c : c + segment].float() @ w[:, c : c + segment].float().t() for c in cut]
        )

    def total(part, y):
        y = torch.empty(part.shape[1:], dtype=torch.bfloat16) if y is None else y
        acc = part[0]
        for s in part[1:]:
            acc = acc + s
        return y.copy_(acc.to(y.dtype))

    monkeypatch.setattr(lin.gluon_affine, "applies", lambda *a, **k: True)
    monkeypatch.setattr(lin.gluon_affine, "partials", partials)
    monkeypatch.setattr(lin, "_sum", total)


def test_many_packed_rows_run_in_pieces_each_row_its_own(monkeypatch):
    pieces = []
    _fake_kernel(monkeypatch, pieces)
    packed, scales, biases = quantize(torch.randn(N, K), BITS, GROUP)
    scales, biases = scales.to(torch.bfloat16), biases.to(torch.bfloat16)
    plan = lin.LinearPlan.for_weight(N, K, GROUP)
    assert plan.segments(K) == 2
    x = torch.randn(150, K).to(torch.bfloat16)
    shapes = {t.block_m: t for t in lin.untried(150) if t.gluon and not t.hfma and t.warps == 4}
    assert sorted(shapes) == [64, 128]
    t = shapes[64]
    run = lambda rows, out=None, t=t: lin.affine_matmul(  # noqa: E731
        rows, packed, scales, biases, BITS, GROUP, plan, out=out, tiles=t
    )
    y = run(x)
    assert pieces == [64, 64, 22]
    pieces.clear()
    assert torch.equal(run(x, t=shapes[128]), y) and pieces == [128, 22]
    alone = torch.cat([run(x[i : i + 1]) for i in (0, 63, 64, 127, 128, 149)])
    assert torch.equal(y[[0, 63, 64, 127, 128, 149]], alone)
    out = torch.full((150, N), float("nan"), dtype=torch.bfloat16)
    assert run(x, out) is out and torch.equal(out, y)
    w = dequantize(packed, scales, biases, BITS, GROUP, torch.bfloat16).float()
    torch.testing.assert_close(y.float(), x.float() @ w.t(), rtol=2e-2, atol=2e-1)


def test_the_pieces_are_offered_to_128_rows_and_timed_by_benchmarks_to_512():
    """65-128 rows (a 16-lane verify pass): the pieces are the book's candidates; 129-512 (a
    256-lane step): `untried` shapes, which only a benchmark's `--untried` book times."""
    for m in (65, 80, 128):
        offered = [t for t in lin.candidates(m, packed=True) if t.gluon]
        assert offered and all(t.ring and t.block_m in (64, 128) for t in offered), m
        assert {t.block_m for t in offered} == {64, 128} and lin.untried(m) == [], m
    for m in (129, 200, 300, 512):
        assert lin.untried(m) and all(t.gluon and t.ring for t in lin.untried(m)), m
        assert not [t for t in lin.candidates(m, packed=True) if t.gluon], m
    assert lin.untried(513) == [] and lin.untried(4096) == []
    assert not [t for t in lin.candidates(128, packed=False) if t.gluon]  # bf16 weights
