"""The GPU attention kernel's torch reference (ops.attention.superblock_attention): its numbers
against a per-row float64 softmax, its bits the same however the rows are cut into calls, and its
super-block fold really a different bracketing than one fold of every split."""

import torch

from tensorfold.ops.attention import KV_SPLIT, SUPER_BLOCK, paged_attention, superblock_attention

HQ, HKV, D = 8, 2, 32


def _case(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rows = n + 40
    kc = torch.randn(rows, HKV, D, generator=g).to(torch.bfloat16)
    vc = torch.randn(rows, HKV, D, generator=g).to(torch.bfloat16)
    slots = torch.randperm(rows, generator=g)[:n]
    q = (torch.randn(n, HQ, D, generator=g) * 3).to(torch.bfloat16)
    return q, kc, vc, slots


def _softmax64(q, kc, vc, slots, scale):
    """Each row's attention over its keys, as one float64 softmax."""
    group = HQ // HKV
    k = kc[slots].double().repeat_interleave(group, 1)  # [P, Hq, D]
    v = vc[slots].double().repeat_interleave(group, 1)
    scores = torch.einsum("thd,phd->htp", q.double(), k) * scale
    n = q.shape[0]
    causal = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
    w = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
    return torch.einsum("htp,phd->thd", w, v)


def test_reference_equals_float64_softmax():
    n = 2 * SUPER_BLOCK + 77
    q, kc, vc, slots = _case(n)
    want = _softmax64(q, kc, vc, slots, D**-0.5)
    exact = superblock_attention(
        q.double(), kc, vc, slots, torch.arange(n), D**-0.5, weights=torch.float64
    )
    # same function, other brackets: ~1e-15 here, 1.5e-9 on another x86 machine's float64
    # products; a float32 slip anywhere would show near 1e-7
    err = float((exact - want).abs().max())
    assert err < 1e-8, err
    fp32 = superblock_attention(q.float(), kc, vc, slots, torch.arange(n), D**-0.5)
    rel = float((fp32.double() - want).norm() / want.norm())
    assert rel < 5e-3, rel  # the probabilities rounded to bf16, as the kernel rounds them


def test_reference_is_chunk_invariant_bitwise():
    n = 3 * SUPER_BLOCK + 50
    q, kc, vc, slots = _case(n, seed=1)
    whole = superblock_attention(q.float(), kc, vc, slots, torch.arange(n), D**-0.5)
    for chunk in (37, 16, SUPER_BLOCK, SUPER_BLOCK + 1):
        parts = [
            superblock_attention(
                q[s : s + chunk].float(), kc, vc, slots, torch.arange(s, min(s + chunk, n)), D**-0.5
            )
            for s in range(0, n, chunk)
        ]
        assert torch.equal(torch.cat(parts), whole), chunk
    for t in (0, SUPER_BLOCK - 1, SUPER_BLOCK, SUPER_BLOCK + 1, 2 * SUPER_BLOCK + 63, n - 1):
        row = superblock_attention(q[t : t + 1].float(), kc, vc, slots, torch.tensor([t]), D**-0.5)
        assert torch.equal(row[0], whole[t]), t


def test_super_blocks_are_another_bracketing_than_one_fold(monkeypatch):
    """Rows within the first super-block fold exactly as one chain of splits (merging into an
    empty state is exact); rows past it are bracketed by super-block, a different rounding."""
    from tensorfold.ops import attention

    n = 2 * SUPER_BLOCK + KV_SPLIT
    q, kc, vc, slots = _case(n, seed=2)
    pos = torch.arange(n)
    blocks = superblock_attention(q.float(), kc, vc, slots, pos, D**-0.5, weights=torch.float32)
    monkeypatch.setattr(attention, "SUPER_BLOCK", 1 << 30)  # one super-block: a single chain
    chain = superblock_attention(q.float(), kc, vc, slots, pos, D**-0.5, weights=torch.float32)
    assert torch.equal(blocks[:SUPER_BLOCK], chain[:SUPER_BLOCK])
    assert not torch.equal(blocks[SUPER_BLOCK:], chain[SUPER_BLOCK:])
    # and the CPU engine's own attention stays within rounding of both
    cpu = paged_attention(q.float(), kc.float(), vc.float(), slots, pos, D**-0.5)
    assert float((cpu - blocks).abs().max()) < 1e-4
