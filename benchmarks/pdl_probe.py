"""Where dependent launch (ops/triton/launch.py, TENSORFOLD_PDL) costs time, part by part, with
it off and on in one process: a CUDA graph of 64 residual add + norm launches and one of 64
(one-row 4-bit product + its segments' sum) pairs, each captured, uploaded (first replay) and
replayed (wall times and µs a launch); then a fresh tile book picking that product's shape at one
row (every candidate compiled and timed); the bytes of every output compared across the two; last
the random 9B (4-bit, in memory) decoding on an engine as h200.py does, one engine each way, the
wall seconds of the whole run beside its tok/s (the part that took minutes with it on).

    PYTHONPATH=src python3 benchmarks/pdl_probe.py [--reps 64]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from h200 import Run, decode

from tensorfold.ops.quant import quantize
from tensorfold.ops.triton import launch, linear, norm
from tensorfold.ops.triton.tiles import TileBook
from tensorfold.util import capturing


def switch(on: bool) -> None:
    os.environ["TENSORFOLD_PDL"] = "1" if on else "0"
    launch._keywords.cache_clear()


def wall(fn) -> tuple[float, object]:
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t, out


def graph_parts(fn, reps: int) -> tuple[str, torch.Tensor]:
    """capture s, first replay s, µs a launch (best of 20 replays), and fn's output."""
    fn()
    graph = torch.cuda.CUDAGraph()

    def capture():
        with capturing(graph):
            return [fn() for _ in range(reps)][-1]

    cap, out = wall(capture)
    first, _ = wall(graph.replay)
    best = min(wall(graph.replay)[0] for _ in range(20))
    return f"{cap:.3f} | {first:.3f} | {best / reps * 1e6:.2f}", out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=64)
    p.add_argument("--lanes", type=int, default=1)
    p.add_argument("--out", default="/tmp/pdl_probe")
    args = p.parse_args()
    h = torch.randn(1, 4096, device="cuda").to(torch.bfloat16)
    d, w = torch.randn_like(h), torch.rand(4096, device="cuda")
    x = torch.randn(1, 4096, device="cuda").to(torch.bfloat16)
    words, s, b = quantize(torch.randn(12352, 4096, device="cuda"), 4, 64)
    s, b = s.to(torch.bfloat16), b.to(torch.bfloat16)
    plan = linear.LinearPlan.for_weight(12352, 4096, 64)

    def product(t=None):
        return linear.affine_matmul(x, words, s, b, 4, 64, plan, tiles=t)

    print("| dependent launch | graph | capture s | first replay s | µs a launch |")
    print("| --- | --- | --- | --- | --- |")
    outs, picks = {}, {}
    for on in (False, True):
        switch(on)
        row, outs[on, "norm"] = graph_parts(
            lambda: norm.add_rms_norm(h, d, w, 1e-6, 1.0)[1], args.reps
        )
        print(f"| {on} | add + norm x{args.reps} | {row} |", flush=True)
        row, outs[on, "product"] = graph_parts(product, args.reps)
        print(f"| {on} | 4-bit product + sum x{args.reps} | {row} |", flush=True)
        for round_ in ("first", "again"):  # the first compiles every candidate
            book = TileBook()
            secs, choice = wall(lambda: book.pick(("probe",), 1, True, product))  # noqa: B023
            picks[on, round_] = (secs, choice)
    for (on, round_), (secs, choice) in picks.items():
        print(f"tile book pick, dependent launch {on}, {round_}: {secs:.2f} s -> {choice}")
    same = all(torch.equal(outs[False, k], outs[True, k]) for k in ("norm", "product"))
    print(f"outputs equal with it off and on: {same}", flush=True)
    run = Run(in_memory=True)
    model = run.load(run.checkpoint(Path(args.out) / "4bit", "9b", "4bit"))
    for on in (False, True):
        switch(on)
        secs, rate = wall(lambda: decode(model, args.lanes, run, tokens=32))
        print(
            f"engine decode, {args.lanes} lanes, dependent launch {on}: {secs:.1f} s, {rate:,.1f} tok/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
