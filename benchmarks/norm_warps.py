"""The residual add + norm kernel's launch at the 9B's width for each warp count: µs a launch
(64 launches a CUDA graph, as a decode step runs them) at 1 and 64 rows, from stored deltas and
from a product's segment sums (--segments), and whether the rows' bits change with the warp
count (the reduction tree follows the layout, so a change of warps is a change of arithmetic).

    PYTHONPATH=src python3 benchmarks/norm_warps.py [--warps 4,8,16] [--width 4096] [--segments 0,2,12]
"""

from __future__ import annotations

import argparse

import torch

from tensorfold.ops.triton import norm
from tensorfold.util import capturing


def launch(h, d, nseg, w, out, y, warps):
    stride_s, stride_m = (d.stride(0), d.stride(1)) if nseg else (0, d.stride(0))
    norm._add_rms_kernel[(h.shape[0],)](
        h, d, w, out, y, h.shape[1], 1e-6, 1.0, stride_s, stride_m, NSEG=nseg,
        BLOCK=triton_block(h.shape[1]), num_warps=warps,
    )  # fmt: skip


def triton_block(width: int) -> int:
    return 1 << (width - 1).bit_length()


def timed(fn, reps: int = 64, rounds: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capturing(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / reps)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--warps", default="4,8,16")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument(
        "--segments", default="0,2,12",
        help="the delta's segment sums (0: stored); 12: the 9B's down product (K 12,288)",
    )  # fmt: skip
    args = p.parse_args()
    warps = [int(w) for w in args.warps.split(",")]
    print("| rows | delta | " + " | ".join(f"{w} warps µs" for w in warps) + " | same bits |")
    print("| --- | --- | " + " | ".join("---" for _ in warps) + " | --- |")
    for rows in (1, 64):
        for nseg in (int(n) for n in args.segments.split(",")):
            h = torch.randn(rows, args.width, device="cuda").to(torch.bfloat16)
            shape = (nseg, rows, args.width) if nseg else (rows, args.width)
            d = torch.randn(*shape, device="cuda")
            d = d if nseg else d.to(torch.bfloat16)
            wt = torch.randn(args.width, device="cuda")
            times, outs = [], []
            for wp in warps:
                out, y = torch.empty_like(h), torch.empty_like(h)
                times.append(timed(lambda: launch(h, d, nseg, wt, out, y, wp)))  # noqa: B023
                outs.append(y.clone())
            same = all(torch.equal(o, outs[0]) for o in outs)
            cells = " | ".join(f"{t:.2f}" for t in times)
            delta = f"{nseg} segments' sums" if nseg else "stored"
            print(f"| {rows} | {delta} | {cells} | {same} |")


if __name__ == "__main__":
    main()
