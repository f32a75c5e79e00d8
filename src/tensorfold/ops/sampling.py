"""Token choice for one row of logits. Randomness is a pure function of (seed, position), so a
sampled request draws the same numbers whatever else shares its passes."""

from __future__ import annotations

import torch

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def uniform(seed: int, position: int, choice: int = 0) -> float:
    """A number in [0, 1) keyed on (seed, choice, position); 53 random bits. `choice` is the
    index of one of a request's n choices."""
    h = splitmix64(splitmix64(splitmix64(seed & MASK64) ^ (choice & MASK64)) ^ (position & MASK64))
    return (h >> 11) / float(1 << 53)


def sample_row(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float, u: float
) -> int:
    """Pick a token from one row of logits [V]. temperature 0 is greedy (first maximum wins)."""
    if temperature <= 0.0:
        return int(torch.argmax(logits))
    vals, idx = torch.sort(logits.to(torch.float64) / temperature, descending=True, stable=True)
    if 0 < top_k < vals.shape[0]:
        vals, idx = vals[:top_k], idx[:top_k]
    probs = torch.softmax(vals, dim=-1)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if min_p > 0.0:
        keep &= probs >= min_p * probs[0]
    if top_p < 1.0:
        keep &= (torch.cumsum(probs, 0) - probs) < top_p  # the smallest prefix reaching top_p
    keep[0] = True
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    cdf = torch.cumsum(kept, 0)
    choice = int(torch.searchsorted(cdf, u * float(cdf[-1]), right=True))
    return int(idx[min(choice, int(keep.nonzero().max()))])


def top_logprobs(logits: torch.Tensor, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """log-probability of `token` and the k most likely tokens with theirs, from one row."""
    lp, vals, ids = top_logprobs_of(logits, token, k)
    return float(lp), [(int(i), float(v)) for i, v in zip(ids.tolist(), vals.tolist())]


def top_logprobs_of(logits: torch.Tensor, token, k: int):
    """`top_logprobs` left on the row's device: (the token's logprob, the top k values, their
    ids) for one row and a token (an int, or a [1] tensor that may still be on the device)."""
    logp = torch.log_softmax(logits.to(torch.float32), dim=-1)
    vals, ids = torch.topk(logp, k) if k > 0 else (logp[:0], logp.new_empty(0, dtype=torch.long))
    return logp[token], vals, ids


def token_rank(logits: torch.Tensor, token: int) -> int:
    """1 + the number of tokens strictly more likely than `token` (vLLM's rank)."""
    row = logits.to(torch.float32)
    return int((row > row[token]).sum()) + 1
