"""Kernel timings on the GPU at a released shape's sizes, each launch variant checked bitwise.

- Products of one row (a decode step) for every (N, K) of the shape, bf16 and 4-bit g64: each
  launch shape the tile book may pick, as GB/s of weight bytes read, its output byte-equal to the
  default shape's, and the best shape's share of the card's copy rate.
- The GDN recurrence at the shape's layer size: µs per token step over a long prompt, and one
  decode step for 1 to 256 lanes (GB/s of state traffic), in both launch orders (checked
  bitwise), against fla's recurrent kernel where fla is installed.

    PYTHONPATH=src python3 benchmarks/kernels.py [--shape 9b] [--tokens 8192]
"""

from __future__ import annotations

import argparse

import torch
from h200 import (
    ceilings,
)  # this folder's benchmark: the card's ceilings, measured once the same way

from tensorfold.ops.quant import quantize, single_rounding
from tensorfold.ops.triton import linear
from tensorfold.ops.triton.gated_delta import gated_delta_lanes
from tensorfold.tools.shapes import text_config


def products(cfg: dict) -> dict[str, tuple[int, int]]:
    """(N, K) of each product of a decode pass, with the layer's projections joined as on the GPU."""
    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    hq, hkv, hv = (
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["linear_num_value_heads"],
    )
    key = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
    value = hv * cfg["linear_value_head_dim"]
    return {
        "attn qkv+gate": (2 * hq * d + 2 * hkv * d, h),
        "attn o": (h, hq * d),
        "gdn in": (2 * key + 2 * value + 2 * hv, h),
        "gdn out": (h, value),
        "mlp gate+up": (2 * i, h),
        "mlp down": (h, i),
        "lm head": (cfg["vocab_size"], h),
    }


def timed(fn, reps: int = 20, graph: bool = True) -> float:
    """Device time per call (a CUDA graph of `reps` calls, after a warm-up call); graph=False times
    `reps` eager calls between two events instead (for code that syncs with the host)."""
    fn()
    if graph:
        return linear.gpu_seconds(fn, reps)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / reps / 1e3


def product_rows(
    name: str,
    n: int,
    k: int,
    fmt: tuple[int, int] | None,
    copy: float,
    rows: int = 1,
    untried: bool = False,
) -> list[str]:
    """Each launch shape of a product of `rows` rows, bf16 (fmt None) or packed (bits, group);
    `untried`: the packed shapes not yet offered to the tile book too (linear.untried)."""
    x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
    packed = fmt is not None
    if packed:
        bits, group = fmt
        words, s, b = quantize(torch.randn(n, k, device="cuda"), bits, group)
        s, b = s.to(torch.bfloat16), b.to(torch.bfloat16)
        plan = linear.LinearPlan.for_weight(n, k, group)
        once = single_rounding(s, b, bits)  # the bf16x2 shapes apply (the same values)

        def run(t):
            return linear.affine_matmul(
                x, words, s, b, bits, group, plan, tiles=t, single_rounding=once
            )

        nbytes = words.numel() * 4 + 2 * s.numel() * 2
    else:
        w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        plan = linear.LinearPlan.for_weight(n, k)
        run = lambda t: linear.dense_matmul(x, w, plan, tiles=t)  # noqa: E731
        nbytes = w.numel() * 2
    ref = run(None)
    out, best = [], None
    extra = linear.untried(rows) if packed and untried else []
    for t in linear.candidates(rows, packed) + extra:
        try:
            secs = timed(lambda: run(t))  # noqa: B023
        except Exception as e:  # noqa: BLE001 - a shape the card cannot launch
            out.append(f"| {name} | {n}x{k} | {t} | failed: {type(e).__name__} | | |")
            continue
        same = torch.equal(run(t), ref)
        best = secs if best is None else min(best, secs)
        out.append(
            f"| {name} | {n}x{k} | {t} | {secs * 1e6:.1f} µs | {nbytes / secs / 1e9:,.0f} GB/s | "
            f"{'equal' if same else 'DIFFERS'} |"
        )
    out.append(
        f"| {name} | {n}x{k} | best | {best * 1e6:.1f} µs | {nbytes / best / copy:.2f} of copy | |"
    )
    return out


