"""ops/sampling.py against a plain reference: the filtered, renormalised distribution in float64
and the same uniform number inverted through its CDF; ties at the filters' boundaries; the
counter-based uniform numbers."""

import math

import pytest
import torch

from tensorfold.ops.sampling import sample_row, uniform

GRID = [(i + 0.5) / 1000 for i in range(1000)]  # never on a boundary of the cases below
LOGITS = [1.5, -0.25, 3.0, 0.75, 2.25, -2.0, 0.0, 1.0, 2.9, -1.0, 0.5, 2.0]


def reference(
    logits: list[float], temperature: float, top_k: int, top_p: float, min_p: float, u: float
) -> int:
    """vLLM's order: top-k, then min-p and top-p over the top-k distribution; ties keep the
    lower token id first; the first token is always kept."""
    if temperature <= 0.0:
        return max(range(len(logits)), key=lambda i: (logits[i], -i))
    order = sorted(range(len(logits)), key=lambda i: (-logits[i], i))
    if 0 < top_k < len(order):
        order = order[:top_k]
    kept = list(filtered(logits, order, temperature, top_p, min_p))
    total, acc = sum(p for _, p in kept), 0.0
    for i, p in kept:
        acc += p
        if u * total < acc:
            return i
    return kept[-1][0]


def filtered(logits, order, temperature, top_p, min_p):
    scaled = [logits[i] / temperature for i in order]
    weights = [math.exp(x - scaled[0]) for x in scaled]
    probs = [w / sum(weights) for w in weights]
    before = 0.0
    for rank, (i, p) in enumerate(zip(order, probs)):
        if rank == 0 or (p >= min_p * probs[0] and (top_p >= 1.0 or before < top_p)):
            yield i, p
        before += p


