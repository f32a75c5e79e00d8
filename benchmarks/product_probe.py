"""Runs chosen launch shapes of one packed product once each, eagerly, after a warm-up, so that a
kernel profiler (Nsight Compute) reads each kernel alone: where its warps stall, its occupancy
and its bytes. Every shape's output is checked byte-equal to the default shape's first.

    ncu --nvtx --nvtx-include probe/ --section WarpStateStats \
        python3 benchmarks/product_probe.py --product "lm head" --rows 1 --shapes staged,gluon
    python3 benchmarks/product_probe.py --list   # the shape names

The shapes are printed in launch order, one line each, so the profiler's kernels map to them.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch
from kernels import products  # this folder's benchmark: the shape's (N, K) per product

from tensorfold.ops.quant import quantize, single_rounding
from tensorfold.ops.triton import linear
from tensorfold.ops.triton.tiles import Tiles
from tensorfold.tools.shapes import text_config

SHAPES = {
    "triton": None,  # the tile book's default for the rows class
    "swapped": Tiles(16, 128, 4, 4, wide=2, swap=True),
    "gluon": Tiles(16, 128, 4, 4, wide=2, swap=True, gluon=True),
    "staged": Tiles(16, 128, 4, 4, wide=2, swap=True, gluon=True, staged=True),
    "gluon8w": Tiles(64, 128, 8, 3, wide=2, swap=True, gluon=True),
    "ring": Tiles(64, 64, 4, 3, wide=2, swap=True, gluon=True, ring=True),
    "ring8w": Tiles(64, 128, 8, 3, wide=2, swap=True, gluon=True, ring=True),
    "affine64": Tiles(64, 128, 4, 3),
}
SHAPES |= {f"{name}.hfma": replace(t, hfma=True) for name, t in SHAPES.items() if t and t.gluon}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="9b")
    p.add_argument("--product", default="lm head")
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--group", type=int, default=64)
    p.add_argument("--shapes", default="triton,staged")
    p.add_argument("--list", action="store_true")
    args = p.parse_args()
    if args.list:
        for name, t in SHAPES.items():
            print(f"{name}: {t}")
        return
    n, k = products(text_config(args.shape))[args.product]
    torch.manual_seed(0)
    x = torch.randn(args.rows, k, device="cuda").to(torch.bfloat16)
    words, s, b = quantize(torch.randn(n, k, device="cuda"), args.bits, args.group)
    s, b = s.to(torch.bfloat16), b.to(torch.bfloat16)
    plan = linear.LinearPlan.for_weight(n, k, args.group)

    once = single_rounding(s, b, args.bits)

    def run(t):
        return linear.affine_matmul(
            x, words, s, b, args.bits, args.group, plan, tiles=t, single_rounding=once
        )

    names = args.shapes.split(",")
    ref = run(None)
    for name in names:  # warm-up: compile every shape, check its bytes
        same = torch.equal(run(SHAPES[name]), ref)
        print(f"warm {name}: {'equal' if same else 'DIFFERS'}", flush=True)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("probe")  # a profiler's filter: --nvtx --nvtx-include probe/
    for i, name in enumerate(names):
        print(f"launch {i}: {name} {SHAPES[name]} ({args.product} {n}x{k}, {args.rows} rows)")
        run(SHAPES[name])
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()