def recurrence_rows(cfg: dict, tokens: int, lane_counts: tuple[int, ...]) -> list[str]:
    """The recurrence over a long prompt, and one decode step of each lane count as GB/s of the
    states read and written, in both launch orders of ours (their outputs and states compared
    bitwise) and fla's recurrent kernel where fla is installed."""
    hk, hv, dk = (
        cfg["linear_num_key_heads"],
        cfg["linear_num_value_heads"],
        cfg["linear_key_head_dim"],
    )

    def inputs(t: int, lanes: int):
        mk = lambda *s: torch.randn(*s, device="cuda").to(torch.bfloat16)  # noqa: E731
        q, k, v = mk(t, hk, dk), mk(t, hk, dk), mk(t, hv, dk)
        g, beta = (
            -torch.rand(t, hv, device="cuda") * 0.5,
            torch.rand(t, hv, device="cuda").to(torch.bfloat16),
        )
        states = torch.randn(lanes, hv, dk, dk, device="cuda") * 0.1
        slots = torch.arange(lanes, device="cuda")
        cu = torch.linspace(0, t, lanes + 1, device="cuda").long()
        return q, k, v, g, beta, states, slots, cu

    kernels = {
        "ours": gated_delta_lanes,
        "ours lane-major": lambda *a: gated_delta_lanes(*a, blocks_first=False),
    }
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_rec

        def fla(q, k, v, g, beta, states, slots, cu):
            o, final = fla_rec(
                q[None],
                k[None],
                v[None],
                g=g[None],
                beta=beta[None],
                scale=dk**-0.5,
                initial_state=states[slots],
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
                cu_seqlens=cu,
            )
            states[slots] = final
            return o[0]

        kernels["fla"] = fla
    except ImportError:
        pass
    cases = [(tokens, 1)] + [(lanes, lanes) for lanes in lane_counts]
    rows = [_same_bits(kernels, inputs(t, lanes), f"{t} rows, {lanes} lanes") for t, lanes in cases]
    for name, fn in kernels.items():
        graph = name != "fla"  # fla's wrapper reads cu_seqlens on the host: timed eagerly
        how = "graph" if graph else "eager"
        args = inputs(tokens, 1)
        secs = timed(lambda: fn(*args), 3, graph)  # noqa: B023
        rows.append(
            f"| recurrence {name} | prompt {tokens} tokens | {how} | {secs * 1e3:.2f} ms | "
            f"{secs / tokens * 1e6:.2f} µs a step | |"
        )
        for lanes in lane_counts:
            args = inputs(lanes, lanes)
            secs = timed(lambda: fn(*args), 50, graph)  # noqa: B023
            moved = 2 * args[5].numel() * 4  # the states read and written
            rows.append(
                f"| recurrence {name} | decode {lanes} lanes | {how} | {secs * 1e6:.1f} µs | "
                f"{moved / secs / 1e9:,.0f} GB/s of state | |"
            )
    return rows


def _same_bits(kernels: dict, args: tuple, what: str) -> str:
    """Our launch orders on the same inputs: outputs and states byte-equal."""
    results = []
    for name in ("ours", "ours lane-major"):
        fresh = tuple(a.clone() for a in args)
        results.append((kernels[name](*fresh), fresh[5]))
    same = all(torch.equal(a, b) for a, b in zip(results[0], results[1]))
    return f"| recurrence launch orders | {what} | | | | {'equal' if same else 'DIFFERS'} |"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="9b")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--only", default="", help="comma-separated product names (default: all)")
    p.add_argument("--formats", default="bf16,4:64", help="bf16 and/or BITS:GROUP, comma-separated")
    p.add_argument("--rows", type=int, default=1, help="rows per product (decode: 1)")
    p.add_argument("--no-recurrence", action="store_true")
    p.add_argument(
        "--untried", action="store_true", help="packed shapes not yet offered to the tile book too"
    )
    p.add_argument("--lanes", default="1,16,64,256", help="decode lane counts of the recurrence")
    args = p.parse_args()
    formats = [
        None if f == "bf16" else tuple(int(v) for v in f.split(":"))
        for f in args.formats.split(",")
    ]
    cfg = text_config(args.shape)
    copy = ceilings()["copy_bytes_per_s"]  # the same measurement as h200.py's table
    print(f"copy {copy / 1e12:.2f} TB/s", flush=True)
    lanes = tuple(int(n) for n in args.lanes.split(","))
    rows = [] if args.no_recurrence else recurrence_rows(cfg, args.tokens, lanes)
    print("\n".join(rows), flush=True)
    for name, (n, k) in products(cfg).items():
        if args.only and name not in args.only.split(","):
            continue
        for fmt in formats:
            label = f"{fmt[0]}-bit g{fmt[1]}" if fmt else "bf16"
            part = product_rows(f"{name} {label}", n, k, fmt, copy, args.rows, args.untried)
            print("\n".join(part), flush=True)
            rows += part
    print("\n| what | size | variant | time | rate | bits |\n| --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
