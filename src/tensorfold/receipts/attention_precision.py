"""`check attention-precision`: our attention kernel against a float64 softmax of the same bf16
rows. Keys, values and queries are random bf16 values in a shuffled (paged) cache; sampled query
rows are run through the device's kernel (the CPU reference path, or the Triton kernel on CUDA)
either one row per lane (decode) or in 64-row prompt tiles (--prompt), and compared with float64
attention computed from the very same values. Reported by row range: max and mean |err|, and
how many outputs are not finite."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ops.attention import PROMPT_TILE
from .report import table, write_json


@dataclass(frozen=True)
class PrecisionConfig:
    heads: int
    kv_heads: int
    head_dim: int = 256
    length: int = 16384
    bounds: tuple[int, ...] = (8192,)  # row ranges: [0, b1), [b1, b2), ..., [bn, length)
    samples: int = 64  # query rows measured per range
    query_ranges: tuple[float, ...] = (1.0, 4.0)
    prompt: bool = False
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32  # what the kernel is given (values are bf16 either way)
    seed: int = 0
    max_err: float = 1e-2

    @property
    def ranges(self) -> list[tuple[int, int]]:
        edges = [0, *[b for b in self.bounds if 0 < b < self.length], self.length]
        return list(zip(edges[:-1], edges[1:]))

    @property
    def path(self) -> str:
        return "prompt" if self.prompt else "decode"


@dataclass(frozen=True)
class Cache:
    keys: torch.Tensor  # [L, Hkv, D] bf16 values by position
    values: torch.Tensor
    slots: torch.Tensor  # [L] cache row of each position (a shuffled page table)
    k_cache: torch.Tensor  # [L, Hkv, D] rows in cache order, in the kernel's dtype
    v_cache: torch.Tensor


def make_cache(cfg: PrecisionConfig, g: torch.Generator) -> Cache:
    shape = (cfg.length, cfg.kv_heads, cfg.head_dim)
    keys = torch.randn(shape, generator=g).to(torch.bfloat16)
    values = torch.randn(shape, generator=g).to(torch.bfloat16)
    slots = torch.randperm(cfg.length, generator=g)
    k_cache, v_cache = torch.empty_like(keys), torch.empty_like(values)
    k_cache[slots], v_cache[slots] = keys, values
    dev = cfg.device
    return Cache(keys, values, slots, k_cache.to(dev, cfg.dtype), v_cache.to(dev, cfg.dtype))


def segment_starts(cfg: PrecisionConfig, lo: int, hi: int) -> list[int]:
    """First positions of the measured segments in [lo, hi), evenly spread, the last at the end."""
    size = PROMPT_TILE if cfg.prompt else 1
    count = max(1, cfg.samples // size)
    top = hi - size
    return sorted({lo + (top - lo) * i // max(1, count - 1) for i in range(count)})


def run_kernel(
    cfg: PrecisionConfig, cache: Cache, q: torch.Tensor, starts: list[int], size: int
) -> torch.Tensor:
    """q [n, Hq, D] (segments of `size` rows each, in order) -> the kernel's [n, Hq, D]."""
    scale = cfg.head_dim**-0.5
    q = q.to(cfg.device, cfg.dtype)
    slots = cache.slots.to(cfg.device)
    if cfg.device.type == "cuda":
        from ..batch import Segment
        from ..ops.attention import AttentionTiles
        from ..ops.triton.attention import paged_attention

        segs = [Segment(0, s, i * size, size, slots[: s + size]) for i, s in enumerate(starts)]
        tiles = AttentionTiles.build(segs, cfg.device)
        return paged_attention(q, cache.k_cache, cache.v_cache, tiles, scale).cpu()
    from ..ops.attention import paged_attention

    out = [
        paged_attention(
            q[i * size : (i + 1) * size],
            cache.k_cache,
            cache.v_cache,
            slots[: s + size],
            torch.arange(s, s + size),
            scale,
        )
        for i, s in enumerate(starts)
    ]
    return torch.cat(out)