def drawn(logits: list[float], temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> list[int]:
    row = torch.tensor(logits, dtype=torch.float32)
    return [sample_row(row, temperature, top_k, top_p, min_p, u) for u in GRID]


def expected(logits: list[float], temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> list[int]:
    row = [float(x) for x in torch.tensor(logits, dtype=torch.float32)]
    return [reference(row, temperature, top_k, top_p, min_p, u) for u in GRID]


@pytest.mark.parametrize(
    "temperature,top_k,top_p,min_p",
    [
        (1.0, 0, 1.0, 0.0),  # the whole distribution
        (0.7, 0, 1.0, 0.0),
        (2.5, 0, 1.0, 0.0),
        (1.0, 5, 1.0, 0.0),
        (1.0, -1, 1.0, 0.0),  # -1 turns top-k off, like 0
        (1.0, 12, 1.0, 0.0),  # top_k = V keeps every token
        (1.0, 0, 0.5, 0.0),
        (1.0, 0, 0.9, 0.0),
        (0.8, 0, 0.75, 0.0),
        (1.0, 0, 1.0, 0.1),
        (1.0, 0, 1.0, 0.5),
        (0.6, 6, 0.8, 0.05),
        (1.0, 3, 0.7, 0.0),  # top-p over the renormalised top-k distribution
        (1.3, 4, 0.95, 0.2),
    ],
)
def test_sample_row_equals_the_reference(temperature, top_k, top_p, min_p):
    got = drawn(LOGITS, temperature, top_k, top_p, min_p)
    assert got == expected(LOGITS, temperature, top_k, top_p, min_p)


def test_each_filter_narrows_the_support():
    """Each filter alone keeps exactly the tokens the reference keeps (a filter that does
    nothing fails here even where the grid would hide it)."""
    whole = set(drawn(LOGITS))
    assert whole == set(range(len(LOGITS)))
    assert set(drawn(LOGITS, top_k=3)) == {2, 8, 4}
    assert set(drawn(LOGITS, top_p=0.5)) == set(expected(LOGITS, top_p=0.5)) == {2, 8}
    assert set(drawn(LOGITS, min_p=0.3)) == set(expected(LOGITS, min_p=0.3))
    assert len(set(drawn(LOGITS, min_p=0.3))) < len(whole)


def test_top_k_tie_at_the_boundary_keeps_the_lower_ids():
    logits = [0.0, 2.0, 1.0, 2.0, 2.0, -1.0]
    got = drawn(logits, top_k=2)
    assert set(got) == {1, 3}
    assert got == expected(logits, top_k=2)
    assert got[:500] == [1] * 500 and got[500:] == [3] * 500  # equal halves, in id order


def test_top_p_tie_at_the_boundary():
    """Four equal tokens: top_p 0.5 is reached by the first two exactly, so the third is out."""
    equal = [0.0, 0.0, 0.0, 0.0]
    assert set(drawn(equal, top_p=0.5)) == {0, 1}
    assert set(drawn(equal, top_p=0.51)) == {0, 1, 2}
    assert drawn(equal, top_p=0.51) == expected(equal, top_p=0.51)


def test_the_most_likely_token_is_always_kept():
    assert set(drawn(LOGITS, top_p=1e-9)) == {2}
    assert set(drawn(LOGITS, min_p=1.0)) == {2}


def test_greedy_takes_the_first_maximum():
    row = torch.tensor([0.5, 3.0, -1.0, 3.0])
    assert sample_row(row, 0.0, 0, 1.0, 0.0, 0.99) == 1
    assert sample_row(row, 0.0, 2, 0.1, 0.5, 0.0) == 1  # filters do not touch greedy


def test_the_extreme_uniform_numbers_stay_in_the_support():
    for u in (0.0, 1.0 - 2**-53):
        assert sample_row(torch.tensor(LOGITS), 1.0, 3, 1.0, 0.0, u) in {2, 8, 4}


def test_each_token_owns_a_half_open_interval_of_u():
    """Token i is drawn for u in [cdf[i-1], cdf[i]): u on a boundary takes the next token."""
    two = torch.tensor([0.0, 0.0])
    assert [sample_row(two, 1.0, 0, 1.0, 0.0, u) for u in (0.0, 0.5 - 2**-53, 0.5)] == [0, 0, 1]
    assert reference([0.0, 0.0], 1.0, 0, 1.0, 0.0, 0.5) == 1


def test_uniform_numbers_are_pinned():
    """A changed mix would silently change every seeded reply: the values are fixed."""
    assert uniform(0, 0, 0) == 0.13870941014555427
    assert uniform(1234, 17) == uniform(1234, 17, 0) == 0.2094093268155176
    assert uniform(1234, 17, 1) == 0.2923983323285896
    assert uniform(2**64 - 1, 5, 3) == 0.06951048628418932
    assert uniform(2**64 + 7, 5, 3) == uniform(7, 5, 3)  # the seed is taken mod 2^64


def test_uniform_numbers_depend_on_every_key_and_are_uniform():
    draws = [uniform(42, p) for p in range(20000)]
    assert all(0.0 <= x < 1.0 for x in draws)
    assert abs(sum(draws) / len(draws) - 0.5) < 0.01
    counts = [0] * 10
    for x in draws:
        counts[int(x * 10)] += 1
    assert max(abs(c - 2000) for c in counts) < 200  # about 4.7 sigma
    assert len({uniform(42, 7, c) for c in range(64)}) == 64
    assert len({uniform(s, 7, 0) for s in range(64)}) == 64


def test_sampled_frequencies_match_the_filtered_distribution():
    """The engine's draw (a uniform number per position) follows the reference's probabilities."""
    row = torch.tensor(LOGITS)
    n = 20000
    counts: dict[int, int] = {}
    for pos in range(n):
        t = sample_row(row, 0.9, 6, 0.9, 0.02, uniform(7, pos))
        counts[t] = counts.get(t, 0) + 1
    order = sorted(range(len(LOGITS)), key=lambda i: (-LOGITS[i], i))[:6]
    kept = list(filtered([float(x) for x in row], order, 0.9, 0.9, 0.02))
    total = sum(p for _, p in kept)
    assert set(counts) == {i for i, _ in kept}
    for i, p in kept:
        q = p / total
        assert abs(counts[i] / n - q) < 5 * math.sqrt(q * (1 - q) / n), (i, counts[i], q)