def reference(
    cfg: PrecisionConfig, cache: Cache, q: torch.Tensor, starts: list[int], size: int
) -> torch.Tensor:
    """float64 causal softmax attention of the same bf16 values, on the kernel's device."""
    group = cfg.heads // cfg.kv_heads
    scale = cfg.head_dim**-0.5
    out = []
    for i, s in enumerate(starts):
        rows = q[i * size : (i + 1) * size].to(cfg.device, torch.float64)  # [t, Hq, D]
        k = cache.keys[: s + size].to(cfg.device, torch.float64).repeat_interleave(group, 1)
        v = cache.values[: s + size].to(cfg.device, torch.float64).repeat_interleave(group, 1)
        scores = torch.einsum("thd,khd->htk", rows, k) * scale  # [Hq, t, K]
        pos = torch.arange(s, s + size, device=cfg.device)
        visible = torch.arange(s + size, device=cfg.device)[None, :] <= pos[:, None]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out.append(torch.einsum("htk,khd->thd", probs, v).cpu())
    return torch.cat(out)


def measure(
    cfg: PrecisionConfig, cache: Cache, span: float, lo: int, hi: int, g: torch.Generator
) -> dict:
    starts = segment_starts(cfg, lo, hi)
    size = PROMPT_TILE if cfg.prompt else 1
    n = len(starts) * size
    q = ((torch.rand(n, cfg.heads, cfg.head_dim, generator=g) * 2 - 1) * span).to(torch.bfloat16)
    got = run_kernel(cfg, cache, q, starts, size).double()
    err = (got - reference(cfg, cache, q, starts, size)).abs()
    finite = torch.isfinite(got)
    err = err[finite]  # non-finite outputs are counted, not averaged
    return {
        "path": cfg.path,
        "queries": span,
        "rows": [lo, hi],
        "measured_rows": n,
        "max_err": float(err.max()) if err.numel() else None,
        "mean_err": float(err.mean()) if err.numel() else None,
        "non_finite": int((~finite).sum()),
    }


def run_precision(cfg: PrecisionConfig) -> list[dict]:
    g = torch.Generator().manual_seed(cfg.seed)
    cache = make_cache(cfg, g)
    return [
        measure(cfg, cache, span, lo, hi, g) for span in cfg.query_ranges for lo, hi in cfg.ranges
    ]


def precision_command(cfg: PrecisionConfig, output: str | None) -> int:
    records = run_precision(cfg)
    rows = [
        [
            r["path"],
            f"[-{r['queries']:g}, {r['queries']:g})",
            f"{r['rows'][0]}-{r['rows'][1] - 1}",
            r["measured_rows"],
            r["max_err"],
            r["mean_err"],
            r["non_finite"],
        ]
        for r in records
    ]
    print(
        f"{cfg.heads} query heads over {cfg.kv_heads} KV heads, head dim {cfg.head_dim}, "
        f"{cfg.length} positions, {cfg.device.type} kernel given {str(cfg.dtype)[6:]}"
    )
    print(
        table(
            ["path", "queries", "rows", "measured", "max |err|", "mean |err|", "non-finite"], rows
        )
    )
    bad = [
        r for r in records if r["non_finite"] or r["max_err"] is None or r["max_err"] > cfg.max_err
    ]
    write_json(
        output,
        {
            "tool": "check attention-precision",
            "config": {
                "heads": cfg.heads,
                "kv_heads": cfg.kv_heads,
                "head_dim": cfg.head_dim,
                "length": cfg.length,
                "device": str(cfg.device),
                "dtype": str(cfg.dtype),
                "max_err": cfg.max_err,
                "seed": cfg.seed,
            },
            "records": records,
        },
    )
    print(
        f"check attention-precision: {'PASS' if not bad else 'FAIL'} "
        f"(bound {cfg.max_err:g}; {len(bad)} of {len(records)} ranges beyond it or not finite)"
    )
    return 1 if bad else 0
